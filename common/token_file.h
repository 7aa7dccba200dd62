// Token files ([data] path, format and documents; docs/run-spec.md): where the ids lie in a file,
// how wide each is and how many there are. Reads the file's size and, for .npy, its header; never
// the ids themselves (worker/token_data.h maps and checks those). The submit-time check
// (ParseRunSpec), the coordinator (an extract run's row count) and the workers all count tokens
// through here, so they agree on every format.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "spec/spec_choices.h"  // TokenFormat

namespace strata {

// A parsed .npy header (format versions 1.0, 2.0 and 3.0: magic "\x93NUMPY", major, minor, a
// little-endian u16 (1.0) or u32 (2.0, 3.0) header length, then a Python dict literal with exactly
// the keys 'descr', 'fortran_order' and 'shape', padded with spaces and ended by '\n').
struct NpyHeader {
  int major = 1;
  std::string descr;  // e.g. "<u4"; a structured (list) descr is refused by the parser
  bool fortran_order = false;
  std::vector<uint64_t> shape;
  uint64_t data_offset = 0;  // bytes before the array's first element
};

// Parses the header at the start of `bytes` (at least the whole header; more is ignored).
// `what` names the file in messages, e.g. `data.path = "/d/tokens.npy"`; an error names the
// header field at fault.
Result<NpyHeader> ParseNpyHeader(std::string_view bytes, const std::string& what);

// The integer element type of a token or offsets file.
struct IntType {
  uint32_t size = 1;  // bytes: 1, 2, 4 or 8
  bool is_signed = false;
  std::string name() const { return (is_signed ? "i" : "u") + std::to_string(size); }
};

struct TokenFileLayout {
  std::string path;
  TokenFormat format = TokenFormat::kBytes;  // data.format
  uint64_t file_bytes = 0;
  uint64_t data_offset = 0;  // bytes before the first id (a .npy header)
  IntType type;
  uint64_t tokens = 0;
};

// The data.format values a file holds (every one but "text", which `strata submit` tokenizes
// into a u32 file), and the words a message lists them with.
bool IsTokenFormat(TokenFormat format);
inline constexpr const char* kTokenFormats = "\"bytes\", \"u16\", \"u32\" or \"npy\"";

// The layout of `path` read as `format` (kText is refused as not supported):
//   "bytes"  each byte is a token (any size)
//   "u16"    little-endian uint16 ids; the size must be a multiple of 2
//   "u32"    little-endian uint32 ids; the size must be a multiple of 4
//   "npy"    a 1-D, C-order .npy array of a little-endian integer dtype (u1 u2 u4 u8 i1 i2 i4 i8)
//            whose data is exactly shape[0] elements
// InvalidArgument names the file as `data.path = "PATH"` and what is wrong (the size, the header
// field); NotFound when it cannot be opened.
Result<TokenFileLayout> ReadTokenFileLayout(const std::string& path, TokenFormat format);

// A document offsets file (data.documents): little-endian uint64 start offsets, or a 1-D .npy of
// int64 / uint64 (chosen by the .npy magic, not the file name). Only the size and header are
// checked here; the values (0 first, ascending, within the token count) when a worker loads it.
struct DocumentsLayout {
  std::string path;
  uint64_t data_offset = 0;
  IntType type{8, false};
  uint64_t count = 0;
};
Result<DocumentsLayout> ReadDocumentsLayout(const std::string& path);

}  // namespace strata
