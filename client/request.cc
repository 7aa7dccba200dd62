#include "client/request.h"

#include "common/net.h"

namespace strata::client {

Result<zmq::socket_t> ConnectDealer(zmq::context_t& context, const std::string& address,
                                    const std::optional<curve::ClientKeys>& keys, const std::string& no_keys,
                                    const std::string& who) {
  const auto [endpoint, server_key] = curve::SplitAddressKey(address);
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::rcvhwm, 0);
  if (!server_key.empty()) {
    if (!keys) return InvalidArgument(no_keys);
    curve::ConfigureClient(socket, keys->own, server_key);
  }
  try {
    socket.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return Unavailable("cannot reach " + who + ": " + e.what());
  }
  return socket;
}

Result<Reply> AwaitReply(zmq::socket_t& socket, uint64_t request_id, int timeout_ms, const std::string& error_prefix,
                         const std::function<std::string()>& silence) {
  Reply reply;
  const int64_t deadline = net::SteadyMs() + timeout_ms;
  while (true) {
    const int64_t left = deadline - net::SteadyMs();
    if (left <= 0 || !net::RecvMultipart(socket, &reply.frames, static_cast<int>(left))) return Unavailable(silence());
    if (reply.frames.empty()) continue;
    auto decoded = schema::DecodeEnvelope(net::Bytes(reply.frames[0]));
    if (!decoded.ok()) return decoded.status();
    auto root = (*decoded)->root();
    if (root.getRequestId() != request_id) continue;  // a late answer to an abandoned request
    if (root.which() == Envelope::ERROR) {
      const Status error = schema::StatusFromError(root.getError());
      return Status(error.code(), error_prefix + error.message());
    }
    reply.envelope = std::move(decoded).value();
    return reply;
  }
}

}  // namespace strata::client
