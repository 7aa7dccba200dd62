// Reads committed checkpoint pieces from a worker's store server (worker/store_server.h):
// how a rank resumes from a shard whose store is on another host, and how a replica of a shard is
// copied to a store on another host. One request in flight at a time; every answer's bytes are
// checked against the checksum the store keeps for them.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>

#include "common/curve.h"
#include "common/status.h"
#include "storage/shard_store.h"

namespace strata::client {

class StoreClient {
 public:
  // `serve_address` as the worker advertised it (tcp:// ones carry the server key and need `keys`).
  static Result<std::unique_ptr<StoreClient>> Connect(const std::string& serve_address,
                                                      const std::optional<curve::ClientKeys>& keys, int timeout_ms);
  virtual ~StoreClient() = default;

  virtual Result<storage::Tensor> ReadCheckpointPiece(const std::string& key_run, int64_t step,
                                                      const std::string& name) = 0;
  // The same into `out`, which must be exactly the piece's size (InvalidArgument otherwise).
  virtual Status ReadCheckpointPieceInto(const std::string& key_run, int64_t step, const std::string& name,
                                         std::span<uint8_t> out) = 0;
  virtual const std::string& address() const = 0;
};

}  // namespace strata::client
