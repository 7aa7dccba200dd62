#include "client/tokenize.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <ostream>
#include <sstream>
#include <vector>

#include "common/byte_size.h"
#include "spec/run_spec.h"
#include "tokenizer/tokenizer.h"

namespace strata::client {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr size_t kBlockBytes = 4 << 20;

// The temporary output, removed if the process is interrupted (SIGINT / SIGTERM) so that a
// cancelled run over a large corpus does not leave gigabytes beside --out. Set while writing.
char g_temp_path[4096];
std::atomic<bool> g_temp_active{false};

void RemoveTempAndExit(int signal_number) {
  if (g_temp_active.load()) ::unlink(g_temp_path);  // async-signal-safe
  ::signal(signal_number, SIG_DFL);
  ::raise(signal_number);
}

Status WriteError(const std::string& path, int err) {
  if (err == ENOSPC || err == EDQUOT) {
    return Status(StatusCode::kResourceExhausted,
                  "cannot write " + path + ": the disk is full (" + std::strerror(err) + "); free space and retry");
  }
  return IoError("cannot write " + path + ": " + std::strerror(err));
}

// The ids go out little-endian, uint32 or uint16, through one buffer.
class IdWriter {
 public:
  IdWriter(int fd, std::string path, bool u16) : fd_(fd), path_(std::move(path)), u16_(u16) {}

  Status Write(const std::vector<uint32_t>& ids) {
    const size_t width = u16_ ? 2 : 4;
    buffer_.resize(ids.size() * width);
    char* out = buffer_.data();
    for (const uint32_t id : ids) {
      const uint32_t le = std::endian::native == std::endian::little ? id : __builtin_bswap32(id);
      if (u16_) {
        const uint16_t v = static_cast<uint16_t>(
            std::endian::native == std::endian::little ? id : __builtin_bswap16(static_cast<uint16_t>(id)));
        std::memcpy(out, &v, 2);
      } else {
        std::memcpy(out, &le, 4);
      }
      out += width;
    }
    size_t done = 0;
    while (done < buffer_.size()) {
      const ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return WriteError(path_, n < 0 ? errno : ENOSPC);
      done += static_cast<size_t>(n);
    }
    tokens_ += static_cast<int64_t>(ids.size());
    return Status::Ok();
  }
  int64_t tokens() const { return tokens_; }

 private:
  int fd_;
  std::string path_;
  bool u16_;
  std::vector<char> buffer_;
  int64_t tokens_ = 0;
};

// Progress lines on `log`: every 5% of a file of known size, or every `every_s` seconds, whichever
// comes first; none for an input that is done within the first interval.
class Progress {
 public:
  Progress(int64_t total_bytes, int every_s, std::ostream& log)
      : total_(total_bytes), every_(std::chrono::seconds(every_s)), log_(log) {}

