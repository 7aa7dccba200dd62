// Finding and calling the coordinator for a Target, and the requests about runs (cluster_api.h,
// cluster_calls.h). The JSON forms are in run_json.cc, submitting in submit.cc.
#include "client/cluster_api.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <vector>

#include "client/cluster_calls.h"
#include "client/cluster_file.h"
#include "common/curve.h"
#include "spec/run_spec.h"

namespace strata::client {

namespace fs = std::filesystem;

namespace {

// A ZeroMQ endpoint the client can connect to: tcp://HOST:PORT, ipc://PATH or inproc://NAME.
// Checked here because zmq's connect throws on anything else (an uncaught throw: exit 134).
Status ValidateEndpoint(const std::string& endpoint, const std::string& source) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument(source + " " + EscapeForTerminal(endpoint) + " is not a coordinator address (" + why +
                           "); use tcp://HOST:PORT, ipc://PATH or inproc://NAME");
  };
  const size_t scheme_end = endpoint.find("://");
  if (scheme_end == std::string::npos) return bad("no scheme");
  const std::string scheme = endpoint.substr(0, scheme_end), rest = endpoint.substr(scheme_end + 3);
  if (scheme != "tcp" && scheme != "ipc" && scheme != "inproc")
    return bad("unknown scheme " + EscapeForTerminal(scheme) + "://");
  if (rest.empty()) return bad("nothing after " + scheme + "://");
  if (endpoint.find('\0') != std::string::npos) return bad("a NUL byte");
  if (scheme == "tcp") {
    const size_t colon = rest.rfind(':');
    const std::string port = colon == std::string::npos ? "" : rest.substr(colon + 1);
    if (colon == 0 || port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(port) > 65535) {
      return bad("tcp:// needs HOST:PORT");
    }
  }
  return Status::Ok();
}

Result<std::string> EndpointInClusterFile(const std::string& state_dir) {
  STRATA_ASSIGN_OR_RETURN(auto file, ReadClusterFile(state_dir));
  STRATA_RETURN_IF_ERROR(ValidateEndpoint(file.endpoint, "the endpoint in " + ClusterFilePath(state_dir)));
  return file.endpoint;
}

}  // namespace

std::string StateDir(const Target& target) { return target.state_dir.empty() ? DefaultStateDir() : target.state_dir; }

Result<std::string> ResolveEndpoint(const Target& target) {
  if (!target.cluster.empty()) {
    STRATA_RETURN_IF_ERROR(ValidateEndpoint(target.cluster, "--cluster"));
    return target.cluster;
  }
  // A state directory named by a program is the cluster it means.
  if (!target.environment_first && !target.state_dir.empty()) return EndpointInClusterFile(target.state_dir);
  if (const char* env = std::getenv("STRATA_CLUSTER"); env && *env) {
    STRATA_RETURN_IF_ERROR(ValidateEndpoint(env, "STRATA_CLUSTER"));
    return std::string(env);
  }
  return EndpointInClusterFile(StateDir(target));
}

std::string ResolveKeysDir(const Target& target) {
  if (!target.keys_dir.empty()) return target.keys_dir;
  if (const char* env = std::getenv("STRATA_KEYS"); env && *env) return env;
  const std::string state_dir = StateDir(target);
  if (fs::exists(state_dir + "/keys/client.key")) return state_dir + "/keys";
  return "";
}

Result<std::unique_ptr<CoordinatorClient>> MakeClient(const Target& target, const std::string& endpoint,
                                                      int timeout_ms) {
  std::optional<curve::ClientKeys> keys;
  if (const std::string dir = ResolveKeysDir(target); !dir.empty()) {
    STRATA_ASSIGN_OR_RETURN(keys, curve::LoadClientKeys(dir));
  }
  return std::make_unique<CoordinatorClient>(endpoint, timeout_ms, std::move(keys));
}

Result<CoordinatorAddress> Coordinator(const Target& target) {
  CoordinatorAddress address;
  STRATA_ASSIGN_OR_RETURN(address.endpoint, ResolveEndpoint(target));
  if (const std::string dir = ResolveKeysDir(target); !dir.empty()) {
    STRATA_ASSIGN_OR_RETURN(address.keys, curve::LoadClientKeys(dir));
  }
  address.timeout_ms = std::max(target.timeout_ms, 10000);  // reads of big chunks take longer than a status call
  return address;
}

