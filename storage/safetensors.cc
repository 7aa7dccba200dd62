#include "storage/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "storage/records.h"

namespace strata::storage {
namespace {

using json = nlohmann::json;

const char* SafetensorsDType(DType d) {
  switch (d) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF64:
      return "F64";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kU16:
      return "U16";
    case DType::kU8:
      return "U8";
  }
  return "?";
}

bool ParseDType(const std::string& s, DType* out) {
  for (DType d :
       {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI64, DType::kI32, DType::kU16, DType::kU8}) {
    if (s == SafetensorsDType(d)) {
      *out = d;
      return true;
    }
  }
  return false;
}

// A header array of non-negative integers (shape, data_offsets), or nullopt. nlohmann's
// get<std::vector<...>>() would convert floats too (undefined behaviour when out of range).
std::optional<std::vector<uint64_t>> UnsignedList(const json& j) {
  if (!j.is_array()) return std::nullopt;
  std::vector<uint64_t> out;
  for (const json& v : j) {
    if (!v.is_number_unsigned()) return std::nullopt;
    out.push_back(v.get<uint64_t>());
  }
  return out;
}

uint64_t Numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

}  // namespace

Result<std::string> SafetensorsPrefix(const std::vector<SafetensorsEntry>& entries,
                                      const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::set<std::string> names;
  for (const auto& e : entries) {
    if (!names.insert(e.name).second) return InvalidArgument("safetensors: tensor '" + e.name + "' given twice");
    const uint64_t bytes = Numel(e.shape) * DTypeSize(e.dtype);
    header[e.name] = {
        {"dtype", SafetensorsDType(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the format allows trailing spaces; keeps data 8-aligned
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  return prefix + text;
}

Status WriteSafetensors(const std::string& path, const std::vector<NamedTensorView>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsEntry> entries;
  for (const auto& t : tensors) {
    const uint64_t expected = Numel(t.tensor.shape) * DTypeSize(t.tensor.dtype);
    if (t.tensor.bytes.size() != expected) {
      return InvalidArgument("safetensors: tensor '" + t.name + "' has " + std::to_string(t.tensor.bytes.size()) +
                             " bytes, its shape and dtype need " + std::to_string(expected));
    }
    entries.push_back({t.name, t.tensor.dtype, t.tensor.shape});
  }
  STRATA_ASSIGN_OR_RETURN(std::string prefix, SafetensorsPrefix(entries, metadata));
  const std::string tmp = path + ".tmp";
  std::error_code ec;
  bool written = false;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return IoError("cannot write " + tmp + ": check the directory exists and is writable");
    out.write(prefix.data(), static_cast<std::streamsize>(prefix.size()));
    for (const auto& t : tensors) {
      out.write(reinterpret_cast<const char*>(t.tensor.bytes.data()),
                static_cast<std::streamsize>(t.tensor.bytes.size()));
    }
    out.flush();
    written = static_cast<bool>(out);
  }
  // A failed write or move leaves no partial file behind (on a full disk, least of all).
  if (!written) {
    std::filesystem::remove(tmp, ec);
    return IoError("writing " + tmp + " failed (disk full?); nothing was left at " + path);
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove(tmp, ec);
    return IoError("cannot move " + tmp + " to " + path + ": " + why);
  }
  return Status::Ok();
}

namespace {

struct HeaderEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, size = 0;  // in the file
};
struct Header {
  std::vector<HeaderEntry> entries;
  std::map<std::string, std::string> metadata;
};

// Parses and checks the header of a file of `file_size` bytes whose first bytes `read(offset,
// n, out)` returns. Every tensor must lie inside the file: a truncated file is Corruption naming
// the first tensor past its end.
using ReadFn = std::function<bool(uint64_t offset, uint64_t n, char* out)>;
Result<Header> ParseHeader(const std::string& path, uint64_t file_size, const ReadFn& read) {
  unsigned char len[8];
  if (file_size < 8 || !read(0, 8, reinterpret_cast<char*>(len)))
    return Corruption(path + ": shorter than a safetensors header");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(len[i]) << (8 * i);
  if (n > file_size - 8 || n > (100u << 20))
    return Corruption(path + ": header length " + std::to_string(n) + " exceeds the file");
  std::string text(n, '\0');
  if (!read(8, n, text.data())) return Corruption(path + ": cannot read its header");
  const uint64_t data_size = file_size - 8 - n;
  Header out;
  try {
    json header = json::parse(text);
    if (!header.is_object()) return Corruption(path + ": header is not a JSON object");
    for (auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        for (auto& [k, v] : entry.items()) out.metadata[k] = v.get<std::string>();
        continue;
      }
      HeaderEntry t;
      t.name = name;
      if (!ParseDType(entry.at("dtype").get<std::string>(), &t.dtype)) {
        return Corruption(path + ": tensor '" + name + "' has unsupported dtype " + entry.at("dtype").dump());
      }
      std::optional<std::vector<uint64_t>> dims = UnsignedList(entry.at("shape"));
      if (!dims) {
        return Corruption(path + ": tensor '" + name + "' has shape " + entry.at("shape").dump() +
                          ", not a list of non-negative integers");
      }
      for (uint64_t d : *dims) {
        if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return Corruption(path + ": tensor '" + name + "' has a dimension of " + std::to_string(d));
        }
        t.shape.push_back(static_cast<int64_t>(d));
      }
      // Checked: a shape whose byte count wraps around 2^64 must not pass for a small tensor.
      const std::optional<uint64_t> expected = records::ByteSize(t.dtype, t.shape);
      if (!expected) {
        return Corruption(path + ": tensor '" + name + "' of shape " + records::ShapeString(t.shape) +
                          " has more bytes than fit in 64 bits");
      }
      std::optional<std::vector<uint64_t>> offsets = UnsignedList(entry.at("data_offsets"));
      if (!offsets || offsets->size() != 2 || (*offsets)[0] > (*offsets)[1] ||
          (*offsets)[1] - (*offsets)[0] != *expected) {
        return Corruption(path + ": tensor '" + name + "' has data_offsets not matching its shape and dtype");
      }
      if ((*offsets)[1] > data_size) {
        return Corruption(path + ": tensor '" + name + "' ends at byte " + std::to_string(8 + n + (*offsets)[1]) +
                          " but the file has " + std::to_string(file_size) +
                          " bytes: the file is truncated (copy or download it again)");
      }
      t.begin = 8 + n + (*offsets)[0];
      t.size = *expected;
      out.entries.push_back(std::move(t));
    }
  } catch (const std::exception& e) {
    return Corruption(path + ": malformed safetensors header: " + e.what());
  }
  return out;
}

}  // namespace