  void Update(int64_t bytes, int64_t tokens) {
    const auto now = Clock::now();
    const bool by_time = now - last_line_ >= every_;
    const bool by_share = total_ > 0 && now - start_ >= every_ && bytes * 20 / total_ > last_twentieth_;
    if (!by_time && !by_share) return;
    last_line_ = now;
    if (total_ > 0) last_twentieth_ = bytes * 20 / total_;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    const double rate = seconds > 0 ? bytes / seconds : 0;
    std::ostringstream line;
    line << "strata tokenize: ";
    if (total_ > 0)
      line << (bytes * 100 / total_) << "% (" << HumanBytes(bytes) << " of " << HumanBytes(total_) << "), ";
    else
      line << HumanBytes(bytes) << " read, ";
    line << tokens << " tokens, ";
    char speed[32];
    std::snprintf(speed, sizeof(speed), "%.1f MB/s", rate / 1e6);
    line << speed;
    if (total_ > 0 && rate > 0) line << ", about " << static_cast<int64_t>((total_ - bytes) / rate) << " s left";
    log_ << line.str() << std::endl;
  }
  double Seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  int64_t total_;
  Clock::duration every_;
  std::ostream& log_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_line_ = Clock::now();
  int64_t last_twentieth_ = 0;
};

// Checks that need no tokenizer and no reading, so that a typo costs nothing.
Status CheckRequest(const TokenizeRequest& r) {
  if (r.format != "u32" && r.format != "u16") {
    return InvalidArgument("--format " + EscapeForTerminal(r.format) + " is not a format; use u32 or u16");
  }
  if (r.out.empty()) return InvalidArgument("name the output file: --out FILE.u32");
  std::error_code ec;
  if (r.input != "-") {
    if (!fs::exists(r.input, ec))
      return InvalidArgument(EscapeForTerminal(r.input) +
                             ": no such file (INPUT is a UTF-8 text file, or - for standard input)");
    if (fs::is_directory(r.input, ec))
      return InvalidArgument(EscapeForTerminal(r.input) + " is a directory; INPUT is a UTF-8 text file");
  }
  if (fs::is_directory(r.out, ec))
    return InvalidArgument("--out " + EscapeForTerminal(r.out) + " is a directory; name a file");
  if (fs::exists(r.out, ec) && !r.force) {
    return InvalidArgument("--out " + EscapeForTerminal(r.out) + " exists; pass --force to replace it");
  }
  const fs::path parent = fs::path(r.out).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec)) {
    return InvalidArgument("--out " + EscapeForTerminal(r.out) + ": the directory " +
                           EscapeForTerminal(parent.string()) + " does not exist");
  }
  return Status::Ok();
}

struct Totals {
  int64_t bytes = 0;
  int64_t tokens = 0;
  int64_t inexact_cuts = 0;
};

// INPUT through the tokenizer's stream into `writer`.
Status Stream(const TokenizeRequest& r, const tokenizer::Tokenizer& tok, int in_fd, int64_t total_bytes,
              IdWriter& writer, Totals* totals, std::ostream& log) {
  const std::string input_name = r.input == "-" ? "standard input" : EscapeForTerminal(r.input);
  auto stream = tok.NewStream();
  Progress progress(total_bytes, r.progress_every_s, log);
  std::vector<char> block(kBlockBytes);
  std::string pending;  // the start of a character cut by the end of the last block
  std::vector<uint32_t> ids;
  int64_t offset = 0;  // of pending[0] in the input
  while (true) {
    const ssize_t n = ::read(in_fd, block.data(), block.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError("cannot read " + input_name + ": " + std::strerror(errno));
    if (n == 0) break;
    pending.append(block.data(), static_cast<size_t>(n));
    // Only whole characters go on; ill-formed text is refused rather than read as U+FFFD, which
    // would put tokens into the data that the text does not have.
    std::string_view text = pending;
    text.remove_suffix(tokenizer::IncompleteUtf8Suffix(text));
    size_t bad = 0;
    if (!tokenizer::IsValidUtf8(text, &bad)) {
      char byte[8];
      std::snprintf(byte, sizeof(byte), "0x%02X", static_cast<unsigned char>(text[bad]));
      return InvalidArgument(input_name + " is not UTF-8: byte " + byte + " at offset " + std::to_string(offset + bad) +
                             "; strata tokenize reads UTF-8 text: convert it first (iconv -f ENCODING -t UTF-8)");
    }
    ids.clear();
    stream->Feed(text, &ids);
    STRATA_RETURN_IF_ERROR(writer.Write(ids));
    offset += static_cast<int64_t>(text.size());
    pending.erase(0, text.size());
    progress.Update(offset + static_cast<int64_t>(pending.size()), writer.tokens());
  }
  if (!pending.empty()) {
    return InvalidArgument(input_name + " is not UTF-8: it ends inside a character (offset " + std::to_string(offset) +
                           "); the file may be cut short");
  }
  ids.clear();
  stream->Finish(&ids);
  STRATA_RETURN_IF_ERROR(writer.Write(ids));
  totals->bytes = offset;
  totals->tokens = writer.tokens();
  totals->inexact_cuts = stream->inexact_cuts();
  return Status::Ok();
}

std::string TempPathFor(const std::string& out) { return out + ".tmp." + std::to_string(::getpid()); }

std::string Size(int64_t bytes) { return bytes < 1024 ? std::to_string(bytes) + " bytes" : HumanBytes(bytes); }

}  // namespace

