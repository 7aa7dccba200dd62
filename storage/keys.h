// Private key layout of the checkpoints column family (see shard_store.h). All pieces are
// order-preserving, so one checkpoint's tensors and one run's manifests are contiguous ranges and
// steps sort numerically:
//   tensor    't' + EncodeKeyString(run) + EncodeKeyU64(step) + EncodeKeyString(name)
//   manifest  'm' + EncodeKeyString(run) + EncodeKeyU64(step)
// The length prefix of every string keeps run "a" from being a key prefix of run "ab".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace strata::storage::keys {

// Every tensor key of checkpoint (run, step).
std::string TensorPrefix(const std::string& run, int64_t step);
std::string TensorKey(const std::string& run, int64_t step, const std::string& name);
// Every manifest key of run.
std::string ManifestPrefix(const std::string& run);
// Every manifest key of every run, and every tensor key of every run.
std::string AllManifestsPrefix();
std::string AllTensorsPrefix();
std::string ManifestKey(const std::string& run, int64_t step);

// Activations column family:
//   record  'r' + EncodeKeyString(run) + EncodeKeyString(site) + EncodeKeyU64(layer) + EncodeKeyU64(row_begin)
//   cursor  'c' + EncodeKeyString(run) + EncodeKeyU64(chunk)
std::string ActivationRecordKey(const std::string& run, const std::string& site, int64_t layer, uint64_t row_begin);
std::string ActivationCursorPrefix(const std::string& run);
std::string ActivationCursorKey(const std::string& run, uint64_t chunk);
//   run     'i' + EncodeKeyString(run)   (ActivationRunInfo)
std::string ActivationRunKey(const std::string& run);

}  // namespace strata::storage::keys