Result<SafetensorsFile> ReadSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open " + path);
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  auto read = [&](uint64_t offset, uint64_t n, char* out) {
    in.seekg(static_cast<std::streamoff>(offset));
    return static_cast<bool>(in.read(out, static_cast<std::streamsize>(n)));
  };
  STRATA_ASSIGN_OR_RETURN(Header header, ParseHeader(path, file_size, read));
  SafetensorsFile file;
  file.metadata = header.metadata;
  for (const HeaderEntry& e : header.entries) {
    Tensor t;
    t.dtype = e.dtype;
    t.shape = e.shape;
    t.bytes.resize(e.size);
    if (!read(e.begin, e.size, reinterpret_cast<char*>(t.bytes.data())))
      return Corruption(path + ": tensor '" + e.name + "' is truncated");
    t.checksum = Checksum(t.bytes);
    file.tensors.emplace(e.name, std::move(t));
  }
  return file;
}

Result<std::unique_ptr<MappedSafetensors>> MappedSafetensors::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(path + " is not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  void* base = size > 0 ? ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0) : nullptr;
  ::close(fd);  // the mapping keeps the file
  if (size > 0 && base == MAP_FAILED) return IoError("cannot map " + path + ": " + std::strerror(errno));
  std::unique_ptr<MappedSafetensors> file(new MappedSafetensors());
  file->path_ = path;
  file->base_ = static_cast<const uint8_t*>(base);
  file->size_ = size;
  auto read = [&](uint64_t offset, uint64_t n, char* out) {
    if (offset + n > size) return false;
    std::memcpy(out, file->base_ + offset, n);
    return true;
  };
  STRATA_ASSIGN_OR_RETURN(Header header, ParseHeader(path, size, read));
  file->metadata_ = header.metadata;
  for (const HeaderEntry& e : header.entries) {
    file->tensors_[e.name] = TensorView{e.dtype, e.shape, std::span<const uint8_t>(file->base_ + e.begin, e.size)};
  }
  return file;
}

MappedSafetensors::~MappedSafetensors() {
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), size_);
}

}  // namespace strata::storage
