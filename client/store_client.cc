#include "client/store_client.h"

#include <cstring>
#include <zmq.hpp>

#include "client/request.h"
#include "common/net.h"
#include "schema/envelope.h"

namespace strata::client {
namespace {

class StoreClientImpl final : public StoreClient {
 public:
  StoreClientImpl(std::string address, int timeout_ms) : address_(std::move(address)), timeout_ms_(timeout_ms) {}

  Status Connect(const std::optional<curve::ClientKeys>& keys) {
    const std::string endpoint = curve::SplitAddressKey(address_).first;
    STRATA_ASSIGN_OR_RETURN(socket_,
                            ConnectDealer(context_, address_, keys,
                                          "the store server " + endpoint + " uses CURVE: this worker needs --keys DIR",
                                          "the store server " + endpoint));
    return Status::Ok();
  }

  Result<storage::Tensor> ReadCheckpointPiece(const std::string& key_run, int64_t step,
                                              const std::string& name) override {
    storage::Tensor tensor;
    STRATA_RETURN_IF_ERROR(Read(key_run, step, name, [&](auto data, zmq::message_t& bytes) -> Status {
      tensor.dtype = static_cast<storage::DType>(static_cast<uint8_t>(data.getDtype()));
      for (int64_t d : data.getShape()) tensor.shape.push_back(d);
      tensor.checksum = data.getChecksum();
      const auto* begin = static_cast<const uint8_t*>(bytes.data());
      tensor.bytes.assign(begin, begin + bytes.size());
      return Status::Ok();
    }));
    return tensor;
  }

  Status ReadCheckpointPieceInto(const std::string& key_run, int64_t step, const std::string& name,
                                 std::span<uint8_t> out) override {
    return Read(key_run, step, name, [&](auto, zmq::message_t& bytes) -> Status {
      if (bytes.size() != out.size()) {
        return InvalidArgument("piece '" + name + "' is " + std::to_string(bytes.size()) + " bytes, expected " +
                               std::to_string(out.size()));
      }
      std::memcpy(out.data(), bytes.data(), bytes.size());
      return Status::Ok();
    });
  }

  const std::string& address() const override { return address_; }

 private:
  template <typename Take>
  Status Read(const std::string& key_run, int64_t step, const std::string& name, Take take) {
    const uint64_t request_id = next_request_id_++;
    schema::EnvelopeBuilder req(request_id);
    auto r = req.root().initReadCheckpointPiece();
    r.setKeyRun(key_run);
    r.setStep(step);
    r.setName(name);
    const std::string bytes = req.Serialize();
    socket_.send(net::Buffer(bytes), zmq::send_flags::none);
    STRATA_ASSIGN_OR_RETURN(Reply reply,
                            AwaitReply(socket_, request_id, timeout_ms_, "store server " + address_ + ": ", [&] {
                              return "the store server " + address_ + " did not answer a read of '" + name +
                                     "' within " + std::to_string(timeout_ms_) + " ms";
                            }));
    auto root = reply.envelope->root();
    if (root.which() != Envelope::CHECKPOINT_PIECE_DATA || reply.frames.size() != 2) {
      return Internal("the store server " + address_ + " answered a checkpoint read with something else");
    }
    auto data = root.getCheckpointPieceData();
    if (storage::Checksum(net::Bytes(reply.frames[1])) != data.getChecksum()) {
      return Corruption("piece '" + name + "' from " + address_ +
                        " fails its checksum; the transfer or its store is damaged");
    }
    return take(data, reply.frames[1]);
  }

  std::string address_;
  int timeout_ms_;
  zmq::context_t context_{1};
  zmq::socket_t socket_;
  uint64_t next_request_id_ = 1;
};

}  // namespace

Result<std::unique_ptr<StoreClient>> StoreClient::Connect(const std::string& serve_address,
                                                          const std::optional<curve::ClientKeys>& keys,
                                                          int timeout_ms) {
  auto client = std::make_unique<StoreClientImpl>(serve_address, timeout_ms);
  STRATA_RETURN_IF_ERROR(client->Connect(keys));
  return std::unique_ptr<StoreClient>(std::move(client));
}

}  // namespace strata::client
