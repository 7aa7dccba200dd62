#include "tensorboard/event_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace strata::tensorboard {
namespace {

constexpr char kVersion[] = "brain.Event:2";

std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;  // reflected Castagnoli
    table[i] = c;
  }
  return table;
}

// ---- protobuf wire format: the few field kinds an Event of scalars uses ----------------------------

void Varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

template <typename T>
void Fixed(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  out.append(bytes, sizeof(T));
}

void LengthDelimited(std::string& out, uint32_t field, const std::string& bytes) {
  Varint(out, field << 3 | 2);
  Varint(out, bytes.size());
  out += bytes;
}

std::string EventBytes(int64_t step, double wall_time, const std::string* version, const std::vector<Scalar>& scalars) {
  std::string event;
  Varint(event, 1 << 3 | 1);  // wall_time: double
  Fixed(event, wall_time);
  Varint(event, 2 << 3 | 0);  // step: int64
  Varint(event, static_cast<uint64_t>(step));
  if (version != nullptr) {
    LengthDelimited(event, 3, *version);
    return event;
  }
  std::string summary;
  for (const Scalar& s : scalars) {
    std::string value;
    LengthDelimited(value, 1, s.tag);
    Varint(value, 2 << 3 | 5);  // simple_value: float
    Fixed(value, s.value);
    LengthDelimited(summary, 1, value);
  }
  LengthDelimited(event, 5, summary);
  return event;
}

std::string Record(const std::string& data) {
  std::string out;
  const uint64_t length = data.size();
  Fixed(out, length);
  Fixed(out, MaskedCrc32c(out.data(), sizeof(length)));
  out += data;
  Fixed(out, MaskedCrc32c(data.data(), data.size()));
  return out;
}

Status WriteAll(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return IoError("cannot open " + path + " to append: " + std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      // A partial record would stop every reader at it: cut the file back to its last whole one.
      struct stat st {};
      if (::fstat(fd, &st) == 0 && done > 0) (void)::ftruncate(fd, st.st_size - static_cast<off_t>(done));
      ::close(fd);
      return IoError("cannot append to " + path + ": " + why);
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) return IoError("cannot close " + path + ": " + std::strerror(errno));
  return Status::Ok();
}

// A protobuf reader over one message's bytes.
struct Wire {
  const std::string& bytes;
  size_t at = 0;
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64 && at < bytes.size(); shift += 7) {
      const auto b = static_cast<uint8_t>(bytes[at++]);
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }
  template <typename T>
  bool Fixed(T* v) {
    if (bytes.size() - at < sizeof(T)) return false;
    std::memcpy(v, bytes.data() + at, sizeof(T));
    at += sizeof(T);
    return true;
  }
  bool Bytes(std::string* out) {
    uint64_t n = 0;
    if (!Varint(&n) || n > bytes.size() - at) return false;
    *out = bytes.substr(at, n);
    at += n;
    return true;
  }
  bool Skip(uint32_t type) {
    uint64_t v = 0;
    std::string s;
    double d;
    float f;
    switch (type) {
      case 0:
        return Varint(&v);
      case 1:
        return Fixed(&d);
      case 2:
        return Bytes(&s);
      case 5:
        return Fixed(&f);
      default:
        return false;
    }
  }
};

bool ParseValue(const std::string& bytes, ScalarEvent* e) {
  Wire w{bytes};
  uint64_t key = 0;
  while (w.at < bytes.size()) {
    if (!w.Varint(&key)) return false;
    if (key == (1 << 3 | 2)) {
      if (!w.Bytes(&e->tag)) return false;
    } else if (key == (2 << 3 | 5)) {
      if (!w.Fixed(&e->value)) return false;
    } else if (!w.Skip(key & 7)) {
      return false;
    }
  }
  return true;
}

