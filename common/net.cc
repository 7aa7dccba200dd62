#include "common/net.h"

#include <cerrno>
#include <chrono>

namespace strata::net {

int64_t NowUnixMs() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

int64_t SteadyMs() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
}

bool RecvMultipart(zmq::socket_t& socket, std::vector<zmq::message_t>* frames, int timeout_ms) {
  frames->clear();
  zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
  try {
    if (zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms)) <= 0) return false;
  } catch (const zmq::error_t& e) {
    // A signal handler ran (SIGTERM from `systemctl stop` or `kill`): nothing arrived; the
    // caller's loop turns and sees its stop flag instead of the daemon dying on an exception.
    if (e.num() == EINTR) return false;
    throw;
  }
  return TryRecvMultipart(socket, frames);
}

bool TryRecvMultipart(zmq::socket_t& socket, std::vector<zmq::message_t>* frames) {
  frames->clear();
  while (true) {
    zmq::message_t frame;
    if (!socket.recv(frame, zmq::recv_flags::dontwait)) return !frames->empty();
    const bool more = frame.more();
    frames->push_back(std::move(frame));
    if (!more) return true;
  }
}

}  // namespace strata::net
