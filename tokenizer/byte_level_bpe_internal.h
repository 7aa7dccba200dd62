// ByteLevelBpeTokenizer with the BPE model and pre-tokenizer stages that the tokenizer.json loader
// fills (internal to tokenizer/: nothing outside it includes this header; byte_level_bpe.h stays the
// interface). WordCache is here only because the tokenizer holds one. The definitions:
//   byte_level_bpe.cc         encoding: BPE merges, pre-tokenizing, the stream (and why the pipeline is so)
//   byte_level_bpe_loader.cc  reading a Hugging Face tokenizer.json into these structs
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/thread_annotations.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/flat_map.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_text.h"

namespace strata::tokenizer::internal {

// ---------------------------------------------------------------------------------------------
// The BPE model
// ---------------------------------------------------------------------------------------------

struct MergeRule {
  uint32_t rank = 0;
  uint32_t new_id = 0;
};

// The first symbol(s) of one byte of a word (tokenizers' BPE::merge_word, per character of the
// byte-level string).
struct ByteSymbol {
  enum Kind : uint8_t { kToken, kByteFallback, kUnknown, kDropped };
  Kind kind = kDropped;
  uint8_t count = 0;
  uint32_t ids[2] = {0, 0};  // kToken: ids[0]; kByteFallback: the <0xXX> tokens of the character's UTF-8
};

struct BpeScratch;  // MergeWord's working memory (byte_level_bpe.cc)

struct BpeModel {
  FlatStringMap<uint32_t> vocab;  // the bytes a token stands for -> id
  FlatPairMap<MergeRule> merges;  // (left id, right id) -> rank and merged id
  std::array<ByteSymbol, 256> byte_symbols;
  std::optional<uint32_t> unk_id;
  bool fuse_unk = false;
  bool ignore_merges = false;

  const MergeRule* FindMerge(uint32_t left, uint32_t right) const { return merges.Find(left, right); }

  // The ids of one word (without the cache), appended to *out.
  void MergeWord(std::string_view word, BpeScratch& scratch, std::vector<uint32_t>* out) const;
};

// The ids of words seen before. When full it starts over, so that a corpus whose vocabulary
// drifts (one language, then another) keeps a useful cache. Not thread-safe.
class WordCache {
 public:
  bool Lookup(std::string_view word, std::vector<uint32_t>* out) const {
    const Span* span = words_.Find(word);
    if (span == nullptr) return false;
    out->insert(out->end(), ids_.begin() + span->offset, ids_.begin() + span->offset + span->count);
    return true;
  }
  void Insert(std::string_view word, const std::vector<uint32_t>& ids) {
    if (word.size() > kMaxWordBytes) return;
    if (words_.size() >= kMaxWords) {
      words_.Clear();
      ids_.clear();
    }
    words_.Insert(word, {static_cast<uint32_t>(ids_.size()), static_cast<uint32_t>(ids.size())});
    ids_.insert(ids_.end(), ids.begin(), ids.end());
  }

 private:
  static constexpr size_t kMaxWords = 1 << 18;  // ~25 MB
  static constexpr size_t kMaxWordBytes = 256;  // longer "words" (base64, long runs) rarely repeat
  struct Span {
    uint32_t offset, count;  // in ids_
  };
  FlatStringMap<Span> words_;
  std::vector<uint32_t> ids_;
};

// ---------------------------------------------------------------------------------------------
// Pre-tokenizer
// ---------------------------------------------------------------------------------------------

// tokenizers' SplitDelimiterBehavior: what becomes of a regex match and the text around it.
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizerStage {
  std::unique_ptr<Regex> regex;  // null: this stage does not split (ByteLevel with use_regex false)
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;            // split on what the regex does not match
  bool add_prefix_space = false;  // ByteLevel: a piece not starting with ' ' gets one
  bool byte_level = false;        // the ByteLevel pre-tokenizer (its regex is GPT-2's)
  std::string field;              // where it is in the file, for messages
};

// ---------------------------------------------------------------------------------------------
// The tokenizer
// ---------------------------------------------------------------------------------------------

class ByteLevelBpeTokenizer final : public Tokenizer {
 public:
  std::vector<uint32_t> Encode(std::string_view text) const override;
  std::string Decode(const std::vector<uint32_t>& ids) const override;
  std::unique_ptr<EncodeStream> NewStream() const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::string description() const override { return description_; }

  // Set by the loader.
  BpeModel model_;
  std::vector<PreTokenizerStage> stages_;
  std::optional<NfcNormalizer> nfc_;
  std::unique_ptr<AddedTokenMatcher> raw_tokens_;         // "normalized": false: found in the text as given
  std::unique_ptr<AddedTokenMatcher> normalized_tokens_;  // "normalized": true: found in the normalized text
  std::vector<std::string> id_to_token_;
  int64_t vocab_size_ = 0;
  std::string description_;

 private:
  mutable Mutex cache_mutex_;
  mutable WordCache cache_ STRATA_GUARDED_BY(cache_mutex_);
};

}  // namespace strata::tokenizer::internal