bool ParseEvent(const std::string& bytes, std::vector<ScalarEvent>* out) {
  Wire w{bytes};
  ScalarEvent base;
  std::vector<std::string> values;
  uint64_t key = 0;
  while (w.at < bytes.size()) {
    if (!w.Varint(&key)) return false;
    if (key == (1 << 3 | 1)) {
      if (!w.Fixed(&base.wall_time)) return false;
    } else if (key == (2 << 3 | 0)) {
      uint64_t step = 0;
      if (!w.Varint(&step)) return false;
      base.step = static_cast<int64_t>(step);
    } else if (key == (5 << 3 | 2)) {
      std::string summary;
      if (!w.Bytes(&summary)) return false;
      Wire s{summary};
      uint64_t k = 0;
      while (s.at < summary.size()) {
        if (!s.Varint(&k)) return false;
        std::string value;
        if (k == (1 << 3 | 2)) {
          if (!s.Bytes(&value)) return false;
          values.push_back(value);
        } else if (!s.Skip(k & 7)) {
          return false;
        }
      }
    } else if (!w.Skip(key & 7)) {
      return false;
    }
  }
  for (const std::string& v : values) {
    ScalarEvent e = base;
    if (!ParseValue(v, &e)) return false;
    out->push_back(std::move(e));
  }
  return true;
}

}  // namespace

uint32_t Crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = MakeCrcTable();
  uint32_t crc = 0xffffffffu;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

uint32_t MaskedCrc32c(const void* data, size_t size) {
  const uint32_t crc = Crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::vector<Scalar> StepScalars(double loss, double lr, double grad_norm, double tokens_per_second,
                                double memory_bytes) {
  std::vector<Scalar> out;
  auto add = [&](const char* tag, double v) {
    if (std::isfinite(v)) out.push_back({tag, static_cast<float>(v)});
  };
  add("train/loss", loss);
  add("train/lr", lr);
  add("train/grad_norm", grad_norm);
  add("train/tokens_per_second", tokens_per_second);
  add("train/memory_bytes", memory_bytes);
  return out;
}

Result<EventFileWriter> EventFileWriter::Open(const std::string& dir, int64_t unix_seconds, Existing existing) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError("cannot create " + dir + ": " + ec.message());
  ::chmod(dir.c_str(), 0700);
  EventFileWriter w;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("events.out.tfevents.", 0) == 0 && (w.path_.empty() || entry.path().string() < w.path_))
      w.path_ = entry.path().string();
  }
  if (ec) return IoError("cannot list " + dir + ": " + ec.message());
  if (!w.path_.empty() && existing == Existing::kRefuse)
    return InvalidArgument(dir + " already holds a TensorBoard event file (" + w.path_ +
                           "); write into an empty directory, or remove that file first");
  if (!w.path_.empty()) return w;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  w.path_ = dir + "/events.out.tfevents." + std::to_string(unix_seconds) + "." + host;
  const std::string version = kVersion;
  STRATA_RETURN_IF_ERROR(WriteAll(w.path_, Record(EventBytes(0, static_cast<double>(unix_seconds), &version, {}))));
  return w;
}

Status EventFileWriter::Append(int64_t step, double wall_time, const std::vector<Scalar>& scalars) const {
  for (const Scalar& s : scalars)
    if (s.tag.empty()) return InvalidArgument("a TensorBoard scalar needs a tag");
  return WriteAll(path_, Record(EventBytes(step, wall_time, nullptr, scalars)));
}

Result<std::vector<ScalarEvent>> ReadEventFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open " + path);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<ScalarEvent> out;
  size_t at = 0;
  while (at < bytes.size()) {
    const std::string where = path + " at byte " + std::to_string(at);
    if (bytes.size() - at < 12) return Corruption(where + ": a record's header is cut short");
    uint64_t length = 0;
    uint32_t length_crc = 0;
    std::memcpy(&length, bytes.data() + at, 8);
    std::memcpy(&length_crc, bytes.data() + at + 8, 4);
    if (length_crc != MaskedCrc32c(bytes.data() + at, 8))
      return Corruption(where + ": the record length fails its checksum");
    if (length > bytes.size() - at - 12 || bytes.size() - at - 12 - length < 4)
      return Corruption(where + ": the record is cut short");
    const std::string data = bytes.substr(at + 12, length);
    uint32_t data_crc = 0;
    std::memcpy(&data_crc, bytes.data() + at + 12 + length, 4);
    if (data_crc != MaskedCrc32c(data.data(), data.size()))
      return Corruption(where + ": the record fails its checksum");
    if (!ParseEvent(data, &out)) return Corruption(where + ": not a tensorflow.Event");
    at += 12 + length + 4;
  }
  return out;
}

}  // namespace strata::tensorboard
