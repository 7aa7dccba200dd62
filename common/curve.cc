#include "common/curve.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/log.h"
#include "common/net.h"

namespace strata::curve {
namespace {

namespace fs = std::filesystem;

constexpr size_t kZ85KeyLength = 40;
constexpr char kZapEndpoint[] = "inproc://zeromq.zap.01";

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

bool IsZ85Key(const std::string& key) {
  if (key.size() != kZ85KeyLength) return false;
  uint8_t binary[32];
  return zmq_z85_decode(binary, key.c_str()) != nullptr;
}

// Writes `text` to `path` with `mode`, replacing it only if `force`.
Status WriteFileWithMode(const std::string& path, const std::string& text, mode_t mode, bool force) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | (force ? O_TRUNC : O_EXCL), mode);
  if (fd < 0) {
    if (errno == EEXIST)
      return Status(StatusCode::kAlreadyExists, path + " already exists; pass --force to replace the keys");
    return IoError("cannot write " + path + ": " + std::strerror(errno));
  }
  // open() applies the umask and keeps the mode of a file it truncates: set it explicitly.
  const bool ok = fchmod(fd, mode) == 0 && write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  fsync(fd) == 0;
  const int err = errno;
  close(fd);
  if (!ok) return IoError("cannot write " + path + ": " + std::strerror(err));
  return Status::Ok();
}

Result<std::string> ReadKeyFile(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) {
    return NotFound("cannot read " + what + " " + path + (errno ? std::string(" (") + std::strerror(errno) + ")" : "") +
                    "; create a key directory with `strata keygen DIR` and pass it with --keys DIR");
  }
  std::string line, key;
  while (std::getline(in, line)) {
    line = Trim(line);
    if (line.empty() || line[0] == '#') continue;
    key = line;
    break;
  }
  if (!IsZ85Key(key)) {
    return InvalidArgument(path +
                           " does not hold a Z85 CURVE key (40 characters); regenerate it with "
                           "`strata keygen --force DIR`");
  }
  return key;
}

std::string PublicKeyOf(const std::string& secret_key) {
  char public_key[kZ85KeyLength + 1] = {0};
  if (zmq_curve_public(public_key, secret_key.c_str()) != 0) return "";
  return public_key;
}

std::string FrameText(const zmq::message_t& m) { return std::string(static_cast<const char*>(m.data()), m.size()); }

}  // namespace

bool RequiresCurve(const std::string& endpoint) { return endpoint.rfind("tcp://", 0) == 0; }

Result<KeyPair> GenerateKeyPair() {
  char public_key[kZ85KeyLength + 1] = {0};
  char secret_key[kZ85KeyLength + 1] = {0};
  if (zmq_curve_keypair(public_key, secret_key) != 0) {
    return Internal(std::string("cannot generate a CURVE key pair: ") + zmq_strerror(zmq_errno()) +
                    "; libzmq must be built with libsodium (CURVE support)");
  }
  return KeyPair{public_key, secret_key};
}

Status WriteKeyDirectory(const std::string& dir, bool force) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return IoError("cannot create " + dir + ": " + ec.message());
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, ec);
  if (ec) return IoError("cannot make " + dir + " private (0700): " + ec.message());
  const std::vector<std::string> files = {"coordinator.key", "coordinator.pub", "client.key", "client.pub",
                                          "authorized_keys"};
  if (!force) {
    // Check everything first: never leave a half-replaced directory behind.
    for (const auto& f : files) {
      if (fs::exists(dir + "/" + f)) {
        return Status(StatusCode::kAlreadyExists,
                      dir + "/" + f +
                          " already exists; keys in use would stop working. Pass --force to "
                          "replace them (then copy the new ones to every host)");
      }
    }
  }
  STRATA_ASSIGN_OR_RETURN(KeyPair coordinator, GenerateKeyPair());
  STRATA_ASSIGN_OR_RETURN(KeyPair client, GenerateKeyPair());
  const std::string header = "# Strata CURVE key (Z85). Made by `strata keygen`.\n";
  STRATA_RETURN_IF_ERROR(
      WriteFileWithMode(dir + "/coordinator.key", header + coordinator.secret_key + "\n", 0600, force));
  STRATA_RETURN_IF_ERROR(
      WriteFileWithMode(dir + "/coordinator.pub", header + coordinator.public_key + "\n", 0644, force));
  STRATA_RETURN_IF_ERROR(WriteFileWithMode(dir + "/client.key", header + client.secret_key + "\n", 0600, force));
  STRATA_RETURN_IF_ERROR(WriteFileWithMode(dir + "/client.pub", header + client.public_key + "\n", 0644, force));
  STRATA_RETURN_IF_ERROR(WriteFileWithMode(
      dir + "/authorized_keys",
      "# Public keys (Z85) allowed to connect to the coordinator and to workers' data plane, one a line.\n"
      "# client (made by `strata keygen`)\n" +
          client.public_key + "\n",
      0644, force));
  return Status::Ok();
}

