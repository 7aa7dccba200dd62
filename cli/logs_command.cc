#include "cli/logs_command.h"

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "cli/command_set.h"
#include "cli/exit.h"
#include "client/coordinator_client.h"
#include "common/net.h"
#include "common/task_log.h"
#include "schema/envelope.h"
#include "spec/run_spec.h"
#include "tensorboard/event_file.h"

namespace strata::cli {
namespace {

using json = nlohmann::json;

constexpr auto kFollowPoll = std::chrono::milliseconds(500);

struct FilePiece {
  std::string data;
  uint64_t size = 0;
  bool terminal = false;
};

Result<FilePiece> ReadPiece(client::CoordinatorClient& client, const std::string& run, RunFileRequest::Kind kind,
                            uint32_t rank, uint64_t offset) {
  schema::EnvelopeBuilder req;
  auto r = req.root().initRunFileRequest();
  r.setRunId(run);
  r.setKind(kind);
  r.setRank(rank);
  r.setOffset(offset);
  STRATA_ASSIGN_OR_RETURN(auto reply, client.Call(req));
  if (reply->root().which() != Envelope::RUN_FILE_REPLY)
    return Internal("the coordinator answered a log read with another message");
  auto f = reply->root().getRunFileReply();
  FilePiece piece;
  piece.data.assign(reinterpret_cast<const char*>(f.getData().begin()), f.getData().size());
  piece.size = f.getSize();
  piece.terminal = f.getTerminal();
  return piece;
}

}  // namespace

Result<int64_t> ParseDurationMs(const std::string& text) {
  auto bad = [&] {
    return InvalidArgument("--since " + EscapeForTerminal(text) +
                           " is not a duration; write a number and a unit: 500ms, 30s, 10m, 2h or 1d");
  };
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0 || digits > 12) return bad();
  const int64_t n = std::stoll(text.substr(0, digits));
  const std::string unit = text.substr(digits);
  if (unit == "ms") return n;
  if (unit == "s") return n * 1000;
  if (unit == "m") return n * 60 * 1000;
  if (unit == "h") return n * 3600 * 1000;
  if (unit == "d") return n * 86400 * 1000;
  return bad();
}

int ShowLogs(const CoordinatorAddress& coordinator, const LogsRequest& request) {
  int64_t since_ms = 0;
  if (!request.since.empty()) {
    auto d = ParseDurationMs(request.since);
    if (!d.ok()) return Fail(d.status());
    since_ms = net::NowUnixMs() - *d;
  }
  client::CoordinatorClient client(coordinator.endpoint, coordinator.timeout_ms, coordinator.keys);
  uint64_t offset = 0;
  std::string pending;                // the end of the file read so far, short of its newline
  bool show = request.since.empty();  // a line without a timestamp goes with the line before it
  auto print_line = [&](const std::string& line) {
    int64_t at = 0;
    if (log::ParseTaskLogTime(line, &at)) show = at >= since_ms;
    if (show) std::printf("%s\n", EscapeForTerminal(line).c_str());
  };
  for (;;) {
    auto piece = ReadPiece(client, request.run, RunFileRequest::Kind::LOG, request.rank, offset);
    if (!piece.ok()) return Fail(piece.status());
    offset += piece->data.size();
    pending += piece->data;
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      print_line(pending.substr(start, nl - start));
    }
    pending.erase(0, start);
    std::fflush(stdout);
    if (offset < piece->size) continue;             // more is there already
    if (!request.follow || piece->terminal) break;  // the run has ended: the log will not grow
    std::this_thread::sleep_for(kFollowPoll);
  }
  if (!pending.empty()) print_line(pending);
  return kExitOk;
}

// `strata metrics RUN --tensorboard DIR`: the run's metrics as a fresh event file in DIR.
int WriteTensorBoard(const std::string& text, const std::string& dir) {
  auto writer = tensorboard::EventFileWriter::Open(
      dir,
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count(),
      tensorboard::EventFileWriter::Existing::kRefuse);
  if (!writer.ok()) return Fail(writer.status());
  size_t start = 0, steps = 0;
  auto number = [](const json& row, const char* key) {
    auto v = row.find(key);
    return v != row.end() && v->is_number() ? v->get<double>() : std::nan("");
  };
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    const json row = json::parse(text.substr(start, nl - start), nullptr, /*allow_exceptions=*/false);
    if (!row.is_object() || !row.contains("step")) continue;  // a line cut by a crash mid-write
    const Status s =
        writer->Append(row["step"].get<int64_t>(), number(row, "unix_ms") / 1000.0,
                       tensorboard::StepScalars(number(row, "loss"), number(row, "lr"), number(row, "grad_norm"),
                                                number(row, "tokens_per_second"), number(row, "memory_bytes")));
    if (!s.ok()) return Fail(s);
    ++steps;
  }
  std::printf("wrote %zu steps to %s (tensorboard --logdir %s)\n", steps, writer->path().c_str(), dir.c_str());
  return kExitOk;
}

