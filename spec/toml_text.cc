#include "spec/toml_text.h"

#include <cctype>
#include <cstdio>

namespace strata {

Status CheckTomlText(std::string_view text, const std::string& what) {
  enum class In { kCode, kComment, kBasic, kLiteral, kMultiBasic, kMultiLiteral };
  In in = In::kCode;
  bool trimming = false;  // in a multi-line basic string, after a line-ending backslash
  size_t line = 1, line_start = 0;
  auto refuse = [&](size_t i) {
    // The code point, decoded leniently (toml++ reports malformed UTF-8 itself).
    const auto byte = [&](size_t k) { return k < text.size() ? static_cast<unsigned char>(text[k]) & 0x3Fu : 0u; };
    const unsigned char b0 = static_cast<unsigned char>(text[i]);
    unsigned cp = b0;
    if (b0 >= 0xF0) {
      cp = ((b0 & 0x07u) << 18) | (byte(i + 1) << 12) | (byte(i + 2) << 6) | byte(i + 3);
    } else if (b0 >= 0xE0) {
      cp = ((b0 & 0x0Fu) << 12) | (byte(i + 1) << 6) | byte(i + 2);
    } else if (b0 >= 0xC0) {
      cp = ((b0 & 0x1Fu) << 6) | byte(i + 1);
    }
    char code[16];
    std::snprintf(code, sizeof code, "U+%04X", cp);
    return InvalidArgument(what + ": line " + std::to_string(line) + ", column " + std::to_string(i - line_start + 1) +
                           ": " + code +
                           " outside a string or comment; TOML takes non-ASCII characters only inside quotes "
                           "or after #");
  };
  auto starts = [&](size_t i, std::string_view s) { return text.substr(i, s.size()) == s; };
  // A quote right after a bare token's character (`0t2"...`) starts no string for toml++: it reads
  // on to the value's end, asking of every character whether it ends the value.
  auto in_bare_token = [&](size_t i) {
    if (i == 0) return false;
    const unsigned char p = static_cast<unsigned char>(text[i - 1]);
    return std::isalnum(p) || p == '_' || p == '-' || p == '+' || p == '.' || p == ':' || p == '"' || p == '\'';
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      ++line, line_start = i + 1;
      if (in == In::kComment || in == In::kBasic || in == In::kLiteral)
        in = In::kCode;  // (an open string: the parser's error)
      continue;
    }
    switch (in) {
      case In::kCode:
        if (c == '#') {
          in = In::kComment;
        } else if ((c == '"' || c == '\'') && in_bare_token(i)) {
          break;  // part of the token (the parse's error)
        } else if (starts(i, "\"\"\"")) {
          in = In::kMultiBasic, i += 2;
        } else if (starts(i, "'''")) {
          in = In::kMultiLiteral, i += 2;
        } else if (c == '"') {
          in = In::kBasic;
        } else if (c == '\'') {
          in = In::kLiteral;
        } else if (c >= 0x80) {
          return refuse(i);
        }
        break;
      case In::kComment:
        break;
      case In::kBasic:
        if (c == '\\') {
          ++i;  // the escaped character
        } else if (c == '"') {
          in = In::kCode;
        }
        break;
      case In::kLiteral:
        if (c == '\'') in = In::kCode;
        break;
      case In::kMultiBasic:
        if (trimming) {
          if (c == ' ' || c == '\t' || c == '\r') break;
          if (c >= 0x80) return refuse(i);
          trimming = false;
        }
        if (c == '\\') {
          size_t j = i + 1;
          while (j < text.size() && (text[j] == ' ' || text[j] == '\t' || text[j] == '\r')) ++j;
          if (j < text.size() && text[j] == '\n') {
            trimming = true;  // up to the next non-whitespace character, across lines
            i = j - 1;
          } else {
            ++i;  // an escape
          }
        } else if (starts(i, "\"\"\"")) {
          in = In::kCode, i += 2;
        }
        break;
      case In::kMultiLiteral:
        if (starts(i, "'''")) in = In::kCode, i += 2;
        break;
    }
  }
  return Status::Ok();
}

}  // namespace strata
