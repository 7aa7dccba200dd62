#include "worker/token_data.h"

#include <fstream>
#include <iterator>
#include <random>

namespace strata::worker {

Result<TokenData> TokenData::Load(const DataSpec& spec, int64_t vocab) {
  std::ifstream in(spec.path, std::ios::binary);
  if (!in) return NotFound("data.path = \"" + spec.path + "\" cannot be opened on this worker");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TokenData data;
  if (spec.format == "u16") {
    data.tokens_.resize(bytes.size() / 2);
    for (size_t i = 0; i < data.tokens_.size(); ++i) {
      data.tokens_[i] = bytes[2 * i] | (bytes[2 * i + 1] << 8);
      if (data.tokens_[i] >= vocab) {
        return InvalidArgument("data.path = \"" + spec.path + "\" holds token id " + std::to_string(data.tokens_[i]) +
                               " at position " + std::to_string(i) + ", not below model.vocab = " +
                               std::to_string(vocab) + "; raise model.vocab");
      }
    }
  } else {
    data.tokens_.assign(bytes.begin(), bytes.end());
  }
  return data;
}

std::vector<int64_t> TokenData::BatchOffsets(int64_t seed, int64_t step, int64_t global_batch, int64_t sequence) const {
  std::mt19937_64 rng(static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step));
  const uint64_t span = tokens_.size() - static_cast<size_t>(sequence);  // starts whose window of sequence + 1 fits
  std::vector<int64_t> offsets(global_batch);
  for (auto& o : offsets) o = static_cast<int64_t>(rng() % span);
  return offsets;
}

}  // namespace strata::worker
