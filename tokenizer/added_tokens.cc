#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/unicode_text.h"

namespace strata::tokenizer {
namespace {

// The character that ends text[0, end) (0 at the start): text is valid UTF-8.
char32_t CharBefore(std::string_view text, size_t end, char32_t char_before_text) {
  if (end == 0) return char_before_text;
  const size_t start = StartOfLastChar(text.substr(0, end));
  size_t length = 0;
  return DecodeUtf8At(text, start, &length);
}

size_t WhitespaceRunEndingAt(std::string_view text, size_t end) {
  size_t start = end;
  while (start > 0) {
    const size_t c_start = StartOfLastChar(text.substr(0, start));
    size_t length = 0;
    if (!IsUnicodeWhitespace(DecodeUtf8At(text, c_start, &length))) break;
    start = c_start;
  }
  return start;
}

size_t WhitespaceRunStartingAt(std::string_view text, size_t start) {
  size_t end = start;
  while (end < text.size()) {
    size_t length = 0;
    if (!IsUnicodeWhitespace(DecodeUtf8At(text, end, &length))) break;
    end += length;
  }
  return end;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedTokenSpec> tokens) : tokens_(std::move(tokens)) {
  nodes_.emplace_back();
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& content = tokens_[t].content;
    if (content.empty()) continue;  // `tokenizers` ignores empty added tokens
    int32_t node = 0;
    for (const char ch : content) {
      const unsigned char byte = static_cast<unsigned char>(ch);
      int32_t next = Child(node, byte);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
        auto& children = nodes_[node].children;
        children.insert(std::upper_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1})),
                        {byte, next});
      }
      node = next;
    }
    nodes_[node].token = static_cast<int32_t>(t);  // a repeated content: the later token wins, as in `tokenizers`
    first_byte_[static_cast<unsigned char>(content[0])] = true;
    longest_ = std::max(longest_, content.size());
    any_lstrip_ = any_lstrip_ || tokens_[t].lstrip;
  }
}

int32_t AddedTokenMatcher::Child(int32_t node, unsigned char byte) const {
  for (const auto& [b, child] : nodes_[node].children) {
    if (b == byte) return child;
    if (b > byte) break;
  }
  return -1;
}

int32_t AddedTokenMatcher::LongestAt(std::string_view text, size_t i, size_t* end) const {
  int32_t node = 0, best = -1;
  for (size_t k = i; k < text.size(); ++k) {
    node = Child(node, static_cast<unsigned char>(text[k]));
    if (node < 0) break;
    if (nodes_[node].token >= 0) {
      best = nodes_[node].token;
      *end = k + 1;
    }
  }
  return best;
}

size_t AddedTokenMatcher::PartialTokenStart(std::string_view text) const {
  const size_t from = text.size() >= longest_ ? text.size() - longest_ + 1 : 0;
  for (size_t i = from; i < text.size(); ++i) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) continue;
    int32_t node = 0;
    size_t k = i;
    for (; k < text.size(); ++k) {
      node = Child(node, static_cast<unsigned char>(text[k]));
      if (node < 0) break;
    }
    if (k == text.size() && !nodes_[node].children.empty()) return i;
  }
  return text.size();
}

size_t AddedTokenMatcher::Split(std::string_view text, bool final, char32_t char_before,
                                std::vector<TextPiece>* pieces) const {
  const size_t n = text.size();
  if (tokens_.empty() || longest_ == 0) {
    if (n > 0) pieces->push_back({0, n, false, 0});
    return n;
  }
  // Matches may start only before `hold`: from there on, more text could make a token.
  size_t hold = n;
  if (!final) {
    hold = PartialTokenStart(text);
    // An lstrip token that comes next takes the whitespace before it.
    if (any_lstrip_) hold = WhitespaceRunEndingAt(text, hold);
  }
  size_t piece_start = 0;  // where the current text piece began (`start_offset` in `tokenizers`)
  size_t pos = 0;          // where the search for the next match resumes
  size_t consumed = hold;
  while (pos < hold) {
    size_t start = pos, end = 0;
    int32_t t = -1;
    for (; start < hold; ++start) {
      if (!first_byte_[static_cast<unsigned char>(text[start])]) continue;
      t = LongestAt(text, start, &end);
      if (t >= 0) break;
    }
    if (t < 0) break;
    const AddedTokenSpec& token = tokens_[t];
    const size_t match_end = end;
    if (token.single_word) {
      if (end == n && !final) {  // whether a word character follows is not known yet
        consumed = piece_start;
        break;
      }
      size_t length = 0;
      const bool word_before =
          IsUnicodeWordChar(CharBefore(text, start, char_before)) && (start > 0 || char_before != 0);
      const bool word_after = end < n && IsUnicodeWordChar(DecodeUtf8At(text, end, &length));
      if (word_before || word_after) {  // not a word of its own: skipped, the search goes on after it
        pos = match_end;
        continue;
      }
    }
    if (token.lstrip) start = std::max(WhitespaceRunEndingAt(text, start), piece_start);
    if (token.rstrip) {
      end = WhitespaceRunStartingAt(text, end);
      if (end == n && !final) {  // the whitespace may go on
        consumed = piece_start;
        break;
      }
    }
    if (start < piece_start) {  // would overlap the previous token (a token made of whitespace)
      pos = match_end;
      continue;
    }
    if (piece_start < start) pieces->push_back({piece_start, start, false, 0});
    pieces->push_back({start, end, true, token.id});
    piece_start = end;
    pos = std::max(match_end, end);
    consumed = std::max(hold, piece_start);
  }
  if (piece_start < consumed) pieces->push_back({piece_start, consumed, false, 0});
  return consumed;
}

}  // namespace strata::tokenizer