Result<std::unique_ptr<schema::DecodedEnvelope>> Call(const Target& target, schema::EnvelopeBuilder& request) {
  STRATA_ASSIGN_OR_RETURN(std::string endpoint, ResolveEndpoint(target));
  STRATA_ASSIGN_OR_RETURN(auto client, MakeClient(target, endpoint, target.timeout_ms));
  return client->Call(request);
}

Result<int> CountLiveWorkers(const Target& target, const std::string& endpoint) {
  STRATA_ASSIGN_OR_RETURN(auto client, MakeClient(target, endpoint, 1000));
  schema::EnvelopeBuilder req;
  req.root().setWorkersRequest();
  STRATA_ASSIGN_OR_RETURN(auto reply, client->Call(req));
  int live = 0;
  for (auto w : reply->root().getWorkersReply().getWorkers()) live += w.getState() != WorkerState::LOST;
  return live;
}

Result<std::unique_ptr<schema::DecodedEnvelope>> FetchStatus(const Target& target, const std::string& run,
                                                             bool last_loss_only) {
  schema::EnvelopeBuilder req;
  auto status = req.root().initStatusRequest();
  status.setRunId(run);
  status.setLastLossOnly(last_loss_only);
  return Call(target, req);
}

Result<std::unique_ptr<schema::DecodedEnvelope>> FetchEvents(const Target& target, const std::string& run) {
  schema::EnvelopeBuilder req;
  req.root().initEventsRequest().setRunId(run);
  return Call(target, req);
}

Result<std::unique_ptr<schema::DecodedEnvelope>> FetchCheckpoints(const Target& target, const std::string& run) {
  schema::EnvelopeBuilder req;
  req.root().initCheckpointsRequest().setRunId(run);
  return Call(target, req);
}

// What a user may type for RUN: a run id, a unique prefix of one, a run name (names repeat
// across submits: the newest run of that name), or `latest` (the newest run of all). Resolved
// from one status listing, in that order; text that matches nothing is passed on unchanged so the
// coordinator's own "no such run" answers. An id prefix that matches several runs is refused
// (InvalidArgument: exit 2 in the CLI) listing them: guessing there could cancel or export the
// wrong run. A name of several runs takes the newest, saying so on stderr.
Result<std::string> ResolveRun(const Target& target, const std::string& text) {
  if (text.empty()) return text;
  STRATA_ASSIGN_OR_RETURN(auto reply, FetchStatus(target, "", /*last_loss_only=*/true));
  auto runs = reply->root().getStatusReply().getRuns();
  struct Candidate {
    std::string id;
    int64_t created;
  };
  std::vector<Candidate> named, prefixed;
  std::optional<Candidate> newest;
  for (auto r : runs) {
    Candidate c{r.getRunId().cStr(), r.getCreatedUnixMs()};
    if (c.id == text) return c.id;
    if (!newest || c.created > newest->created) newest = c;
    if (std::string(r.getName().cStr()) == text) named.push_back(c);
    if (c.id.rfind(text, 0) == 0) prefixed.push_back(c);
  }
  auto by_newest = [](const Candidate& a, const Candidate& b) { return a.created > b.created; };
  if (text == "latest") {
    if (!newest)
      return NotFound("`latest` names the newest run, and there are no runs yet; `strata submit SPEC` starts one");
    return newest->id;
  }
  if (!named.empty()) {
    std::sort(named.begin(), named.end(), by_newest);
    if (named.size() > 1) {
      std::cerr << "strata: " << EscapeForTerminal(text) << " names " << named.size() << " runs; using the newest, "
                << EscapeForTerminal(named[0].id) << " (give a run id for another; `strata status` lists them)"
                << std::endl;
    }
    return named[0].id;
  }
  if (prefixed.size() == 1) return prefixed[0].id;
  if (prefixed.size() > 1) {
    std::sort(prefixed.begin(), prefixed.end(), by_newest);
    std::string list;
    for (const auto& c : prefixed) list += "\n  " + EscapeForTerminal(c.id);
    return InvalidArgument("run " + EscapeForTerminal(text) + " is ambiguous: it begins " +
                           std::to_string(prefixed.size()) + " run ids; give more of the id (newest first):" + list);
  }
  return text;
}

Status Cancel(const Target& target, const std::string& run) {
  schema::EnvelopeBuilder req;
  req.root().initCancelRun().setRunId(run);
  STRATA_ASSIGN_OR_RETURN(auto reply, Call(target, req));
  (void)reply;
  return Status::Ok();
}

}  // namespace strata::client