Status TokenizeFile(const TokenizeRequest& r, std::ostream& log, std::ostream& summary) {
  STRATA_RETURN_IF_ERROR(CheckRequest(r));
  auto loaded = tokenizer::LoadTokenizer(r.model_dir);
  if (!loaded.ok()) return loaded.status();
  const tokenizer::Tokenizer& tok = **loaded;
  const bool u16 = r.format == "u16";
  if (u16 && tok.vocab_size() > 65536) {
    return InvalidArgument("--format u16 holds ids below 65536, but this tokenizer has " +
                           std::to_string(tok.vocab_size()) + " ids (" + tok.description() + "); use --format u32");
  }

  int in_fd = STDIN_FILENO;
  int64_t total_bytes = 0;
  if (r.input != "-") {
    in_fd = ::open(r.input.c_str(), O_RDONLY | O_CLOEXEC);
    if (in_fd < 0) return IoError("cannot open " + EscapeForTerminal(r.input) + ": " + std::strerror(errno));
    struct stat st {};
    if (::fstat(in_fd, &st) == 0 && S_ISREG(st.st_mode)) total_bytes = st.st_size;
    ::posix_fadvise(in_fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  }
  struct InputCloser {
    int fd;
    ~InputCloser() {
      if (fd != STDIN_FILENO) ::close(fd);
    }
  } input_closer{in_fd};

  const std::string temp = TempPathFor(r.out);
  const int out_fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out_fd < 0) return WriteError(temp, errno);
  std::snprintf(g_temp_path, sizeof(g_temp_path), "%s", temp.c_str());
  g_temp_active = true;
  auto previous_int = ::signal(SIGINT, RemoveTempAndExit);
  auto previous_term = ::signal(SIGTERM, RemoveTempAndExit);
  const auto cleanup = [&](bool remove) {
    ::signal(SIGINT, previous_int);
    ::signal(SIGTERM, previous_term);
    g_temp_active = false;
    if (remove) ::unlink(temp.c_str());
  };

  IdWriter writer(out_fd, EscapeForTerminal(r.out), u16);
  Totals totals;
  const auto start = Clock::now();
  Status st = Stream(r, tok, in_fd, total_bytes, writer, &totals, log);
  // The ids are durable before the name points at them: fsync, then rename, then the directory.
  if (st.ok() && ::fsync(out_fd) != 0) st = WriteError(EscapeForTerminal(r.out), errno);
  if (::close(out_fd) != 0 && st.ok()) st = WriteError(EscapeForTerminal(r.out), errno);
  if (st.ok() && ::rename(temp.c_str(), r.out.c_str()) != 0) st = WriteError(EscapeForTerminal(r.out), errno);
  cleanup(/*remove=*/!st.ok());
  STRATA_RETURN_IF_ERROR(st);
  const std::string dir = fs::path(r.out).parent_path().string();
  if (const int dir_fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }

  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  char rate[64];
  std::snprintf(rate, sizeof(rate), "%.2f s, %.1f MB/s", seconds, seconds > 0 ? totals.bytes / seconds / 1e6 : 0.0);
  summary << "wrote " << totals.tokens << " token ids (" << r.format << ", " << Size(totals.tokens * (u16 ? 2 : 4))
          << ") to " << EscapeForTerminal(r.out) << " from " << Size(totals.bytes) << " of text in " << rate
          << "; tokenizer: " << tok.description() << std::endl;
  if (totals.inexact_cuts > 0) {
    log << "strata tokenize: warning: " << totals.inexact_cuts
        << " cut(s) in text without spaces, where the ids may differ from encoding the whole text by the pieces "
           "at the cut (SentencePiece; see docs/tokenize.md)"
        << std::endl;
  }
  return Status::Ok();
}

}  // namespace strata::client
