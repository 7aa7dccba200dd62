#include "worker/store_server.h"

#include <atomic>
#include <thread>
#include <zmq.hpp>

#include "common/log.h"
#include "common/net.h"
#include "schema/envelope.h"

namespace strata::worker {
namespace {

class StoreServerImpl final : public StoreServer {
 public:
  StoreServerImpl(storage::ShardStore* store) : store_(store), socket_(context_, zmq::socket_type::router) {}

  ~StoreServerImpl() override {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

  Status Bind(const std::string& address, const std::optional<curve::ClientKeys>& keys) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.set(zmq::sockopt::sndhwm, 0);
    advertised_ = address;
    if (curve::RequiresCurve(address)) {
      if (!keys) {
        return InvalidArgument("--serve-address " + address + " is tcp:// and needs CURVE keys: pass --keys DIR");
      }
      STRATA_ASSIGN_OR_RETURN(zap_, curve::ZapHandler::Bind(context_, keys->authorized, "store server"));
      curve::ConfigureServer(socket_, keys->own);
      advertised_ = curve::AddressWithKey(address, keys->own.public_key);
    }
    try {
      socket_.bind(address);
    } catch (const zmq::error_t& e) {
      return Unavailable("cannot bind the store server at " + address + ": " + e.what() +
                         "; is another worker using it? choose another --serve-address");
    }
    thread_ = std::thread([this] { Loop(); });
    return Status::Ok();
  }

  const std::string& advertised_address() const override { return advertised_; }

 private:
  void Loop() {
    std::vector<zmq::message_t> frames;
    while (!stop_.load()) {
      if (!curve::PollWithZap(socket_, zap_.get(), 100) || !net::RecvMultipart(socket_, &frames, 0)) continue;
      if (frames.size() != 2) continue;  // identity + one envelope; anything else is not ours
      const std::string identity(static_cast<const char*>(frames[0].data()), frames[0].size());
      try {
        Serve(identity, frames[1]);
      } catch (const std::exception& e) {
        STRATA_LOG(kWarn) << "store server: bad request: " << e.what();
        Reply(identity, schema::MakeErrorReply(0, InvalidArgument(std::string("bad request: ") + e.what())));
      }
    }
  }

  void Serve(const std::string& identity, const zmq::message_t& frame) {
    auto decoded = schema::DecodeEnvelope(net::Bytes(frame));
    if (!decoded.ok()) {
      Reply(identity, schema::MakeErrorReply(0, decoded.status()));
      return;
    }
    auto root = (*decoded)->root();
    Result<storage::Tensor> tensor =
        InvalidArgument("the store server answers readActivation and readCheckpointPiece only");
    if (root.which() == Envelope::READ_ACTIVATION) {
      auto req = root.getReadActivation();
      tensor = store_->ReadActivation(req.getRunId().cStr(), req.getLayer(), req.getSite().cStr(), req.getRowBegin());
    } else if (root.which() == Envelope::READ_CHECKPOINT_PIECE) {
      auto req = root.getReadCheckpointPiece();
      tensor = store_->ReadCheckpointTensor(req.getKeyRun().cStr(), req.getStep(), req.getName().cStr());
    }
    if (!tensor.ok()) {
      Reply(identity, schema::MakeErrorReply(root.getRequestId(), tensor.status()));
      return;
    }
    schema::EnvelopeBuilder reply(root.getRequestId());
    auto data = root.which() == Envelope::READ_ACTIVATION ? reply.root().initActivationData()
                                                          : reply.root().initCheckpointPieceData();
    data.setDtype(static_cast<::DType>(static_cast<uint8_t>(tensor->dtype)));
    auto shape = data.initShape(tensor->shape.size());
    for (size_t i = 0; i < tensor->shape.size(); ++i) shape.set(i, tensor->shape[i]);
    data.setChecksum(tensor->checksum);
    const std::string header = reply.Serialize();
    // The bytes frame takes the tensor's buffer without a copy; ZeroMQ frees it once sent.
    auto* owned = new std::vector<uint8_t>(std::move(tensor->bytes));
    zmq::message_t bytes(
        owned->data(), owned->size(), [](void*, void* hint) { delete static_cast<std::vector<uint8_t>*>(hint); },
        owned);
    try {
      socket_.send(net::Buffer(identity), zmq::send_flags::sndmore);
      socket_.send(net::Buffer(header), zmq::send_flags::sndmore);
      socket_.send(bytes, zmq::send_flags::none);
    } catch (const zmq::error_t& e) {
      STRATA_LOG(kDebug) << "store server: client gone: " << e.what();
    }
  }

  void Reply(const std::string& identity, const std::string& bytes) {
    try {
      socket_.send(net::Buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      socket_.send(net::Buffer(bytes), zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      STRATA_LOG(kDebug) << "store server: client gone: " << e.what();
    }
  }

  storage::ShardStore* store_;
  zmq::context_t context_{1};
  std::unique_ptr<curve::ZapHandler> zap_;  // declared before socket_: outlives it
  zmq::socket_t socket_;
  std::string advertised_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

Result<std::unique_ptr<StoreServer>> StoreServer::Start(const std::string& address, storage::ShardStore* store,
                                                        const std::optional<curve::ClientKeys>& keys) {
  auto server = std::make_unique<StoreServerImpl>(store);
  STRATA_RETURN_IF_ERROR(server->Bind(address, keys));
  return std::unique_ptr<StoreServer>(std::move(server));
}

}  // namespace strata::worker
