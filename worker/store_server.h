// The worker's store server: answers reads of captured activations from its shard store, so
// `strata activations get` (and the C++ reader) work from any machine that reaches the worker,
// and reads of committed checkpoint pieces (a resume or a replica on another host: StoreClient).
//   ReadActivation      -> [ActivationData envelope][raw bytes frame], or an Error envelope.
//   ReadCheckpointPiece -> [checkpointPieceData envelope][raw bytes frame], or an Error envelope.
// It runs on its own thread with its own ZeroMQ context and ROUTER socket (and, on tcp://, its
// own ZAP handler admitting only the cluster's authorized keys); it shares only the shard store,
// which is thread-safe. Undecodable or unexpected requests are answered with an error, never a
// crash.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "common/curve.h"
#include "common/status.h"
#include "storage/shard_store.h"

namespace strata::worker {

class StoreServer {
 public:
  // Binds `address` (ipc:// or tcp://; tcp needs `keys`) and starts serving.
  static Result<std::unique_ptr<StoreServer>> Start(const std::string& address, storage::ShardStore* store,
                                                    const std::optional<curve::ClientKeys>& keys);
  virtual ~StoreServer() = default;  // stops the thread
  // The address clients use: with the server key appended on tcp:// (curve::AddressWithKey).
  virtual const std::string& advertised_address() const = 0;
};

}  // namespace strata::worker
