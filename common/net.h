// Small ZeroMQ and clock helpers shared by every process.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>
#include <zmq.hpp>

namespace strata::net {

// Milliseconds since the Unix epoch (for records) and on a monotonic clock (for timeouts).
int64_t NowUnixMs();
int64_t SteadyMs();

inline std::span<const uint8_t> Bytes(const zmq::message_t& m) {
  return {static_cast<const uint8_t*>(m.data()), m.size()};
}
inline zmq::const_buffer Buffer(const std::string& s) { return zmq::buffer(s.data(), s.size()); }

// Receives every frame of one message. Returns false if nothing arrived within timeout_ms.
bool RecvMultipart(zmq::socket_t& socket, std::vector<zmq::message_t>* frames, int timeout_ms);
// The next message already queued on `socket`, without a poll (a poll is a system call: a loop
// draining 20,000 messages a second spent more in it than in the messages); false when none is.
bool TryRecvMultipart(zmq::socket_t& socket, std::vector<zmq::message_t>* frames);

}  // namespace strata::net
