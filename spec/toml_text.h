// A check of TOML text before toml++ parses it (every toml::parse of text from a user or a peer).
//
// toml++ 3.3.0 (Debian 12's) reaches __builtin_unreachable in is_non_ascii_horizontal_whitespace
// for most code points from U+00A1 to U+FEFE (its bit table of ranges has holes): undefined
// behaviour, found by fuzz/envelope_fuzz, that a daemon parsing a peer's spec must not run. The
// parser asks that question only of characters outside strings and comments, where TOML 1.0
// admits no non-ASCII character anyway, and of the whitespace a line-ending backslash trims in a
// multi-line basic string. So such a character there is refused here, naming its line and column;
// nothing valid is lost.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace strata {

// InvalidArgument "<what>: line L, column C: ..." for a non-ASCII character outside a string or a
// comment (or after a line-ending backslash's trimmed whitespace); OK otherwise (the parse then
// reports every other error).
Status CheckTomlText(std::string_view text, const std::string& what);

}  // namespace strata
