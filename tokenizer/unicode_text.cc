#include "tokenizer/unicode_text.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>
#include <unicode/uchar.h>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace strata::tokenizer {

namespace {

// Well-formed UTF-8 (Unicode table 3-7): the sequence length a lead byte starts, and the range of
// the second byte after it (overlong forms, surrogates and code points above U+10FFFF are
// ill-formed); length 0 for a byte that starts no sequence.
struct LeadByte {
  size_t length = 0;
  unsigned char lo = 0x80, hi = 0xBF;
};

LeadByte ClassifyLeadByte(unsigned char b0) {
  LeadByte lead;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    lead.length = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    lead.length = 3;
    if (b0 == 0xE0) lead.lo = 0xA0;
    if (b0 == 0xED) lead.hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    lead.length = 4;
    if (b0 == 0xF0) lead.lo = 0x90;
    if (b0 == 0xF4) lead.hi = 0x8F;
  }
  return lead;
}

}  // namespace

// Well-formed UTF-8 (Unicode table 3-7): the second byte's range depends on the first byte, so
// that overlong forms, surrogates and code points above U+10FFFF are ill-formed.
size_t Utf8SequenceLength(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) return 1;
  const LeadByte lead = ClassifyLeadByte(b0);
  const size_t length = lead.length;
  const unsigned char lo = lead.lo, hi = lead.hi;
  if (length == 0) return 0;
  if (i + length > text.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < length; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return length;
}

char32_t DecodeUtf8At(std::string_view text, size_t i, size_t* length) {
  const auto byte = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(text[k])); };
  const char32_t b0 = byte(i);
  if (b0 < 0x80) {
    *length = 1;
    return b0;
  }
  if (b0 < 0xE0) {
    *length = 2;
    return ((b0 & 0x1F) << 6) | (byte(i + 1) & 0x3F);
  }
  if (b0 < 0xF0) {
    *length = 3;
    return ((b0 & 0x0F) << 12) | ((byte(i + 1) & 0x3F) << 6) | (byte(i + 2) & 0x3F);
  }
  *length = 4;
  return ((b0 & 0x07) << 18) | ((byte(i + 1) & 0x3F) << 12) | ((byte(i + 2) & 0x3F) << 6) | (byte(i + 3) & 0x3F);
}

size_t StartOfLastChar(std::string_view text) {
  size_t i = text.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) --i;
  return i;
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

namespace {

// The length of the maximal subpart of an ill-formed sequence at text[i]: the longest prefix of a
// well-formed sequence that is there (at least one byte). Each becomes one U+FFFD.
size_t MaximalSubpart(std::string_view text, size_t i) {
  const unsigned char b0 = static_cast<unsigned char>(text[i]);
  const LeadByte lead = ClassifyLeadByte(b0);
  const size_t length = lead.length;
  const unsigned char lo = lead.lo, hi = lead.hi;
  if (length == 0) return 1;
  size_t k = 1;
  for (; k < length && i + k < text.size(); ++k) {
    const unsigned char b = static_cast<unsigned char>(text[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) break;
  }
  return k;
}

}  // namespace

bool IsValidUtf8(std::string_view text, size_t* bad_offset) {
  size_t i = 0;
  while (i < text.size()) {
    // ASCII eight bytes at a time: most text is mostly ASCII.
    while (i + 8 <= text.size()) {
      uint64_t word;
      __builtin_memcpy(&word, text.data() + i, 8);
      if (word & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= text.size()) break;
    const size_t n = Utf8SequenceLength(text, i);
    if (n == 0) {
      if (bad_offset) *bad_offset = i;
      return false;
    }
    i += n;
  }
  return true;
}

std::string ReplaceIllFormedUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 16);
  size_t i = 0;
  while (i < text.size()) {
    const size_t n = Utf8SequenceLength(text, i);
    if (n > 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      AppendUtf8(kReplacementChar, &out);
      i += MaximalSubpart(text, i);
    }
  }
  return out;
}

size_t IncompleteUtf8Suffix(std::string_view text) {
  // A lead byte within the last 3 bytes whose sequence needs more bytes than are there, with only
  // valid continuation bytes after it.
  const size_t n = text.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char b = static_cast<unsigned char>(text[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    if (b < 0xC2 || b > 0xF4) return 0;
    const size_t need = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
    return need > back && MaximalSubpart(text, n - back) == back ? back : 0;
  }
  return 0;
}

bool IsUnicodeWhitespace(char32_t c) {
  switch (c) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool IsUnicodeWordChar(char32_t c) {
  const UChar32 u = static_cast<UChar32>(c);
  if (u_hasBinaryProperty(u, UCHAR_ALPHABETIC) || u_hasBinaryProperty(u, UCHAR_JOIN_CONTROL)) return true;
  return (U_GET_GC_MASK(u) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

NfcNormalizer::NfcNormalizer() {
  UErrorCode error = U_ZERO_ERROR;
  normalizer_ = icu::Normalizer2::getNFCInstance(error);
  STRATA_CHECK(U_SUCCESS(error) && normalizer_ != nullptr);
}

void NfcNormalizer::AppendNormalized(std::string_view text, std::string* out) const {
  // Below U+0300 every character is NFC and composes with nothing before it, so text whose bytes
  // are all below 0xCC (the lead byte of U+0300) is its own NFC: the common case, without ICU.
  bool simple = true;
  for (char ch : text) {
    if (static_cast<unsigned char>(ch) >= 0xCC) {
      simple = false;
      break;
    }
  }
  const auto* nfc = static_cast<const icu::Normalizer2*>(normalizer_);
  UErrorCode error = U_ZERO_ERROR;
  const icu::StringPiece piece(text.data(), static_cast<int32_t>(text.size()));
  if (simple || nfc->isNormalizedUTF8(piece, error)) {
    out->append(text);
    return;
  }
  error = U_ZERO_ERROR;
  icu::StringByteSink<std::string> sink(out);
  nfc->normalizeUTF8(0, piece, sink, nullptr, error);
  STRATA_CHECK(U_SUCCESS(error));
}

size_t NfcNormalizer::LastBoundary(std::string_view text) const {
  const auto* nfc = static_cast<const icu::Normalizer2*>(normalizer_);
  size_t end = text.size();
  while (end > 0) {
    const size_t start = StartOfLastChar(text.substr(0, end));
    size_t length = 0;
    const char32_t c = DecodeUtf8At(text, start, &length);
    if (nfc->hasBoundaryBefore(static_cast<UChar32>(c))) return start;
    end = start;
  }
  return 0;
}

namespace {

struct ByteLevelAlphabet {
  std::array<char32_t, 256> byte_to_char{};
  std::array<int16_t, 324> char_to_byte{};  // every character of the alphabet is below U+0144

  ByteLevelAlphabet() {
    char_to_byte.fill(-1);
    const auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      byte_to_char[b] = printable(b) ? static_cast<char32_t>(b) : next++;
      char_to_byte[byte_to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelAlphabet& Alphabet() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

}  // namespace

const std::array<char32_t, 256>& ByteToChar() { return Alphabet().byte_to_char; }

int CharToByte(char32_t c) { return c < Alphabet().char_to_byte.size() ? Alphabet().char_to_byte[c] : -1; }

}  // namespace strata::tokenizer
