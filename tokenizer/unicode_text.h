// UTF-8 and Unicode helpers of the tokenizers (private to tokenizer/): decoding, repairing
// ill-formed input, the character classes Hugging Face's added tokens use, NFC through ICU, and
// GPT-2's byte-to-character alphabet.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::tokenizer {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// The length of the well-formed UTF-8 sequence at text[i], or 0 if it is ill-formed (or cut off by
// the end of `text`).
size_t Utf8SequenceLength(std::string_view text, size_t i);
// Decodes the well-formed sequence at text[i] (REQUIRES Utf8SequenceLength(text, i) > 0).
char32_t DecodeUtf8At(std::string_view text, size_t i, size_t* length);
// The start of the character that ends at text.size() (REQUIRES valid UTF-8, non-empty).
size_t StartOfLastChar(std::string_view text);
void AppendUtf8(char32_t c, std::string* out);

// `text` with each ill-formed sequence replaced by U+FFFD: one per maximal subpart (Unicode's
// recommended practice, which Python's decode(errors="replace") follows).
std::string ReplaceIllFormedUtf8(std::string_view text);

// Unicode White_Space (Rust's char::is_whitespace, Oniguruma's \s).
bool IsUnicodeWhitespace(char32_t c);
// Rust regex's \w (UTS #18): Alphabetic, marks, decimal digits, connector punctuation, join controls.
bool IsUnicodeWordChar(char32_t c);

// Unicode NFC, as Hugging Face's NFC normalizer applies it. Thread-safe.
class NfcNormalizer {
 public:
  NfcNormalizer();  // aborts if ICU has no NFC data (a broken ICU install)
  // Appends NFC(text) to *out. REQUIRES valid UTF-8.
  void AppendNormalized(std::string_view text, std::string* out) const;
  // The largest i such that text[0, i) and text[i, ...) normalize independently whatever follows
  // `text` (a character with a normalization boundary before it); 0 if none.
  size_t LastBoundary(std::string_view text) const;

 private:
  const void* normalizer_;  // icu::Normalizer2 (ICU's own singleton); void keeps ICU out of this header
};

// GPT-2's byte-level alphabet: each byte is shown as one printable character (bytes that are
// printable Latin-1 as themselves, the others as U+0100 onwards), so that a BPE vocabulary is
// text. ByteToChar()[b] is the character of byte b; CharToByte(c) is -1 for a character that is
// not in the alphabet.
const std::array<char32_t, 256>& ByteToChar();
int CharToByte(char32_t c);

}  // namespace strata::tokenizer
