#include "storage/keys.h"

#include <limits>

#include "storage/shard_store.h"

namespace strata::storage {

namespace {
constexpr char kTensorTag = 't';
constexpr char kManifestTag = 'm';
constexpr char kActivationRecordTag = 'r';
constexpr char kActivationCursorTag = 'c';

void AppendBigEndian(std::string* out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t ReadBigEndian(std::string_view in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<uint8_t>(in[i]);
  return v;
}
}  // namespace

std::string EncodeKeyString(const std::string& s) {
  STRATA_CHECK(s.size() <= std::numeric_limits<uint32_t>::max());
  std::string out;
  out.reserve(4 + s.size());
  AppendBigEndian(&out, s.size(), 4);
  out += s;
  return out;
}

std::string EncodeKeyU64(uint64_t v) {
  std::string out;
  AppendBigEndian(&out, v, 8);
  return out;
}

std::string PrintableKey(std::string_view key) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : key) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

namespace keys {

// Steps are validated non-negative by the store, so the u64 cast keeps their order.
std::string TensorPrefix(const std::string& run, int64_t step) {
  return kTensorTag + EncodeKeyString(run) + EncodeKeyU64(static_cast<uint64_t>(step));
}
std::string TensorKey(const std::string& run, int64_t step, const std::string& name) {
  return TensorPrefix(run, step) + EncodeKeyString(name);
}
std::string AllManifestsPrefix() { return std::string(1, kManifestTag); }
std::string AllTensorsPrefix() { return std::string(1, kTensorTag); }
std::string ManifestPrefix(const std::string& run) { return kManifestTag + EncodeKeyString(run); }
std::string ManifestKey(const std::string& run, int64_t step) {
  return ManifestPrefix(run) + EncodeKeyU64(static_cast<uint64_t>(step));
}

std::string ActivationRecordKey(const std::string& run, const std::string& site, int64_t layer, uint64_t row_begin) {
  return kActivationRecordTag + EncodeKeyString(run) + EncodeKeyString(site) +
         EncodeKeyU64(static_cast<uint64_t>(layer)) + EncodeKeyU64(row_begin);
}
std::string ActivationCursorPrefix(const std::string& run) { return kActivationCursorTag + EncodeKeyString(run); }
std::string ActivationCursorKey(const std::string& run, uint64_t chunk) {
  return ActivationCursorPrefix(run) + EncodeKeyU64(chunk);
}

std::string ActivationRunKey(const std::string& run) { return "i" + EncodeKeyString(run); }

}  // namespace keys

bool ConsumeKeyString(std::string_view* in, std::string* out) {
  if (in->size() < 4) return false;
  uint64_t len = ReadBigEndian(*in, 4);
  if (in->size() - 4 < len) return false;
  out->assign(in->substr(4, len));
  in->remove_prefix(4 + len);
  return true;
}

bool ConsumeKeyU64(std::string_view* in, uint64_t* out) {
  if (in->size() < 8) return false;
  *out = ReadBigEndian(*in, 8);
  in->remove_prefix(8);
  return true;
}

}  // namespace strata::storage