Result<KeyPair> LoadKeyPair(const std::string& dir, const std::string& name) {
  const std::string secret_path = dir + "/" + name + ".key";
  struct stat st {};
  if (stat(secret_path.c_str(), &st) != 0) {
    return NotFound("no secret key " + secret_path + " (" + std::strerror(errno) +
                    "); create a key directory with `strata keygen DIR` and pass it with --keys DIR");
  }
  if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    return InvalidArgument("secret key " + secret_path + " is readable by other users; run `chmod 600 " + secret_path +
                           "` (anyone who reads it can impersonate this " + name + ")");
  }
  KeyPair pair;
  STRATA_ASSIGN_OR_RETURN(pair.secret_key, ReadKeyFile(secret_path, "secret key"));
  STRATA_ASSIGN_OR_RETURN(pair.public_key, ReadKeyFile(dir + "/" + name + ".pub", "public key"));
  if (PublicKeyOf(pair.secret_key) != pair.public_key) {
    return InvalidArgument(dir + "/" + name + ".pub does not match " + secret_path +
                           "; copy both files from the same `strata keygen` run");
  }
  return pair;
}

Result<std::set<std::string>> LoadAuthorizedKeys(const std::string& dir) {
  const std::string path = dir + "/authorized_keys";
  std::ifstream in(path);
  if (!in) {
    return NotFound("cannot read " + path + "; `strata keygen DIR` creates it (one Z85 public key a line)");
  }
  std::set<std::string> keys;
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    line = Trim(line);
    if (line.empty() || line[0] == '#') continue;
    if (!IsZ85Key(line)) {
      return InvalidArgument(path + ":" + std::to_string(line_no) +
                             " is not a Z85 public key (40 characters); fix or remove that line");
    }
    keys.insert(line);
  }
  if (keys.empty()) return InvalidArgument(path + " lists no public key: nobody could connect; add client.pub to it");
  return keys;
}

Result<ServerKeys> LoadServerKeys(const std::string& dir) {
  ServerKeys keys;
  STRATA_ASSIGN_OR_RETURN(keys.own, LoadKeyPair(dir, "coordinator"));
  STRATA_ASSIGN_OR_RETURN(keys.authorized, LoadAuthorizedKeys(dir));
  return keys;
}

Result<ClientKeys> LoadClientKeys(const std::string& dir, const std::string& pair_name, bool with_authorized) {
  ClientKeys keys;
  STRATA_ASSIGN_OR_RETURN(keys.own, LoadKeyPair(dir, pair_name));
  STRATA_ASSIGN_OR_RETURN(keys.coordinator_public_key, ReadKeyFile(dir + "/coordinator.pub", "coordinator public key"));
  if (with_authorized) {
    STRATA_ASSIGN_OR_RETURN(keys.authorized, LoadAuthorizedKeys(dir));
  }
  return keys;
}

void ConfigureServer(zmq::socket_t& socket, const KeyPair& own) {
  socket.set(zmq::sockopt::curve_server, 1);
  socket.set(zmq::sockopt::curve_secretkey, own.secret_key);
  // A domain makes libzmq consult the ZAP handler (for CURVE it would anyway; be explicit).
  socket.set(zmq::sockopt::zap_domain, "strata");
}

void ConfigureClient(zmq::socket_t& socket, const KeyPair& own, const std::string& server_public_key) {
  socket.set(zmq::sockopt::curve_serverkey, server_public_key);
  socket.set(zmq::sockopt::curve_publickey, own.public_key);
  socket.set(zmq::sockopt::curve_secretkey, own.secret_key);
}

// ---------------------------------------------------------------- ZAP

ZapHandler::ZapHandler(zmq::context_t& context, std::set<std::string> authorized, std::string what,
                       int64_t log_interval_ms)
    : socket_(context, zmq::socket_type::rep),
      authorized_(std::move(authorized)),
      what_(std::move(what)),
      log_interval_ms_(log_interval_ms) {}

ZapHandler::~ZapHandler() {
  if (unlogged_ > 0) LogUnlogged();
}

Result<std::unique_ptr<ZapHandler>> ZapHandler::Bind(zmq::context_t& context, std::set<std::string> authorized,
                                                     std::string what, int64_t log_interval_ms) {
  std::unique_ptr<ZapHandler> zap(new ZapHandler(context, std::move(authorized), std::move(what), log_interval_ms));
  zap->socket_.set(zmq::sockopt::linger, 0);
  try {
    zap->socket_.bind(kZapEndpoint);
  } catch (const zmq::error_t& e) {
    // Without a handler libzmq would admit every client that knows the server's public key.
    return Internal(std::string("cannot bind the ZAP handler (") + kZapEndpoint + "): " + e.what() +
                    "; another handler already serves this context");
  }
  return zap;
}

