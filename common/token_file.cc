#include "common/token_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

namespace strata {
namespace {

// Ids are read as the host lays them out; the formats are little-endian, and so is every host
// Strata builds for (x86-64, aarch64).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files are read as little-endian in place");

// numpy itself refuses headers over 10,000 bytes unless told otherwise; anything this large is not
// a token array's header.
constexpr uint64_t kMaxNpyHeaderBytes = uint64_t{1} << 20;
constexpr int kMaxNpyNesting = 8;

// ---------------------------------------------------------------- Python literals (.npy dict)

// The subset of Python literals a .npy header uses: str, True/False/None, int (with the L suffix
// of Python 2's numpy), tuple, list and dict.
struct PyValue {
  enum Kind { kString, kBool, kNone, kInt, kTuple, kList, kDict } kind = kNone;
  std::string text;       // kString; for kInt, the literal as written
  bool flag = false;      // kBool
  bool negative = false;  // kInt
  uint64_t number = 0;    // kInt: its magnitude (saturates; `overflow` says so)
  bool overflow = false;
  std::vector<PyValue> items;  // kTuple, kList; kDict: the values
  std::vector<std::string>
      keys;  // kDict: the keys, in order (a pair<string, PyValue> cannot hold this incomplete type)
};

class PyLiteralParser {
 public:
  explicit PyLiteralParser(std::string_view text) : text_(text) {}

  // One value spanning the whole text (trailing whitespace allowed); the error says where.
  Result<PyValue> ParseWhole() {
    STRATA_ASSIGN_OR_RETURN(PyValue v, Value(0));
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected text after the dict");
    return v;
  }

 private:
  Status Error(const std::string& why) const {
    std::string near(text_.substr(pos_, 20));
    for (char& c : near) {
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
    }
    return InvalidArgument(why + " at character " + std::to_string(pos_) +
                           (near.empty() ? "" : " (near \"" + near + "\")"));
  }

  void SkipSpace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }

  bool Consume(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  Result<PyValue> Value(int depth) {
    if (depth > kMaxNpyNesting) return Error("nesting deeper than " + std::to_string(kMaxNpyNesting));
    SkipSpace();
    if (pos_ >= text_.size()) return Error("the header ends where a value should be");
    const char c = text_[pos_];
    PyValue v;
    if (c == '\'' || c == '"') {
      v.kind = PyValue::kString;
      STRATA_ASSIGN_OR_RETURN(v.text, String());
      return v;
    }
    if (c == '(' || c == '[') {
      v.kind = c == '(' ? PyValue::kTuple : PyValue::kList;
      const char close = c == '(' ? ')' : ']';
      ++pos_;
      while (!Consume(close)) {
        STRATA_ASSIGN_OR_RETURN(PyValue item, Value(depth + 1));
        v.items.push_back(std::move(item));
        if (Consume(close)) break;
        if (!Consume(',')) return Error(std::string("expected ',' or '") + close + "'");
      }
      return v;
    }
    if (c == '{') {
      v.kind = PyValue::kDict;
      ++pos_;
      while (!Consume('}')) {
        SkipSpace();
        if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) return Error("expected a quoted key");
        STRATA_ASSIGN_OR_RETURN(std::string key, String());
        if (!Consume(':')) return Error("expected ':' after key '" + key + "'");
        STRATA_ASSIGN_OR_RETURN(PyValue item, Value(depth + 1));
        for (const auto& k : v.keys) {
          if (k == key) return Error("key '" + key + "' appears twice");
        }
        v.keys.push_back(std::move(key));
        v.items.push_back(std::move(item));
        if (Consume('}')) break;
        if (!Consume(',')) return Error("expected ',' or '}'");
      }
      return v;
    }
    if (c == '-' || c == '+' || (c >= '0' && c <= '9')) {
      v.kind = PyValue::kInt;
      const size_t start = pos_;
      if (c == '-' || c == '+') v.negative = c == '-', ++pos_;
      if (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9') return Error("expected digits");
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        const uint64_t digit = static_cast<uint64_t>(text_[pos_] - '0');
        if (v.number > (std::numeric_limits<uint64_t>::max() - digit) / 10) v.overflow = true;
        v.number = v.overflow ? std::numeric_limits<uint64_t>::max() : v.number * 10 + digit;
        ++pos_;
      }
      if (pos_ < text_.size() && (text_[pos_] == 'L' || text_[pos_] == 'l')) ++pos_;  // Python 2 long
      v.text = std::string(text_.substr(start, pos_ - start));
      return v;
    }
    for (const auto& [word, kind, flag] :
         {std::tuple{"True", PyValue::kBool, true}, std::tuple{"False", PyValue::kBool, false},
          std::tuple{"None", PyValue::kNone, false}}) {
      const std::string_view w(word);
      if (text_.substr(pos_, w.size()) == w) {
        pos_ += w.size();
        v.kind = kind;
        v.flag = flag;
        v.text = std::string(w);
        return v;
      }
    }
    return Error("unexpected character");
  }

