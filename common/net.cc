#include "common/net.h"

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
  if (zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms)) <= 0) return false;
  while (true) {
    zmq::message_t frame;
    if (!socket.recv(frame, zmq::recv_flags::dontwait)) return !frames->empty();
    const bool more = frame.more();
    frames->push_back(std::move(frame));
    if (!more) return true;
  }
}

bool IsLocalAddress(const std::string& endpoint) {
  return endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0 ||
         endpoint.rfind("tcp://127.", 0) == 0 || endpoint.rfind("tcp://localhost:", 0) == 0;
}

}  // namespace strata::net
