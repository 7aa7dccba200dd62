#include "client/coordinator_client.h"

#include <random>

#include "client/request.h"
#include "common/net.h"

namespace strata::client {

CoordinatorClient::CoordinatorClient(std::string endpoint, int timeout_ms, std::optional<curve::ClientKeys> keys)
    : endpoint_(std::move(endpoint)), timeout_ms_(timeout_ms), socket_(context_, zmq::socket_type::dealer) {
  socket_.set(zmq::sockopt::linger, 0);
  if (keys) {
    curve::ConfigureClient(socket_, keys->own, keys->coordinator_public_key);
    curve_ = true;
  }
  next_request_id_ = std::random_device{}() | 1;
  socket_.connect(endpoint_);
}

Result<std::unique_ptr<schema::DecodedEnvelope>> CoordinatorClient::Call(schema::EnvelopeBuilder& request) {
  const uint64_t id = next_request_id_++;
  request.root().setRequestId(id);
  const std::string bytes = request.Serialize();
  // A DEALER's send blocks (or fails with dontwait) while no connection is up.
  if (!socket_.send(net::Buffer(bytes), zmq::send_flags::dontwait)) {
    // Wait briefly for the connection, then try once more.
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLOUT, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms_));
    if (!socket_.send(net::Buffer(bytes), zmq::send_flags::dontwait)) {
      return Unavailable("no coordinator is reachable at " + endpoint_ +
                         "; start a cluster with `strata up` or point --cluster / STRATA_CLUSTER at a running one");
    }
  }
  STRATA_ASSIGN_OR_RETURN(Reply reply, AwaitReply(socket_, id, timeout_ms_, "", [&] {
                            return "the coordinator at " + endpoint_ + " did not answer within " +
                                   std::to_string(timeout_ms_ / 1000.0).substr(0, 3) +
                                   " s; check it runs (`strata up` starts one) and see its log under the state dir" +
                                   AuthHint();
                          }));
  return std::move(reply.envelope);
}

// A refused CURVE handshake looks like silence to a DEALER: say what to check.
std::string CoordinatorClient::AuthHint() const {
  if (!curve_ && curve::RequiresCurve(endpoint_)) {
    return ". A tcp:// coordinator only answers clients with keys: pass --keys DIR or set STRATA_KEYS "
           "(a directory made by `strata keygen`)";
  }
  if (curve_) {
    return ". If its log says it refused this client's public key, add this client's .pub to its "
           "authorized_keys; check coordinator.pub matches the coordinator's key";
  }
  return "";
}

}  // namespace strata::client
