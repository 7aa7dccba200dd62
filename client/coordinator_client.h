// A client of the coordinator (the CLI, tests): one request, one reply, with a deadline so an
// unreachable coordinator is a clear error within seconds, never a hang.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <zmq.hpp>

#include "common/curve.h"
#include "common/status.h"
#include "schema/envelope.h"

namespace strata::client {

class CoordinatorClient {
 public:
  // With `keys` the socket is a CURVE client (required by a coordinator started with --keys):
  // it proves keys.own and checks that the server holds keys.coordinator_public_key's secret.
  CoordinatorClient(std::string endpoint, int timeout_ms = 3000, std::optional<curve::ClientKeys> keys = std::nullopt);

  // Sends `request` (its requestId is set here) and waits for the matching reply. An Error reply
  // comes back as a Status carrying the coordinator's code and message.
  Result<std::unique_ptr<schema::DecodedEnvelope>> Call(schema::EnvelopeBuilder& request);

  const std::string& endpoint() const { return endpoint_; }

 private:
  std::string AuthHint() const;

  std::string endpoint_;
  int timeout_ms_;
  bool curve_ = false;
  uint64_t next_request_id_ = 1;
  zmq::context_t context_{1};
  zmq::socket_t socket_;
};

}  // namespace strata::client
