// The pre-tokenizer regexes of tokenizer.json files, run with PCRE2 (private to tokenizer/).
//
// Hugging Face `tokenizers` runs them with Oniguruma (Ruby syntax). PCRE2 in UTF + UCP mode reads
// the patterns these files use the same way (\p{L}, \p{N}, (?i:...), (?!\S)), except that PCRE2's
// \s adds U+180E to Unicode's White_Space and \h means horizontal space where Oniguruma means a hex
// digit: Compile rewrites both to Oniguruma's classes, and sets MULTILINE (Ruby's ^ and $ match at
// line ends).
//
// Partial matching is what makes streaming exact: with partial=true a match that reached the end
// of the subject (a run of letters that the next block may continue, a lookahead that needs the
// next character) comes back as kPartial instead of a match, so the caller keeps that text until
// more arrives.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;
struct pcre2_real_match_context_8;
struct pcre2_real_jit_stack_8;

namespace strata::tokenizer {

// What one thread needs to run any Regex: match data and a JIT stack. Not thread-safe.
class RegexScratch {
 public:
  RegexScratch();
  ~RegexScratch();
  RegexScratch(const RegexScratch&) = delete;
  RegexScratch& operator=(const RegexScratch&) = delete;

 private:
  friend class Regex;
  pcre2_real_match_data_8* match_data_;
  pcre2_real_match_context_8* match_context_;
  pcre2_real_jit_stack_8* jit_stack_;
};

class Regex {
 public:
  enum class Outcome { kMatch, kNoMatch, kPartial };

  // InvalidArgument with PCRE2's message and the offset in the pattern when it does not compile.
  static Result<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  // `pattern` as a literal string (tokenizer.json's {"String": "..."} split patterns).
  static Result<std::unique_ptr<Regex>> CompileLiteral(std::string_view literal);
  ~Regex();

  // The first match in subject[offset, ...): its [*start, *end). kPartial (only when partial is
  // true) when a match attempt reached the end of `subject`; *start is then where it began.
  // REQUIRES `subject` is valid UTF-8 and `offset` is at a character boundary.
  Outcome Find(std::string_view subject, size_t offset, bool partial, RegexScratch& scratch, size_t* start,
               size_t* end) const;

 private:
  explicit Regex(pcre2_real_code_8* code) : code_(code) {}
  pcre2_real_code_8* code_;
};

// The pattern with \s, \S, \h and \H written as the classes Oniguruma gives them (see above).
std::string RewriteOnigurumaClasses(std::string_view pattern);

}  // namespace strata::tokenizer