void ZapHandler::ServePending() {
  std::vector<zmq::message_t> request;
  while (net::RecvMultipart(socket_, &request, 0)) {
    // RFC 27 request: version, request id, domain, address, routing id, mechanism, credentials.
    if (request.size() < 6) continue;  // cannot even reply; libzmq never sends this
    const std::string version = FrameText(request[0]);
    const std::string mechanism = FrameText(request[5]);
    const std::string address = FrameText(request[3]);
    std::string status = "400", text = "not authorized", user;
    std::string key = "(none)";
    if (mechanism == "CURVE" && request.size() >= 7 && request[6].size() == 32) {
      char z85[kZ85KeyLength + 1] = {0};
      zmq_z85_encode(z85, static_cast<const uint8_t*>(request[6].data()), 32);
      key = z85;
      if (authorized_.count(key)) {
        status = "200";
        text = "OK";
        user = key;
      }
    }
    if (status != "200") {
      ++refused_;
      const int64_t now = net::SteadyMs();
      if (last_log_ms_ == 0 || now - last_log_ms_ >= log_interval_ms_) {
        std::string more;
        if (unlogged_ > 0) {
          more = " (" + std::to_string(unlogged_) + " more refused since the previous such line, " +
                 std::to_string(std::max<int64_t>(1, (now - last_log_ms_ + 999) / 1000)) + " s ago)";
        }
        STRATA_LOG(kWarn) << what_ << ": refused a " << mechanism << " connection from " << address << ": public key "
                          << key << " is not in authorized_keys" << more;
        last_log_ms_ = now;
        unlogged_ = 0;
      } else {
        ++unlogged_;
        last_unlogged_ = "from " + address + " (" + mechanism + ", key " + key + ")";
      }
    }
    try {
      socket_.send(net::Buffer(version), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(request[1].data(), request[1].size()), zmq::send_flags::sndmore);
      socket_.send(net::Buffer(status), zmq::send_flags::sndmore);
      socket_.send(net::Buffer(text), zmq::send_flags::sndmore);
      socket_.send(net::Buffer(user), zmq::send_flags::sndmore);
      socket_.send(zmq::str_buffer(""), zmq::send_flags::none);  // metadata
    } catch (const zmq::error_t& e) {
      STRATA_LOG(kError) << what_ << ": cannot answer a ZAP request: " << e.what();
    }
  }
}

void ZapHandler::FlushRefusedLog() {
  if (unlogged_ > 0 && net::SteadyMs() - last_log_ms_ >= log_interval_ms_) LogUnlogged();
}

void ZapHandler::LogUnlogged() {
  const int64_t now = net::SteadyMs();
  STRATA_LOG(kWarn) << what_ << ": " << unlogged_ << " more connection(s) refused in the last "
                    << std::max<int64_t>(1, (now - last_log_ms_ + 999) / 1000)
                    << " s: public keys not in authorized_keys (the latest " << last_unlogged_ << ")";
  last_log_ms_ = now;
  unlogged_ = 0;
}

bool PollWithZap(zmq::socket_t& socket, ZapHandler* zap, int timeout_ms) {
  const int64_t deadline = net::SteadyMs() + timeout_ms;
  while (true) {
    zmq::pollitem_t items[] = {{socket.handle(), 0, ZMQ_POLLIN, 0}, {zap ? zap->socket().handle() : nullptr, 0, 0, 0}};
    if (zap) items[1].events = ZMQ_POLLIN;
    const int64_t left = std::max<int64_t>(0, deadline - net::SteadyMs());
    // zmq_poll fails with EINTR when a signal (SIGTERM: stop) arrives: a timeout, not a fault.
    if (zmq_poll(items, zap ? 2 : 1, static_cast<long>(left)) < 0) {
      if (zmq_errno() == EINTR) return false;
      throw zmq::error_t();
    }
    if (items[1].revents & ZMQ_POLLIN) zap->ServePending();
    if (zap) zap->FlushRefusedLog();
    if (items[0].revents & ZMQ_POLLIN) return true;
    if (net::SteadyMs() >= deadline) return false;
  }
}

namespace {
constexpr char kKeyMarker[] = "#curve=";
}  // namespace

std::string AddressWithKey(const std::string& address, const std::string& public_key) {
  return address + kKeyMarker + public_key;
}

std::pair<std::string, std::string> SplitAddressKey(const std::string& address) {
  const size_t at = address.find(kKeyMarker);  // the endpoint part never contains '#'
  if (at == std::string::npos) return {address, ""};
  return {address.substr(0, at), address.substr(at + sizeof(kKeyMarker) - 1)};
}

}  // namespace strata::curve
