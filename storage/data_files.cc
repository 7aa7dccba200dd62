#include "storage/data_files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

namespace strata::storage {

RecordBuffer::RecordBuffer(RecordBuffer&& other) noexcept : data_(other.data_), capacity_(other.capacity_) {
  other.data_ = nullptr;
  other.capacity_ = 0;
}

RecordBuffer& RecordBuffer::operator=(RecordBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = other.data_;
    capacity_ = other.capacity_;
    other.data_ = nullptr;
    other.capacity_ = 0;
  }
  return *this;
}

RecordBuffer::~RecordBuffer() { std::free(data_); }

uint8_t* RecordBuffer::Reserve(size_t size) {
  if (size <= capacity_ && data_ != nullptr) return data_;
  std::free(data_);
  data_ = nullptr;
  capacity_ = 0;
  // Buffers of whole records (MBs) on 2 MiB huge pages where the kernel gives them: an O_DIRECT
  // read into 4 KiB pages is cut into requests of max_segments pages (512 KiB on virtio), and rows
  // gathered at random from a window of records miss the TLB on nearly every row.
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t align = size >= kHuge ? kHuge : kAlignment;
  const size_t rounded = (std::max<size_t>(size, 1) + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
  if (p == nullptr) throw std::bad_alloc();
  if (align == kHuge) ::madvise(p, rounded, MADV_HUGEPAGE);  // a hint: without THP it stays 4 KiB pages
  data_ = static_cast<uint8_t*>(p);
  capacity_ = rounded;
  return data_;
}

namespace {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

Status CannotOpen(const std::string& path, const char* what) {
  return Corruption(std::string("the ") + what + " file " + path + " named by the store's index cannot be opened (" +
                    std::strerror(errno) + "); the store is damaged");
}

Status Shorter(const std::string& path, const char* what) {
  return Corruption(std::string("the ") + what + " file " + path +
                    " is shorter than the store's index says; the store is damaged");
}

// Reads until `size` bytes are in or the file ends; the bytes read, or -errno.
int64_t PreadFully(int fd, uint8_t* out, uint64_t size, uint64_t offset) {
  uint64_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, out + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0) break;
    done += static_cast<uint64_t>(n);
  }
  return static_cast<int64_t>(done);
}

}  // namespace

ChunkFileWriter::~ChunkFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

Status ChunkFileWriter::Open(const std::string& path) {
  path_ = path;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd_ < 0) return IoError("cannot create " + path + ": " + std::strerror(errno));
  return Status::Ok();
}

Status ChunkFileWriter::WriteAt(uint64_t offset, std::span<const uint8_t> bytes) {
  constexpr size_t kPiece = size_t{64} << 20;
  while (!bytes.empty()) {
    const ssize_t n = ::pwrite(fd_, bytes.data(), std::min(bytes.size(), kPiece), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return Status(errno == ENOSPC ? StatusCode::kResourceExhausted : StatusCode::kIoError,
                    "writing " + path_ + " failed: " + std::strerror(errno) + "; free space or choose another --store");
    }
    // Start writeback of this piece now: the disk works while later pieces are copied in,
    // instead of idling until the final fdatasync.
    ::sync_file_range(fd_, static_cast<off_t>(offset), n, SYNC_FILE_RANGE_WRITE);
    offset += static_cast<uint64_t>(n);
    bytes = bytes.subspan(static_cast<size_t>(n));
  }
  return Status::Ok();
}

Status ChunkFileWriter::SyncAndClose() {
  const bool ok = ::fdatasync(fd_) == 0;
  const int err = errno;
  ::close(fd_);
  fd_ = -1;
  if (!ok) return IoError("syncing " + path_ + " failed: " + std::strerror(err));
  return Status::Ok();
}

Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return IoError("cannot open " + dir + ": " + std::strerror(errno));
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok ? Status::Ok() : IoError("cannot sync " + dir + ": " + std::strerror(errno));
}

Status ReadFileRange(const std::string& path, const char* what, uint64_t offset, std::span<uint8_t> out) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return CannotOpen(path, what);
  const int64_t n = PreadFully(fd.get(), out.data(), out.size(), offset);
  if (n < 0)
    return IoError(std::string("reading the ") + what + " file " + path + ": " + std::strerror(static_cast<int>(-n)));
  if (static_cast<uint64_t>(n) < out.size()) return Shorter(path, what);
  return Status::Ok();
}

bool RangeInPageCache(int fd, uint64_t offset, uint64_t size) {
  if (size == 0) return true;
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = offset / page * page;
  const uint64_t length = offset + size - begin;
  // Mapping a file range sets up page tables lazily: no page is read, and mincore only looks.
  void* map = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(begin));
  if (map == MAP_FAILED) return false;
  std::vector<unsigned char> resident((length + page - 1) / page);
  bool all = ::mincore(map, length, resident.data()) == 0;
  for (size_t i = 0; all && i < resident.size(); ++i) all = (resident[i] & 1) != 0;
  ::munmap(map, length);
  return all;
}

Result<std::span<const uint8_t>> ReadFileRecord(const std::string& path, const char* what, uint64_t offset,
                                                uint64_t size, RecordBuffer& buffer, ColdRead cold) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return CannotOpen(path, what);
  auto buffered = [&]() -> Result<std::span<const uint8_t>> {
    uint8_t* out = buffer.Reserve(size);
    const int64_t n = PreadFully(fd.get(), out, size, offset);
    if (n < 0) {
      return IoError(std::string("reading the ") + what + " file " + path + ": " + std::strerror(static_cast<int>(-n)));
    }
    if (static_cast<uint64_t>(n) < size) return Shorter(path, what);
    return std::span<const uint8_t>(out, size);
  };
  if (cold == ColdRead::kThroughPageCache || RangeInPageCache(fd.get(), offset, size)) return buffered();

  constexpr uint64_t kAlign = RecordBuffer::kAlignment;  // covers 512 B and 4 KiB logical blocks
  Fd direct(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT));
  if (direct.get() < 0) return buffered();  // EINVAL: the file system has no O_DIRECT
  const uint64_t begin = offset / kAlign * kAlign;
  const uint64_t end = (offset + size + kAlign - 1) / kAlign * kAlign;
  uint8_t* out = buffer.Reserve(end - begin);
  const int64_t n = PreadFully(direct.get(), out, end - begin, begin);  // ends short at the file's end
  if (n == -EINVAL) return buffered();                                  // alignment the device refuses
  if (n < 0) {
    return IoError(std::string("reading the ") + what + " file " + path + ": " + std::strerror(static_cast<int>(-n)));
  }
  if (static_cast<uint64_t>(n) < offset + size - begin) return Shorter(path, what);
  return std::span<const uint8_t>(out + (offset - begin), size);
}

}  // namespace strata::storage
