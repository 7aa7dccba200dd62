// The one request loop of Strata's clients (the coordinator client, the store client, the
// activation reader): a DEALER socket to a server, a request with an id, and the reply with that id
// (late answers to abandoned requests are skipped) within a deadline, an Error reply as its Status.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "common/curve.h"
#include "common/status.h"
#include "schema/envelope.h"

namespace strata::client {

// A DEALER connected to `address` as a server advertises it (a tcp:// one carries the server's
// CURVE key, and then `keys` is required: `no_keys` says what to do without them). `who` names the
// server in the error when the address is malformed.
Result<zmq::socket_t> ConnectDealer(zmq::context_t& context, const std::string& address,
                                    const std::optional<curve::ClientKeys>& keys, const std::string& no_keys,
                                    const std::string& who);

struct Reply {
  std::unique_ptr<schema::DecodedEnvelope> envelope;  // frames[0], decoded
  std::vector<zmq::message_t> frames;                 // [envelope, payload...]
};

// Waits up to timeout_ms for the reply to `request_id`. Silence is Unavailable(silence()); an
// Error reply is its status, its message after `error_prefix`.
Result<Reply> AwaitReply(zmq::socket_t& socket, uint64_t request_id, int timeout_ms, const std::string& error_prefix,
                         const std::function<std::string()>& silence);

}  // namespace strata::client
