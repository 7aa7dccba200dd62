// The run spec's text at its edges: run names, text shown on a terminal, spec files read with
// a bound on their size (run_spec.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "spec/run_spec.h"

namespace strata {

Status ValidateRunName(const std::string& name) {
  auto refuse = [&](const std::string& why) {
    return InvalidArgument(
        "run spec: name = \"" + EscapeForTerminal(name.size() > 80 ? name.substr(0, 80) + "..." : name) + "\" " + why +
        "; a run name is 1 to " + std::to_string(spec_bounds::kNameLength) +
        " characters of A-Z a-z 0-9 . _ - not starting with '.' or '-' (it names files and log lines)");
  };
  if (name.empty()) return refuse("is empty");
  if (name.size() > spec_bounds::kNameLength) return refuse("is " + std::to_string(name.size()) + " bytes long");
  for (unsigned char c : name) {
    if (!std::isalnum(c) && c != '.' && c != '_' && c != '-') {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", c);
      return refuse(std::string("holds the character ") +
                    (c >= 0x20 && c < 0x7f ? "'" + std::string(1, static_cast<char>(c)) + "'" : hex));
    }
  }
  if (name[0] == '.' || name[0] == '-') return refuse("starts with '" + name.substr(0, 1) + "'");
  return Status::Ok();
}

std::string EscapeForTerminal(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  auto hex = [&](unsigned char c) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02X", c);
    out += buf;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const auto next = i + 1 < text.size() ? static_cast<unsigned char>(text[i + 1]) : 0;
    if (c < 0x20 || c == 0x7f || c == '\\') {
      hex(c);
    } else if (c == 0xC2 && next >= 0x80 && next <= 0x9F) {  // U+0080..U+009F: C1 controls (CSI is U+009B)
      hex(c), hex(next), ++i;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

Result<std::string> ReadSpecFile(const std::string& path, const std::string& what, size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO for reading must not wait for a writer; fstat then refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    return InvalidArgument("cannot read " + what + " " + path + ": " + std::strerror(err) +
                           (err == ENOENT ? "; check the path" : ""));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return IoError("cannot stat " + what + " " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) {
    const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a regular file";
    return InvalidArgument(what + " " + path + " is " + kind + "; give a regular file (TOML, at most " +
                           std::to_string(max_bytes >> 10) + " KiB)");
  }
  auto too_big = [&] {
    return InvalidArgument(what + " " + path + " is larger than " + std::to_string(max_bytes >> 10) +
                           " KiB; a run spec is a few lines of TOML, check the path");
  };
  if (static_cast<uint64_t>(st.st_size) > max_bytes) return too_big();
  // Read to the end, but never past the limit (a file that grows while it is read).
  std::string text;
  char buf[65536];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError("cannot read " + what + " " + path + ": " + std::strerror(errno));
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > max_bytes) return too_big();
  }
  return text;
}

}  // namespace strata
