// CURVE authentication for Strata's sockets (libzmq CURVE: Curve25519 keys, encrypted and
// authenticated sessions with per-connection short-term keys, so a recorded stream cannot be
// replayed). Every socket on a network (tcp://) address must use it: the control plane executes
// whatever commands reach it, so "who may connect" is the whole security story (see
// docs/security.md).
//
// A key directory (made by `strata keygen DIR`) holds Z85 text keys, 40 characters each:
//   coordinator.key / coordinator.pub   the coordinator's pair (the .key only on its host)
//   client.key / client.pub             the CLI's and workers' pair (unless a worker has its own
//                                       worker.key / worker.pub)
//   authorized_keys                     public keys allowed to connect, one a line, # comments
// Secret key files must be mode 0600 (like ssh, we refuse to use one others may read).
#pragma once

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <zmq.hpp>

#include "common/status.h"

namespace strata::curve {

struct KeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters
};

// What a CURVE server (coordinator, a worker's data-plane inbound socket) needs.
struct ServerKeys {
  KeyPair own;
  std::set<std::string> authorized;  // Z85 public keys from authorized_keys
};

// What a CURVE client (CLI, worker) needs: its pair and the coordinator's public key. A worker
// also serves its data plane with `own` and accepts `authorized` peers.
struct ClientKeys {
  KeyPair own;
  std::string coordinator_public_key;
  std::set<std::string> authorized;  // empty unless loaded with authorized_keys
};

// True for endpoints on a network: those must use CURVE. ipc:// is guarded by file permissions
// (`strata up` makes its state dir 0700) and inproc:// never leaves the process.
bool RequiresCurve(const std::string& endpoint);

Result<KeyPair> GenerateKeyPair();

// `strata keygen`: creates DIR (0700) with both pairs and authorized_keys listing client.pub.
// Refuses if any of the files exists, unless `force`.
Status WriteKeyDirectory(const std::string& dir, bool force);

// Loads DIR/<name>.key and DIR/<name>.pub and checks that they belong together.
Result<KeyPair> LoadKeyPair(const std::string& dir, const std::string& name);
// Loads DIR/authorized_keys. An empty list is an error: nobody could connect.
Result<std::set<std::string>> LoadAuthorizedKeys(const std::string& dir);

// The coordinator's keys: coordinator.key/.pub and authorized_keys.
Result<ServerKeys> LoadServerKeys(const std::string& dir);
// A client's keys: `pair_name`.key/.pub (worker: "worker" if DIR/worker.key exists, else
// "client"), coordinator.pub, and authorized_keys if `with_authorized` (workers).
Result<ClientKeys> LoadClientKeys(const std::string& dir, const std::string& pair_name = "client",
                                  bool with_authorized = false);

// A tcp address of a CURVE server carries the server's public key: "tcp://host:port#curve=Z85KEY"
// (a worker advertises its data-plane and store-server addresses so; the coordinator passes them
// on verbatim). Other addresses and servers without keys keep plain addresses.
std::string AddressWithKey(const std::string& address, const std::string& public_key);
// "tcp://h:p#curve=KEY" -> {"tcp://h:p", "KEY"}; a plain address -> {address, ""}.
std::pair<std::string, std::string> SplitAddressKey(const std::string& address);

// Socket options; call before bind/connect.
void ConfigureServer(zmq::socket_t& socket, const KeyPair& own);
void ConfigureClient(zmq::socket_t& socket, const KeyPair& own, const std::string& server_public_key);

// A ZAP handler (ZeroMQ RFC 27) for one context: libzmq asks it, over inproc://zeromq.zap.01,
// whether each CURVE client that completed the handshake may connect; it answers yes only for
// authorized keys and logs refusals with the offending key: the first at once, then at most one
// line per log_interval_ms that says how many more were refused since the previous line (anyone
// who can reach the port can make refusals; unthrottled, they could fill the disk with log).
// It has no thread of its own:
// the thread that owns the context's server sockets serves it, polling it alongside them (see
// PollWithZap), so handshakes progress exactly while that thread waits for messages.
// Not thread-safe. Must be bound before the server socket binds, and outlive it.
class ZapHandler {
 public:
  static constexpr int64_t kRefusedLogIntervalMs = 10000;
  static Result<std::unique_ptr<ZapHandler>> Bind(zmq::context_t& context, std::set<std::string> authorized,
                                                  std::string what, int64_t log_interval_ms = kRefusedLogIntervalMs);
  ~ZapHandler();  // logs refusals not logged yet
  // Answers every pending request without blocking.
  void ServePending();
  // Logs the refusals counted since the last line once log_interval_ms has passed (PollWithZap
  // calls it, so a burst is reported even if no refusal follows it).
  void FlushRefusedLog();
  zmq::socket_t& socket() { return socket_; }
  int refused() const { return refused_; }

 private:
  ZapHandler(zmq::context_t& context, std::set<std::string> authorized, std::string what, int64_t log_interval_ms);
  void LogUnlogged();
  zmq::socket_t socket_;
  std::set<std::string> authorized_;
  std::string what_;  // "coordinator", "worker-0 data plane": names the server in logs
  int refused_ = 0;
  const int64_t log_interval_ms_;
  int64_t last_log_ms_ = 0;    // steady clock: when the last refusal line was written (0: never)
  int unlogged_ = 0;           // refusals since that line
  std::string last_unlogged_;  // "from ADDRESS (key KEY)" of the latest of them
};

// Waits up to timeout_ms for `socket` to become readable, answering ZAP requests meanwhile
// (zap may be null). Returns true if `socket` is readable.
bool PollWithZap(zmq::socket_t& socket, ZapHandler* zap, int timeout_ms);

}  // namespace strata::curve