int ShowMetrics(const CoordinatorAddress& coordinator, const std::string& run, bool csv, const std::string& board) {
  client::CoordinatorClient client(coordinator.endpoint, coordinator.timeout_ms, coordinator.keys);
  std::string text;
  for (;;) {
    auto piece = ReadPiece(client, run, RunFileRequest::Kind::METRICS, 0, text.size());
    if (!piece.ok()) return Fail(piece.status());
    text += piece->data;
    if (piece->data.empty() || text.size() >= piece->size) break;
  }
  if (!board.empty()) return WriteTensorBoard(text, board);
  if (!csv) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return kExitOk;
  }
  // CSV: a header, then one row per step; grad_norm only when some step has it.
  std::vector<json> rows;
  bool grad_norm = false;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    json row = json::parse(text.substr(start, nl - start), nullptr, /*allow_exceptions=*/false);
    if (!row.is_object()) continue;  // a line cut by a crash mid-write
    grad_norm = grad_norm || row.contains("grad_norm");
    rows.push_back(std::move(row));
  }
  std::vector<std::string> columns = {"step", "loss", "lr", "tokens_per_second"};
  if (grad_norm) columns.push_back("grad_norm");
  columns.push_back("memory_bytes");
  columns.push_back("unix_ms");
  std::string out;
  for (size_t i = 0; i < columns.size(); ++i) out += (i ? "," : "") + columns[i];
  out += '\n';
  for (const json& row : rows) {
    for (size_t i = 0; i < columns.size(); ++i) {
      if (i) out += ',';
      auto v = row.find(columns[i]);
      if (v == row.end() || v->is_null()) continue;
      out += v->dump();  // numbers: the shortest text that reads back equal
    }
    out += '\n';
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return kExitOk;
}

void RegisterLogsCommands(CommandSet& set) {
  GlobalOptions& g = set.global();
  auto logs = std::make_shared<LogsRequest>();
  auto* logs_cmd =
      set.Add("logs", "show one rank's log of a run (its task's log lines and one line per step)", [&g, logs]() -> int {
        if (!logs->since.empty()) {  // before resolving the cluster
          if (auto d = ParseDurationMs(logs->since); !d.ok()) return Fail(d.status());
        }
        auto coordinator = client::Coordinator(g);
        if (!coordinator.ok()) return Fail(coordinator.status());
        return ShowLogs(*coordinator, *logs);
      });
  logs_cmd->add_option("run", logs->run)->required();
  logs_cmd->add_option("--rank", logs->rank, "the rank (default 0)");
  logs_cmd->add_flag("--follow,-f", logs->follow, "keep printing new lines until the run ends");
  logs_cmd->add_option("--since", logs->since, "only lines from the last DURATION (500ms, 30s, 10m, 2h, 1d)");

  struct Metrics {
    std::string run;
    bool csv = false;
    std::string tensorboard;
  };
  auto metrics = std::make_shared<Metrics>();
  auto* metrics_cmd =
      set.Add("metrics", "a run's per-step metrics (loss, lr, tokens/s, memory), one JSON object a line",
              [&g, metrics]() -> int {
                auto coordinator = client::Coordinator(g);
                if (!coordinator.ok()) return Fail(coordinator.status());
                return ShowMetrics(*coordinator, metrics->run, metrics->csv, metrics->tensorboard);
              });
  metrics_cmd->add_option("run", metrics->run)->required();
  metrics_cmd->add_flag("--csv", metrics->csv, "CSV with a header instead of JSON lines");
  metrics_cmd
      ->add_option("--tensorboard", metrics->tensorboard,
                   "write a TensorBoard event file into DIR instead (an empty or new directory)")
      ->excludes("--csv");
}

}  // namespace strata::cli
