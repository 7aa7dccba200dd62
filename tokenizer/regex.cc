#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>

namespace strata::tokenizer {
namespace {

// Unicode White_Space, as Oniguruma's \s (PCRE2's UCP \s also has U+180E, which is not).
constexpr const char* kWhiteSpaceRanges =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
constexpr const char* kHexDigitRanges = "0-9a-fA-F";

std::string PcreErrorText(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) return "PCRE2 error " + std::to_string(code);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

std::string RewriteOnigurumaClasses(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  size_t class_start = 0;  // index in `pattern` just after the '[' (and a '^') that opened the class
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      ++i;
      const char* ranges = (e == 's' || e == 'S')   ? kWhiteSpaceRanges
                           : (e == 'h' || e == 'H') ? kHexDigitRanges
                                                    : nullptr;
      const bool negated = e == 'S' || e == 'H';
      if (ranges == nullptr || (in_class && negated)) {  // a negated class inside a class stays as written
        out += '\\';
        out += e;
      } else if (in_class) {
        out += ranges;
      } else {
        out += negated ? "[^" : "[";
        out += ranges;
        out += ']';
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      class_start = i + 1;
      if (class_start < pattern.size() && pattern[class_start] == '^') ++class_start;
    } else if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      // A POSIX class ([:alpha:]) inside a class: copy it whole so its ']' does not close ours.
      const size_t close = pattern.find(":]", i + 2);
      if (close != std::string_view::npos) {
        out.append(pattern.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
    } else if (in_class && c == ']' && i != class_start) {  // a ']' first in a class is a literal
      in_class = false;
    }
    out += c;
  }
  return out;
}

RegexScratch::RegexScratch() {
  match_data_ = pcre2_match_data_create(16, nullptr);
  match_context_ = pcre2_match_context_create(nullptr);
  // Runs of letters or spaces need no stack; a megabyte covers any backtracking these patterns do.
  jit_stack_ = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, nullptr);
  if (jit_stack_ != nullptr) pcre2_jit_stack_assign(match_context_, nullptr, jit_stack_);
}

RegexScratch::~RegexScratch() {
  pcre2_jit_stack_free(jit_stack_);
  pcre2_match_context_free(match_context_);
  pcre2_match_data_free(match_data_);
}

Result<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  const std::string rewritten = RewriteOnigurumaClasses(pattern);
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &error_offset, nullptr);
  if (code == nullptr) {
    return InvalidArgument("the regex does not compile (" + PcreErrorText(error) + " at offset " +
                           std::to_string(error_offset) + " of the pattern as PCRE2 reads it: " + rewritten + ")");
  }
  // Without JIT (an unusual PCRE2 build) pcre2_match interprets the pattern: slower, same answers.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE | PCRE2_JIT_PARTIAL_HARD);
  return std::unique_ptr<Regex>(new Regex(code));
}

Result<std::unique_ptr<Regex>> Regex::CompileLiteral(std::string_view literal) {
  std::string quoted;
  for (const char c : literal) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) quoted += '\\';  // PCRE2: any escaped non-alphanumeric is itself
    quoted += c;
  }
  return Compile(quoted);
}

Regex::~Regex() { pcre2_code_free(code_); }

Regex::Outcome Regex::Find(std::string_view subject, size_t offset, bool partial, RegexScratch& scratch, size_t* start,
                           size_t* end) const {
  const uint32_t options = PCRE2_NO_UTF_CHECK | (partial ? PCRE2_PARTIAL_HARD : 0);
  int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), offset, options,
                       scratch.match_data_, scratch.match_context_);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
    // A pathological pattern: the interpreter keeps its backtracking on the heap.
    rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), offset,
                     options | PCRE2_NO_JIT, scratch.match_data_, scratch.match_context_);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return Outcome::kNoMatch;
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.match_data_);
  if (rc == PCRE2_ERROR_PARTIAL) {
    *start = ovector[0];
    *end = subject.size();
    return Outcome::kPartial;
  }
  if (rc < 0) {
    // Out of PCRE2's match or heap limits: leave the rest of the subject unmatched (one piece),
    // which is what a tokenizer can do without failing the whole text.
    return Outcome::kNoMatch;
  }
  *start = ovector[0];
  *end = ovector[1];
  return Outcome::kMatch;
}

}  // namespace strata::tokenizer