  Result<std::string> String() {
    const char quote = text_[pos_++];
    std::string out;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '\\' && pos_ + 1 < text_.size()) ++pos_;
      out += text_[pos_++];
    }
    if (pos_ >= text_.size()) return Error("unterminated string");
    ++pos_;
    return out;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

std::string Render(const PyValue& v) {
  switch (v.kind) {
    case PyValue::kString:
      return "'" + v.text + "'";
    case PyValue::kTuple:
    case PyValue::kList: {
      std::string out = v.kind == PyValue::kTuple ? "(" : "[";
      for (size_t i = 0; i < v.items.size(); ++i) out += (i ? ", " : "") + Render(v.items[i]);
      if (v.kind == PyValue::kTuple && v.items.size() == 1) out += ",";
      return out + (v.kind == PyValue::kTuple ? ")" : "]");
    }
    case PyValue::kDict:
      return "{...}";
    default:
      return v.text;
  }
}

uint32_t ReadLe(const unsigned char* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// ---------------------------------------------------------------- files

struct OpenFile {
  int fd = -1;
  uint64_t size = 0;
  ~OpenFile() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens `path` for reading, only if it is a regular file (a FIFO or device is refused without
// blocking on it).
Status OpenRegular(const std::string& path, const std::string& what, OpenFile* file) {
  file->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (file->fd < 0) {
    const int err = errno;
    const std::string why = what + " cannot be opened: " + std::strerror(err);
    return err == ENOENT ? NotFound(why) : IoError(why);
  }
  struct stat st {};
  if (::fstat(file->fd, &st) != 0) return IoError(what + " cannot be read: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return InvalidArgument(what + " is not a regular file");
  file->size = static_cast<uint64_t>(st.st_size);
  return Status::Ok();
}

Result<std::string> ReadPrefix(const OpenFile& file, uint64_t bytes, const std::string& what) {
  std::string out(static_cast<size_t>(std::min(bytes, file.size)), '\0');
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(file.fd, out.data() + done, out.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError(what + " cannot be read: " + std::strerror(errno));
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

bool IsNpy(std::string_view prefix) {
  return prefix.size() >= 6 && prefix.substr(0, 6) == std::string_view("\x93NUMPY", 6);
}

// Reads the header of the .npy file `file`; `what` names it.
Result<NpyHeader> ReadNpyHeader(const OpenFile& file, const std::string& what) {
  STRATA_ASSIGN_OR_RETURN(std::string head, ReadPrefix(file, 12, what));
  if (head.size() >= 12) {
    const auto* p = reinterpret_cast<const unsigned char*>(head.data());
    const uint64_t length = p[6] == 1 ? ReadLe(p + 8, 2) + 10 : uint64_t{ReadLe(p + 8, 4)} + 12;
    if (length <= 12 + kMaxNpyHeaderBytes) {
      STRATA_ASSIGN_OR_RETURN(head, ReadPrefix(file, length, what));
    }
  }
  return ParseNpyHeader(head, what);
}

// The element type named by a .npy descr such as "<u4"; refuses floats, big-endian and the rest.
Result<IntType> IntegerDescr(const std::string& descr, const std::string& what, const std::string& allowed) {
  auto refuse = [&](const std::string& why) {
    return InvalidArgument(what + ": .npy header field 'descr' = '" + descr + "' " + why + "; use one of " + allowed +
                           " (e.g. np.save(path, ids.astype('<u4')))");
  };
  if (descr.size() < 3) return refuse("is not a numpy dtype");
  const char order = descr[0], kind = descr[1];
  const std::string digits = descr.substr(2);
  if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 2)
    return refuse("is not a numpy dtype");
  const uint32_t size = static_cast<uint32_t>(std::stoul(digits));
  if (order != '<' && order != '>' && order != '|' && order != '=') return refuse("has no byte order ('<', '|')");
  if (kind == 'f' || kind == 'c') return refuse("is a floating-point dtype; token ids must be integers");
  if (kind != 'u' && kind != 'i') return refuse("is not an integer dtype");
  if (size != 1 && size != 2 && size != 4 && size != 8)
    return refuse("is not an integer width Strata reads (1, 2, 4 or 8 bytes)");
  if (order == '>' && size > 1)
    return refuse(
        "is big-endian; Strata reads little-endian arrays in place (convert with a.astype(a.dtype.newbyteorder('<')))");
  return IntType{size, kind == 'i'};
}

// The data of a 1-D .npy array of `type` must fill the file exactly.
Status CheckNpyShape(const NpyHeader& h, const IntType& type, uint64_t file_size, const std::string& what) {
  std::string shape = "(";
  for (size_t i = 0; i < h.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(h.shape[i]);
  shape += h.shape.size() == 1 ? ",)" : ")";
  if (h.fortran_order) {
    return InvalidArgument(what +
                           ": .npy header field 'fortran_order' is True; Strata reads C-order arrays "
                           "(save np.ascontiguousarray(a))");
  }
  if (h.shape.size() != 1) {
    return InvalidArgument(what + ": .npy header field 'shape' = " + shape +
                           " is not 1-D; save the ids as one flat array (a.reshape(-1))");
  }
  const uint64_t n = h.shape[0];
  if (n > (file_size - h.data_offset) / type.size + 1 || n * type.size != file_size - h.data_offset) {
    return InvalidArgument(what + ": .npy header field 'shape' = " + shape + " says " + std::to_string(n) + " x " +
                           std::to_string(type.size) + " bytes of data but the file holds " +
                           std::to_string(file_size - h.data_offset) + " bytes after its " +
                           std::to_string(h.data_offset) +
                           "-byte header; the file is truncated or was not written by np.save");
  }
  return Status::Ok();
}

std::string DataWhat(const std::string& path) { return "data.path = \"" + path + "\""; }

}  // namespace

Result<NpyHeader> ParseNpyHeader(std::string_view bytes, const std::string& what) {
  auto bad = [&](const std::string& why) { return InvalidArgument(what + " is not a valid .npy file: " + why); };
  if (!IsNpy(bytes)) return bad("it does not start with the magic \\x93NUMPY");
  if (bytes.size() < 10) return bad("it ends inside its header");
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  NpyHeader h;
  h.major = p[6];
  if (p[6] < 1 || p[6] > 3 || p[7] != 0) {
    return bad("format version " + std::to_string(p[6]) + "." + std::to_string(p[7]) + " is not 1.0, 2.0 or 3.0");
  }
  const uint64_t prefix = h.major == 1 ? 10 : 12;
  if (bytes.size() < prefix) return bad("it ends inside its header");
  const uint64_t length = ReadLe(p + 8, h.major == 1 ? 2 : 4);
  if (length > kMaxNpyHeaderBytes) return bad("its header length " + std::to_string(length) + " is over 1 MiB");
  if (bytes.size() < prefix + length) {
    return bad("its header says " + std::to_string(length) + " bytes but the file ends after " +
               std::to_string(bytes.size() - prefix));
  }
  h.data_offset = prefix + length;
  std::string_view dict = bytes.substr(prefix, length);
  if (dict.empty() || dict.back() != '\n') return bad("its header does not end with a newline");
  PyLiteralParser parser(dict);
  auto parsed = parser.ParseWhole();
  if (!parsed.ok()) return bad("its header dict does not parse: " + parsed.status().message());
  const PyValue& root = *parsed;
  if (root.kind != PyValue::kDict) return bad("its header is not a dict");
  const PyValue* descr = nullptr;
  const PyValue* fortran = nullptr;
  const PyValue* shape = nullptr;
  for (size_t i = 0; i < root.keys.size(); ++i) {
    const std::string& key = root.keys[i];
    const PyValue& value = root.items[i];
    if (key == "descr")
      descr = &value;
    else if (key == "fortran_order")
      fortran = &value;
    else if (key == "shape")
      shape = &value;
    else
      return bad("its header has the key '" + key + "'; a .npy header holds only 'descr', 'fortran_order' and 'shape'");
  }
  if (!descr || !fortran || !shape) {
    return bad(std::string("its header lacks the key '") +
               (!descr     ? "descr"
                : !fortran ? "fortran_order"
                           : "shape") +
               "'");
  }
  if (descr->kind != PyValue::kString) {
    return InvalidArgument(what + ": .npy header field 'descr' = " + Render(*descr) +
                           " is a structured dtype; Strata reads plain integer arrays");
  }
  h.descr = descr->text;
  if (fortran->kind != PyValue::kBool)
    return bad("its header field 'fortran_order' = " + Render(*fortran) + " is not True or False");
  h.fortran_order = fortran->flag;
  if (shape->kind != PyValue::kTuple) return bad("its header field 'shape' = " + Render(*shape) + " is not a tuple");
  for (const PyValue& d : shape->items) {
    if (d.kind != PyValue::kInt || d.negative || d.overflow) {
      return bad("its header field 'shape' = " + Render(*shape) + " holds " + Render(d) + ", not a dimension");
    }
    h.shape.push_back(d.number);
  }
  return h;
}

bool IsTokenFormat(TokenFormat format) { return format != TokenFormat::kText; }

Result<TokenFileLayout> ReadTokenFileLayout(const std::string& path, TokenFormat format) {
  const std::string what = DataWhat(path);
  if (!IsTokenFormat(format)) {
    return InvalidArgument("data.format = \"" + std::string(Name(format)) + "\" is not supported; use " +
                           kTokenFormats);
  }
  OpenFile file;
  STRATA_RETURN_IF_ERROR(OpenRegular(path, what, &file));
  TokenFileLayout layout;
  layout.path = path;
  layout.format = format;
  layout.file_bytes = file.size;
  if (format == TokenFormat::kNpy) {
    STRATA_ASSIGN_OR_RETURN(NpyHeader h, ReadNpyHeader(file, what));
    STRATA_ASSIGN_OR_RETURN(layout.type, IntegerDescr(h.descr, what, "u1 u2 u4 u8 i1 i2 i4 i8"));
    STRATA_RETURN_IF_ERROR(CheckNpyShape(h, layout.type, file.size, what));
    layout.data_offset = h.data_offset;
    layout.tokens = h.shape[0];
    return layout;
  }
  layout.type = IntType{format == TokenFormat::kU32 ? 4u : format == TokenFormat::kU16 ? 2u : 1u, false};
  if (file.size % layout.type.size != 0) {
    return InvalidArgument(what + " holds " + std::to_string(file.size) + " bytes, not a multiple of " +
                           std::to_string(layout.type.size) + " (data.format = \"" + std::string(Name(format)) +
                           "\": " + std::to_string(layout.type.size * 8) +
                           "-bit ids); the file is truncated or has another format");
  }
  layout.tokens = file.size / layout.type.size;
  return layout;
}

Result<DocumentsLayout> ReadDocumentsLayout(const std::string& path) {
  const std::string what = "data.documents = \"" + path + "\"";
  OpenFile file;
  STRATA_RETURN_IF_ERROR(OpenRegular(path, what, &file));
  DocumentsLayout layout;
  layout.path = path;
  STRATA_ASSIGN_OR_RETURN(std::string magic, ReadPrefix(file, 6, what));
  if (IsNpy(magic)) {
    STRATA_ASSIGN_OR_RETURN(NpyHeader h, ReadNpyHeader(file, what));
    STRATA_ASSIGN_OR_RETURN(layout.type, IntegerDescr(h.descr, what, "i8 u8 (int64, uint64)"));
    if (layout.type.size != 8) {
      return InvalidArgument(what + ": .npy header field 'descr' = '" + h.descr +
                             "' is not a 64-bit integer; document offsets are int64 or uint64 (ids.astype('<i8'))");
    }
    STRATA_RETURN_IF_ERROR(CheckNpyShape(h, layout.type, file.size, what));
    layout.data_offset = h.data_offset;
    layout.count = h.shape[0];
  } else {
    if (file.size % 8 != 0) {
      return InvalidArgument(
          what + " holds " + std::to_string(file.size) +
          " bytes, not a multiple of 8; document offsets are little-endian uint64 (or a .npy of int64)");
    }
    layout.count = file.size / 8;
  }
  if (layout.count == 0)
    return InvalidArgument(what + " holds no offsets; the first document starts at 0, so it needs at least one");
  return layout;
}

}  // namespace strata
