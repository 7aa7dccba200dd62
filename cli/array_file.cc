#include "cli/array_file.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "storage/safetensors.h"

namespace strata::cli {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// NPY format 1.0: magic, version, u16 header length, then a Python dict literal padded with
// spaces and a newline so that the data starts on a 64-byte boundary.
std::string NpyHeader(const char* descr, const std::vector<int64_t>& shape) {
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ", ";
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" +
                     dims.substr(0, shape.size() == 1 ? dims.size() : dims.size() - 2) + "), }";
  const size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>((dict.size() >> 8) & 0xff);
  return out + dict;
}

class Writer final : public ArrayFileWriter {
 public:
  ~Writer() override {
    if (file_ && file_ != stdout) std::fclose(file_);
    if (!committed_ && !tmp_.empty()) std::filesystem::remove(tmp_);
  }

  Status Open(const std::string& path, storage::DType dtype, uint64_t rows, const std::vector<int64_t>& row_shape,
              const std::string& name, const std::map<std::string, std::string>& metadata, bool replace) {
    std::vector<int64_t> shape = {static_cast<int64_t>(rows)};
    shape.insert(shape.end(), row_shape.begin(), row_shape.end());
    std::string shape_text;
    for (int64_t d : shape) shape_text += (shape_text.empty() ? "" : ", ") + std::to_string(d);
    path_ = path;
    replace_ = replace;
    if (path != "-" && !replace && Exists(path)) return Clobber(path);
    std::string prefix;
    const bool npy = path == "-" || EndsWith(path, ".npy");
    if (npy) {
      const char* descr = nullptr;
      switch (dtype) {
        case storage::DType::kF32:
          descr = "<f4";
          break;
        case storage::DType::kF16:
          descr = "<f2";
          break;
        case storage::DType::kBF16:
          descr = "<f4";
          widen_bf16_ = true;
          break;
        case storage::DType::kI64:
          descr = "<i8";
          break;
        case storage::DType::kI32:
          descr = "<i4";
          break;
        default:
          return InvalidArgument(std::string("cannot write dtype ") + storage::DTypeName(dtype) + " as .npy");
      }
      prefix = NpyHeader(descr, shape);
      description_ = std::string(widen_bf16_ ? "float32 (widened from bf16)" : descr) + " [" + shape_text + "] .npy";
    } else if (EndsWith(path, ".safetensors")) {
      STRATA_ASSIGN_OR_RETURN(prefix, storage::SafetensorsPrefix({{name, dtype, shape}}, metadata));
      description_ =
          std::string(storage::DTypeName(dtype)) + " [" + shape_text + "] .safetensors tensor '" + name + "'";
    } else {
      return InvalidArgument("--out " + path +
                             ": the extension must be .npy or .safetensors (or - for .npy on stdout)");
    }
    if (path == "-") {
      file_ = stdout;
    } else {
      // A temp file of its own (never another one's PATH.tmp), beside PATH so the rename stays on one file system.
      std::string tmp = path + ".tmp.XXXXXX";
      const int fd = ::mkstemp(tmp.data());
      if (fd < 0 || !(file_ = ::fdopen(fd, "wb"))) {
        const int err = errno;
        if (fd >= 0) ::close(fd), std::filesystem::remove(tmp);
        return IoError("--out " + path + ": cannot create " + tmp + " (" + std::strerror(err) +
                       "); check that the directory exists and is writable");
      }
      tmp_ = tmp;
    }
    return Write(prefix.data(), prefix.size());
  }

  Status Append(std::span<const uint8_t> bytes) override {
    if (!widen_bf16_) return Write(bytes.data(), bytes.size());
    // bf16 is the top half of a float32: shift each value up 16 bits.
    std::vector<uint32_t> wide(bytes.size() / 2);
    for (size_t i = 0; i < wide.size(); ++i) {
      wide[i] = (static_cast<uint32_t>(bytes[2 * i]) | static_cast<uint32_t>(bytes[2 * i + 1]) << 8) << 16;
    }
    return Write(wide.data(), wide.size() * 4);
  }

  Status Commit() override {
    if (std::fflush(file_) != 0) return IoError("writing " + path_ + " failed: " + std::strerror(errno));
    if (file_ == stdout) {
      committed_ = true;
      return Status::Ok();
    }
    const bool closed = std::fclose(file_) == 0;
    file_ = nullptr;
    if (!closed) return IoError("writing " + path_ + " failed: " + std::strerror(errno));
    if (replace_) {
      std::error_code ec;
      std::filesystem::rename(tmp_, path_, ec);
      if (ec) return IoError("cannot move " + tmp_ + " to " + path_ + ": " + ec.message());
    } else {
      // link() fails with EEXIST instead of replacing: a file that appeared since Open is kept.
      if (::link(tmp_.c_str(), path_.c_str()) != 0) {
        if (errno == EEXIST) return Clobber(path_);
        return IoError("cannot move " + tmp_ + " to " + path_ + ": " + std::strerror(errno));
      }
      std::filesystem::remove(tmp_);
    }
    committed_ = true;
    return Status::Ok();
  }

  std::string description() const override { return description_; }

 private:
  Status Write(const void* data, size_t n) {
    if (std::fwrite(data, 1, n, file_) != n) {
      return IoError("writing " + path_ + " failed (" + std::strerror(errno) + "); is the disk full?");
    }
    return Status::Ok();
  }

  static bool Exists(const std::string& path) {
    std::error_code ec;
    return std::filesystem::symlink_status(path, ec).type() != std::filesystem::file_type::not_found;
  }
  static Status Clobber(const std::string& path) {
    return InvalidArgument("--out " + path +
                           " already exists; choose a new path, remove it, or pass --force to replace it");
  }

  std::string path_, tmp_, description_;
  std::FILE* file_ = nullptr;
  bool replace_ = false;
  bool widen_bf16_ = false;
  bool committed_ = false;
};

}  // namespace

Result<std::unique_ptr<ArrayFileWriter>> ArrayFileWriter::Create(const std::string& path, storage::DType dtype,
                                                                 uint64_t rows, const std::vector<int64_t>& row_shape,
                                                                 const std::string& tensor_name,
                                                                 const std::map<std::string, std::string>& metadata,
                                                                 bool replace) {
  auto writer = std::make_unique<Writer>();
  STRATA_RETURN_IF_ERROR(writer->Open(path, dtype, rows, row_shape, tensor_name, metadata, replace));
  return std::unique_ptr<ArrayFileWriter>(std::move(writer));
}

}  // namespace strata::cli
