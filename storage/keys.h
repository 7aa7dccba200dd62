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
std::string ManifestKey(const std::string& run, int64_t step);

// Parse one EncodeKeyString / EncodeKeyU64 piece off the front of `in`; false if malformed.
bool ConsumeKeyString(std::string_view* in, std::string* out);
bool ConsumeKeyU64(std::string_view* in, uint64_t* out);

}  // namespace strata::storage::keys
