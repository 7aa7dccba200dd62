// Finding a tokenizer.json's added tokens (<|endoftext|>, <|begin_of_text|>, <tool_call>) in text,
// as Hugging Face's AddedVocabulary::find_matches does before anything else touches the text:
// leftmost-longest matches of the literal contents (special tokens included: `tokenizers` matches
// them unless encode_special_tokens is set), with each token's single_word / lstrip / rstrip.
// Private to tokenizer/.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata::tokenizer {

struct AddedTokenSpec {
  std::string content;
  uint32_t id = 0;
  bool single_word = false;  // only where no word character touches it on either side
  bool lstrip = false;       // takes the whitespace before it
  bool rstrip = false;       // takes the whitespace after it
};

// A piece of the text: an added token, or text between added tokens.
struct TextPiece {
  size_t start = 0, end = 0;
  bool is_token = false;
  uint32_t id = 0;  // the token's id when is_token
};

// Immutable after construction; thread-safe.
class AddedTokenMatcher {
 public:
  explicit AddedTokenMatcher(std::vector<AddedTokenSpec> tokens);
  bool empty() const { return tokens_.empty(); }

  // Splits text[0, returned) into pieces (appended to *pieces, in order, covering it). When
  // `final` is false the text may continue: it stops before anything that more text could turn
  // into a token or a different one (the start of a partial token; with lstrip tokens, the
  // whitespace before it or at the end; a token whose rstrip / single_word needs the next
  // character), and a text piece at
  // the end stays open (it continues in the next call). `char_before` is the character before
  // text[0] in the same split (0: none), which single_word looks at.
  size_t Split(std::string_view text, bool final, char32_t char_before, std::vector<TextPiece>* pieces) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    int32_t token = -1;                                       // index into tokens_ when a token ends here
  };
  int32_t Child(int32_t node, unsigned char byte) const;
  // The longest token starting at text[i]: its index, and its end in *end; -1 if none.
  int32_t LongestAt(std::string_view text, size_t i, size_t* end) const;
  // The earliest i such that text[i, ...) could still grow into a (longer) token.
  size_t PartialTokenStart(std::string_view text) const;

  std::vector<AddedTokenSpec> tokens_;
  std::vector<Node> nodes_;  // a byte trie of the contents; nodes_[0] is the root
  bool first_byte_[256] = {};
  size_t longest_ = 0;
  bool any_lstrip_ = false;
};

}  // namespace strata::tokenizer
