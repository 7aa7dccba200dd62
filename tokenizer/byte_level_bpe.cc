// Byte-level BPE as Hugging Face `tokenizers` runs a tokenizer.json (GPT-2, Llama 3, Qwen2).
//
// The pipeline, in the order it touches the text (that of tokenizers' Tokenizer::encode):
//  1. Added tokens: literal strings (<|endoftext|>) cut out first and kept whole, leftmost-longest.
//     Tokens marked "normalized": false are found in the text as given, the others in the
//     normalized text (step 2) (AddedTokenMatcher).
//  2. Normalizer: none or NFC (ICU), applied to each piece between added tokens.
//  3. Pre-tokenizer: regexes (Split) cut each piece into words; GPT-2's ByteLevel pre-tokenizer is
//     a Split with GPT-2's own regex. A word never merges with its neighbours.
//  4. Byte-level alphabet: every byte of a word is written as one printable character (GPT-2's
//     bytes_to_unicode: 'Ġ' is the space byte), because the vocabulary and the merges are text.
//     This file does the inverse once, at load: the vocabulary is keyed by the bytes a token
//     stands for, so words are looked up as the bytes they are, never re-encoded.
//  5. BPE: a word starts as one symbol per byte; repeatedly the adjacent pair with the lowest merge
//     rank (leftmost on ties) is replaced by the token of the pair, until no adjacent pair has a
//     merge (tokenizers' Word::merge_all: a heap of (rank, position), entries checked for staleness
//     when popped). With ignore_merges (Llama 3) a word that is itself in the vocabulary is one
//     token. Words repeat (Zipf), so their ids are cached: after warm-up most words cost one hash
//     lookup.
//
// Streaming: each step holds back what text still to come could change (half of an added token,
// characters that may combine with the next one under NFC, a regex match that reached the end of
// what has arrived: PCRE2's partial matching says so), and passes on the rest; the ids are those
// of the whole text, whatever the blocks.
#include "tokenizer/byte_level_bpe.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "tokenizer/added_tokens.h"
#include "tokenizer/flat_map.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode_text.h"

namespace strata::tokenizer {
namespace {

using json = nlohmann::json;

// GPT-2's pre-tokenizer regex (ByteLevel with use_regex): contractions, letters, digits, other
// symbols, each with one optional leading space; whitespace runs leave their last space to the
// next word.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

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

struct Symbol {
  uint32_t id;
  int32_t prev, next;  // neighbours in the word as it is now; -1 at the ends
  bool removed;        // merged into its left neighbour
};

struct QueuedMerge {
  uint32_t rank, pos, new_id;
};
// std::push_heap keeps the largest first: "larger" = lower priority = higher rank, then right-most.
struct LowerPriority {
  bool operator()(const QueuedMerge& a, const QueuedMerge& b) const { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; }
};

struct BpeScratch {
  std::vector<Symbol> symbols;
  std::vector<QueuedMerge> heap;
  std::vector<uint32_t> word_ids;
};

struct BpeModel {
  FlatStringMap<uint32_t> vocab;  // the bytes a token stands for -> id
  FlatPairMap<MergeRule> merges;   // (left id, right id) -> rank and merged id
  std::array<ByteSymbol, 256> byte_symbols;
  std::optional<uint32_t> unk_id;
  bool fuse_unk = false;
  bool ignore_merges = false;

  const MergeRule* FindMerge(uint32_t left, uint32_t right) const { return merges.Find(left, right); }

  // The ids of one word (without the cache), appended to *out.
  void MergeWord(std::string_view word, BpeScratch& scratch, std::vector<uint32_t>* out) const {
    auto& symbols = scratch.symbols;
    symbols.clear();
    const auto add = [&](uint32_t id) {
      const int32_t i = static_cast<int32_t>(symbols.size());
      symbols.push_back({id, i - 1, i + 1, false});
    };
    std::optional<uint32_t> pending_unknown;
    for (const char ch : word) {
      const ByteSymbol& b = byte_symbols[static_cast<unsigned char>(ch)];
      switch (b.kind) {
        case ByteSymbol::kToken:
          if (pending_unknown) add(*pending_unknown);
          pending_unknown.reset();
          add(b.ids[0]);
          break;
        case ByteSymbol::kByteFallback:  // as tokenizers does: without flushing a pending unknown
          for (uint8_t k = 0; k < b.count; ++k) add(b.ids[k]);
          break;
        case ByteSymbol::kUnknown:
          if (!(pending_unknown && fuse_unk)) {
            if (pending_unknown) add(*pending_unknown);
            pending_unknown = *unk_id;
          }
          break;
        case ByteSymbol::kDropped:  // not in the vocabulary and no unk_token: tokenizers drops it
          break;
      }
    }
    if (pending_unknown) add(*pending_unknown);
    if (symbols.empty()) return;
    symbols.back().next = -1;

    auto& heap = scratch.heap;
    heap.clear();
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      if (const MergeRule* m = FindMerge(symbols[i].id, symbols[i + 1].id)) {
        heap.push_back({m->rank, static_cast<uint32_t>(i), m->new_id});
      }
    }
    std::make_heap(heap.begin(), heap.end(), LowerPriority{});
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), LowerPriority{});
      const QueuedMerge top = heap.back();
      heap.pop_back();
      Symbol& current = symbols[top.pos];
      if (current.removed || current.next < 0) continue;
      const int32_t right_pos = current.next;
      const Symbol right = symbols[right_pos];
      // A stale entry: the pair at this position changed since it was queued.
      const MergeRule* m = FindMerge(current.id, right.id);
      if (m == nullptr || m->new_id != top.new_id) continue;
      current.id = top.new_id;
      current.next = right.next;
      symbols[right_pos].removed = true;
      if (right.next >= 0) symbols[right.next].prev = static_cast<int32_t>(top.pos);
      if (current.prev >= 0) {
        if (const MergeRule* left = FindMerge(symbols[current.prev].id, current.id)) {
          heap.push_back({left->rank, static_cast<uint32_t>(current.prev), left->new_id});
          std::push_heap(heap.begin(), heap.end(), LowerPriority{});
        }
      }
      if (current.next >= 0) {
        if (const MergeRule* next = FindMerge(current.id, symbols[current.next].id)) {
          heap.push_back({next->rank, top.pos, next->new_id});
          std::push_heap(heap.begin(), heap.end(), LowerPriority{});
        }
      }
    }
    for (const Symbol& s : symbols) {
      if (!s.removed) out->push_back(s.id);
    }
  }
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

struct Span {
  size_t start, end;
  bool is_match;
};

// ---------------------------------------------------------------------------------------------
// The tokenizer
// ---------------------------------------------------------------------------------------------

class ByteLevelBpeTokenizer;

class BpeStream final : public EncodeStream {
 public:
  // With `shared_cache` (and its mutex) the stream uses the tokenizer's cache; else its own.
  BpeStream(const ByteLevelBpeTokenizer& tokenizer, WordCache* shared_cache, std::mutex* shared_cache_mutex);
  void Feed(std::string_view text, std::vector<uint32_t>* ids) override;
  void Finish(std::vector<uint32_t>* ids) override;
  size_t held_bytes() const override { return incomplete_.size() + raw_.size() + normalized_.size(); }
  int64_t inexact_cuts() const override { return 0; }

 private:
  void Process(bool final, std::vector<uint32_t>* ids);
  void ProcessSplit(bool closed, std::vector<uint32_t>* ids);
  size_t PreTokenize(std::string_view text, bool closed, std::vector<uint32_t>* ids);
  size_t SplitAt(std::string_view text, size_t stage, bool final, bool prefix_done, std::vector<uint32_t>* ids);
  void RunStagesFrom(std::string_view piece, size_t stage, std::vector<uint32_t>* ids);
  void EncodeWord(std::string_view word, std::vector<uint32_t>* ids);

  const ByteLevelBpeTokenizer& t_;
  WordCache* shared_cache_;
  std::mutex* shared_cache_mutex_;
  WordCache own_cache_;
  RegexScratch regex_scratch_;
  BpeScratch bpe_scratch_;

  std::string incomplete_;  // the start of a character cut by the end of the last Feed
  std::string raw_;         // text not yet split at added tokens / normalized
  std::string normalized_;  // normalized text of the current piece, not yet pre-tokenized
  char32_t raw_char_before_ = 0, normalized_char_before_ = 0;  // what precedes raw_ / normalized_ (single_word)
  bool split_fresh_ = true;  // nothing of the current piece between added tokens is pre-tokenized yet
  std::vector<TextPiece> raw_pieces_, normalized_pieces_;
  std::vector<std::vector<Span>> spans_;  // one per pre-tokenizer stage (they nest)
};

class ByteLevelBpeTokenizer final : public Tokenizer {
 public:
  std::vector<uint32_t> Encode(std::string_view text) const override {
    std::vector<uint32_t> ids;
    ids.reserve(text.size() / 3 + 4);
    BpeStream stream(*this, &cache_, &cache_mutex_);
    stream.Feed(text, &ids);
    stream.Finish(&ids);
    return ids;
  }

  std::string Decode(const std::vector<uint32_t>& ids) const override {
    std::string out;
    for (const uint32_t id : ids) {
      if (id >= id_to_token_.size() || id_to_token_[id].empty()) continue;
      const std::string& token = id_to_token_[id];
      // Tokens written in the byte-level alphabet are bytes; others (an added token with
      // characters outside it) are their own text, as tokenizers' ByteLevel decoder has it.
      std::string bytes;
      bool all_mapped = true;
      for (size_t i = 0; i < token.size() && all_mapped;) {
        size_t length = Utf8SequenceLength(token, i);
        const int b = length > 0 ? CharToByte(DecodeUtf8At(token, i, &length)) : -1;
        if (b < 0) all_mapped = false;
        bytes.push_back(static_cast<char>(b));
        i += std::max<size_t>(length, 1);
      }
      out += all_mapped ? bytes : token;
    }
    return out;
  }

  std::unique_ptr<EncodeStream> NewStream() const override { return std::make_unique<BpeStream>(*this, nullptr, nullptr); }
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
  mutable std::mutex cache_mutex_;
  mutable WordCache cache_;  // guarded by cache_mutex_
};

BpeStream::BpeStream(const ByteLevelBpeTokenizer& tokenizer, WordCache* shared_cache, std::mutex* shared_cache_mutex)
    : t_(tokenizer), shared_cache_(shared_cache), shared_cache_mutex_(shared_cache_mutex), spans_(tokenizer.stages_.size()) {}

void BpeStream::Feed(std::string_view text, std::vector<uint32_t>* ids) {
  std::string joined;
  if (!incomplete_.empty()) {
    joined = incomplete_ + std::string(text);
    text = joined;
  }
  const size_t keep = IncompleteUtf8Suffix(text);
  const std::string_view body = text.substr(0, text.size() - keep);
  if (IsValidUtf8(body)) {
    raw_.append(body);
  } else {
    raw_ += ReplaceIllFormedUtf8(body);
  }
  incomplete_ = std::string(text.substr(text.size() - keep));
  Process(/*final=*/false, ids);
}

void BpeStream::Finish(std::vector<uint32_t>* ids) {
  if (!incomplete_.empty()) raw_ += ReplaceIllFormedUtf8(incomplete_);
  incomplete_.clear();
  Process(/*final=*/true, ids);
  raw_.clear();
  normalized_.clear();
  raw_char_before_ = normalized_char_before_ = 0;
  split_fresh_ = true;
}

// Step 1 on raw_ (added tokens found in the text as given), step 2 (normalizer) on what lies
// between them; the normalized text goes on to ProcessSplit.
void BpeStream::Process(bool final, std::vector<uint32_t>* ids) {
  raw_pieces_.clear();
  size_t consumed = t_.raw_tokens_->Split(raw_, final, raw_char_before_, &raw_pieces_);
  for (size_t i = 0; i < raw_pieces_.size(); ++i) {
    const TextPiece& piece = raw_pieces_[i];
    if (piece.is_token) {
      ProcessSplit(/*closed=*/true, ids);
      ids->push_back(piece.id);
      continue;
    }
    std::string_view text = std::string_view(raw_).substr(piece.start, piece.end - piece.start);
    const bool open = !final && i + 1 == raw_pieces_.size();
    if (t_.nfc_) {
      if (open) {  // the last characters may still combine with what comes next
        const size_t boundary = t_.nfc_->LastBoundary(text);
        text = text.substr(0, boundary);
        consumed = piece.start + boundary;
      }
      t_.nfc_->AppendNormalized(text, &normalized_);
    } else {
      normalized_.append(text);
    }
  }
  if (consumed > 0) {
    size_t length = 0;
    raw_char_before_ = DecodeUtf8At(raw_, StartOfLastChar(std::string_view(raw_).substr(0, consumed)), &length);
  }
  raw_.erase(0, consumed);
  ProcessSplit(/*closed=*/final, ids);
}

// normalized_ holds the normalized text since the last added token of step 1: the added tokens
// matched in normalized text come out of it, and the text around them goes to the pre-tokenizer.
// `closed`: an added token or the end of the text follows, so nothing more joins this piece.
void BpeStream::ProcessSplit(bool closed, std::vector<uint32_t>* ids) {
  normalized_pieces_.clear();
  size_t consumed = t_.normalized_tokens_->Split(normalized_, closed, normalized_char_before_, &normalized_pieces_);
  for (size_t i = 0; i < normalized_pieces_.size(); ++i) {
    const TextPiece& piece = normalized_pieces_[i];
    if (piece.is_token) {
      ids->push_back(piece.id);
      split_fresh_ = true;
      continue;
    }
    const bool open = !closed && i + 1 == normalized_pieces_.size();
    const std::string_view text = std::string_view(normalized_).substr(piece.start, piece.end - piece.start);
    const size_t done = PreTokenize(text, /*closed=*/!open, ids);
    if (open) consumed = piece.start + done;
  }
  if (closed) {
    normalized_.clear();
    normalized_char_before_ = 0;
    split_fresh_ = true;
    return;
  }
  if (consumed > 0) {
    size_t length = 0;
    normalized_char_before_ =
        DecodeUtf8At(normalized_, StartOfLastChar(std::string_view(normalized_).substr(0, consumed)), &length);
  }
  normalized_.erase(0, consumed);
}

// Step 3 on one piece between added tokens (or the start of one, when !closed): returns how many
// of its bytes were turned into ids.
size_t BpeStream::PreTokenize(std::string_view text, bool closed, std::vector<uint32_t>* ids) {
  if (text.empty()) return 0;
  const PreTokenizerStage& first = t_.stages_.front();
  size_t done = 0;
  if (split_fresh_ && first.add_prefix_space && text[0] != ' ') {
    const std::string prefixed = " " + std::string(text);
    const size_t n = SplitAt(prefixed, 0, closed, /*prefix_done=*/true, ids);
    if (n == 0) return 0;
    done = n - 1;
  } else {
    done = SplitAt(text, 0, closed, /*prefix_done=*/true, ids);
  }
  if (done > 0 || closed) split_fresh_ = false;
  return done;
}

// One pre-tokenizer stage on `text`: its pieces go through the later stages to BPE. With
// final=false the text may continue, and the stage stops before the first piece that more text
// could change; returns where it stopped.
size_t BpeStream::SplitAt(std::string_view text, size_t stage_index, bool final, bool prefix_done,
                          std::vector<uint32_t>* ids) {
  const PreTokenizerStage& stage = t_.stages_[stage_index];
  if (!prefix_done && stage.add_prefix_space && !text.empty() && text[0] != ' ') {
    const std::string prefixed = " " + std::string(text);  // later stages only: their pieces are whole
    SplitAt(prefixed, stage_index, final, /*prefix_done=*/true, ids);
    return text.size();
  }
  if (!stage.regex) {
    if (!final) return 0;
    RunStagesFrom(text, stage_index + 1, ids);
    return text.size();
  }
  std::vector<Span>& spans = spans_[stage_index];
  spans.clear();
  const size_t n = text.size();
  size_t prev = 0, offset = 0, partial_start = 0;
  bool partial = false;
  while (offset < n) {
    size_t start = 0, end = 0;
    const Regex::Outcome outcome = stage.regex->Find(text, offset, /*partial=*/!final, regex_scratch_, &start, &end);
    if (outcome == Regex::Outcome::kNoMatch) break;
    if (outcome == Regex::Outcome::kPartial) {
      partial = true;
      partial_start = start;
      break;
    }
    if (start > prev) spans.push_back({prev, start, false});
    spans.push_back({start, end, true});
    prev = end;
    offset = end > start ? end : end + std::max<size_t>(Utf8SequenceLength(text, end), 1);  // past an empty match
  }
  size_t consumed;
  if (final) {
    if (prev < n) spans.push_back({prev, n, false});
    consumed = n;
  } else if (partial) {
    if (prev < partial_start) spans.push_back({prev, partial_start, false});  // no match starts inside it: final
    consumed = partial_start;
  } else {
    consumed = prev;  // unmatched text at the end: it may grow
  }
  if (stage.invert) {
    for (Span& s : spans) s.is_match = !s.is_match;
  }
  // tokenizers' NormalizedString::split: the pieces each behaviour makes of matches and gaps.
  std::vector<Span> merged;
  const std::vector<Span>* pieces = &spans;
  switch (stage.behavior) {
    case SplitBehavior::kIsolated:
    case SplitBehavior::kRemoved:
      break;
    case SplitBehavior::kContiguous:
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Span& s : spans) {
        const bool join = stage.behavior == SplitBehavior::kContiguous ? s.is_match == previous_match
                                                                        : s.is_match && !previous_match;
        if (join && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back({s.start, s.end, false});
        }
        previous_match = s.is_match;
      }
      pieces = &merged;
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty()) {
          merged.back().start = it->start;
        } else {
          merged.push_back({it->start, it->end, false});
        }
        previous_match = it->is_match;
      }
      std::reverse(merged.begin(), merged.end());
      pieces = &merged;
      break;
    }
  }
  size_t last = pieces->size();
  const bool merging = stage.behavior != SplitBehavior::kIsolated && stage.behavior != SplitBehavior::kRemoved;
  if (!final && merging && last > 0) {  // the last piece may still take in what comes next
    --last;
    consumed = (*pieces)[last].start;
  }
  for (size_t i = 0; i < last; ++i) {
    const Span& s = (*pieces)[i];
    if (s.end == s.start) continue;
    if (stage.behavior == SplitBehavior::kRemoved && s.is_match) continue;
    RunStagesFrom(text.substr(s.start, s.end - s.start), stage_index + 1, ids);
  }
  return consumed;
}

void BpeStream::RunStagesFrom(std::string_view piece, size_t stage, std::vector<uint32_t>* ids) {
  if (stage == t_.stages_.size()) {
    EncodeWord(piece, ids);
  } else {
    SplitAt(piece, stage, /*final=*/true, /*prefix_done=*/false, ids);
  }
}

// Steps 4 and 5 for one word.
void BpeStream::EncodeWord(std::string_view word, std::vector<uint32_t>* ids) {
  if (word.empty()) return;
  const BpeModel& model = t_.model_;
  if (model.ignore_merges) {
    if (const uint32_t* id = model.vocab.Find(word)) {
      ids->push_back(*id);
      return;
    }
  }
  if (word.size() == 1) {
    const ByteSymbol& b = model.byte_symbols[static_cast<unsigned char>(word[0])];
    if (b.kind == ByteSymbol::kToken) {
      ids->push_back(b.ids[0]);
      return;
    }
  }
  if (shared_cache_ != nullptr) {
    std::lock_guard<std::mutex> lock(*shared_cache_mutex_);
    if (shared_cache_->Lookup(word, ids)) return;
  } else if (own_cache_.Lookup(word, ids)) {
    return;
  }
  bpe_scratch_.word_ids.clear();
  model.MergeWord(word, bpe_scratch_, &bpe_scratch_.word_ids);
  ids->insert(ids->end(), bpe_scratch_.word_ids.begin(), bpe_scratch_.word_ids.end());
  if (shared_cache_ != nullptr) {
    std::lock_guard<std::mutex> lock(*shared_cache_mutex_);
    shared_cache_->Insert(word, bpe_scratch_.word_ids);
  } else {
    own_cache_.Insert(word, bpe_scratch_.word_ids);
  }
}

// ---------------------------------------------------------------------------------------------
// Loading tokenizer.json
// ---------------------------------------------------------------------------------------------

std::string Quoted(const std::string& s) {
  // JSON's quoting: control bytes and quotes escaped, so a message shows a token as written.
  return json(s).dump(-1, ' ', false, json::error_handler_t::replace);
}

class Loader {
 public:
  explicit Loader(std::string path) : path_(std::move(path)) {}

  HuggingFaceLoad Load();

 private:
  // A file this library reads, written wrong: the field and what is wrong with it.
  Status Bad(const std::string& field, const std::string& what) const { return InvalidArgument(path_ + ": " + field + " " + what); }
  // A well-formed file of a kind this library does not read.
  Status Unsupported(const std::string& field, const std::string& what) {
    unsupported_ = true;
    return InvalidArgument(path_ + ": " + field + " " + what);
  }

  Status LoadModel(const json& model, ByteLevelBpeTokenizer* t, std::unordered_map<std::string, uint32_t>* vocab_by_text);
  Status LoadNormalizer(const json& normalizer, const std::string& field, bool* nfc);
  Status LoadPreTokenizer(const json& pre_tokenizer, const std::string& field, std::vector<PreTokenizerStage>* stages);
  Status LoadAddedTokens(const json& added, const std::unordered_map<std::string, uint32_t>& vocab_by_text,
                         ByteLevelBpeTokenizer* t);
  Result<bool> OptionalBool(const json& object, const std::string& key, const std::string& field, bool fallback) const {
    const auto it = object.find(key);
    if (it == object.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) return Bad(field + "." + key, "is " + it->dump() + ", not true or false");
    return it->get<bool>();
  }

  std::string path_;
  bool unsupported_ = false;
};

constexpr const char* kWhatWeRead =
    "; strata reads byte-level BPE tokenizer.json files (model.type \"BPE\" with a ByteLevel pre-tokenizer: GPT-2, "
    "Llama 3, Qwen2 and the like) and SentencePiece tokenizer.model files (put the model's tokenizer.model beside it)";

HuggingFaceLoad Loader::Load() {
  HuggingFaceLoad result;
  std::ifstream in(path_, std::ios::binary);
  if (!in) {
    result.tokenizer = IoError("cannot read " + path_ + ": " + std::strerror(errno));
    return result;
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    result.tokenizer = IoError("cannot read " + path_ + ": " + std::strerror(errno));
    return result;
  }
  json root;
  try {
    root = json::parse(contents.str());
  } catch (const json::parse_error& e) {
    result.tokenizer = InvalidArgument(path_ + ": not valid JSON (" + e.what() + "); the file is damaged or cut short: fetch it again");
    return result;
  }
  auto fail = [&](Status status) {
    result.tokenizer = std::move(status);
    result.unsupported_kind = unsupported_;
    return std::move(result);
  };
  if (!root.is_object()) return fail(Bad("(the top level)", "is not a JSON object: this is not a tokenizer.json"));
  const auto model = root.find("model");
  if (model == root.end() || !model->is_object()) return fail(Bad("model", "is missing or not an object: this is not a tokenizer.json"));

  auto t = std::make_unique<ByteLevelBpeTokenizer>();
  std::unordered_map<std::string, uint32_t> vocab_by_text;
  if (Status st = LoadModel(*model, t.get(), &vocab_by_text); !st.ok()) return fail(st);

  bool nfc = false;
  const auto normalizer = root.find("normalizer");
  if (normalizer != root.end()) {
    if (Status st = LoadNormalizer(*normalizer, "normalizer", &nfc); !st.ok()) return fail(st);
  }
  if (nfc) t->nfc_.emplace();

  const auto pre_tokenizer = root.find("pre_tokenizer");
  if (pre_tokenizer == root.end() || pre_tokenizer->is_null()) {
    return fail(Unsupported("pre_tokenizer", std::string("is null: a BPE without the ByteLevel pre-tokenizer is not byte-level") + kWhatWeRead));
  }
  if (Status st = LoadPreTokenizer(*pre_tokenizer, "pre_tokenizer", &t->stages_); !st.ok()) return fail(st);
  // The byte-level alphabet is applied last: a split after it would see 'Ġ' for ' '.
  bool byte_level_last = false;
  for (size_t i = 0; i < t->stages_.size(); ++i) {
    const bool byte_level = t->stages_[i].byte_level;
    if (byte_level && i + 1 != t->stages_.size()) {
      return fail(Unsupported(t->stages_[i + 1].field, "comes after ByteLevel; strata reads pre-tokenizers whose ByteLevel is the last step"));
    }
    byte_level_last = byte_level;
  }
  if (!byte_level_last) {
    return fail(Unsupported("pre_tokenizer", std::string("has no ByteLevel step: the vocabulary is not byte-level") + kWhatWeRead));
  }

  const auto added = root.find("added_tokens");
  if (added != root.end() && !added->is_null()) {
    if (Status st = LoadAddedTokens(*added, vocab_by_text, t.get()); !st.ok()) return fail(st);
  } else {
    t->raw_tokens_ = std::make_unique<AddedTokenMatcher>(std::vector<AddedTokenSpec>{});
    t->normalized_tokens_ = std::make_unique<AddedTokenMatcher>(std::vector<AddedTokenSpec>{});
  }
  t->vocab_size_ = static_cast<int64_t>(t->id_to_token_.size());
  t->description_ = "byte-level BPE from " + path_ + " (" + std::to_string(t->vocab_size_) + " token ids)";
  result.tokenizer = std::unique_ptr<Tokenizer>(std::move(t));
  return result;
}

Status Loader::LoadModel(const json& model, ByteLevelBpeTokenizer* t, std::unordered_map<std::string, uint32_t>* vocab_by_text) {
  const auto type = model.find("type");
  if (type != model.end() && !(type->is_string() && type->get<std::string>() == "BPE")) {
    return Unsupported("model.type", "is " + type->dump() + kWhatWeRead);
  }
  const auto vocab = model.find("vocab");
  const auto merges = model.find("merges");
  if (type == model.end() && (merges == model.end() || vocab == model.end())) {  // untagged: tokenizers infers the model from its fields
    return Unsupported("model", std::string("has no \"type\" and is not a BPE (no vocab and merges)") + kWhatWeRead);
  }
  if (vocab == model.end() || !vocab->is_object()) return Bad("model.vocab", "is missing or not an object of token: id");
  if (merges == model.end() || !merges->is_array()) return Bad("model.merges", "is missing or not a list");

  if (const auto dropout = model.find("dropout"); dropout != model.end() && !dropout->is_null()) {
    if (!dropout->is_number()) return Bad("model.dropout", "is " + dropout->dump() + ", not a number");
    if (dropout->get<double>() != 0.0) {
      return Unsupported("model.dropout", "is " + dropout->dump() +
                                              ": BPE dropout picks a different split at random each time, which a data "
                                              "file must not; set it to null for tokenizing");
    }
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto it = model.find(key);
    if (it != model.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty())) {
      return Unsupported(std::string("model.") + key, "is " + it->dump() + ": a word-piece style BPE, not byte-level" + kWhatWeRead);
    }
  }
  STRATA_ASSIGN_OR_RETURN(const bool byte_fallback, OptionalBool(model, "byte_fallback", "model", false));
  STRATA_ASSIGN_OR_RETURN(t->model_.fuse_unk, OptionalBool(model, "fuse_unk", "model", false));
  STRATA_ASSIGN_OR_RETURN(t->model_.ignore_merges, OptionalBool(model, "ignore_merges", "model", false));

  BpeModel& m = t->model_;
  uint32_t max_id = 0;
  vocab_by_text->reserve(vocab->size());
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() > 0xFFFFFFFEull) {
      return Bad("model.vocab[" + Quoted(token) + "]", "is " + id.dump() + ", not a token id (a whole number from 0)");
    }
    const uint32_t value = id.get<uint32_t>();
    (*vocab_by_text)[token] = value;
    max_id = std::max(max_id, value);
    // The bytes the token stands for; a token with characters outside the alphabet never matches a
    // word (it is kept for Decode only).
    std::string bytes;
    bool byte_level = true;
    for (size_t i = 0; i < token.size() && byte_level;) {
      size_t length = Utf8SequenceLength(token, i);
      const int b = length > 0 ? CharToByte(DecodeUtf8At(token, i, &length)) : -1;
      byte_level = b >= 0;
      bytes.push_back(static_cast<char>(b));
      i += std::max<size_t>(length, 1);
    }
    if (byte_level) m.vocab.Insert(bytes, value);
  }
  t->id_to_token_.assign(vocab->empty() ? 0 : size_t{max_id} + 1, std::string());
  for (const auto& [token, id] : *vocab_by_text) t->id_to_token_[id] = token;

  if (const auto unk = model.find("unk_token"); unk != model.end() && !unk->is_null()) {
    if (!unk->is_string()) return Bad("model.unk_token", "is " + unk->dump() + ", not a token");
    const auto it = vocab_by_text->find(unk->get<std::string>());
    if (it == vocab_by_text->end()) return Bad("model.unk_token", Quoted(unk->get<std::string>()) + " is not in model.vocab");
    m.unk_id = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    std::string character;
    AppendUtf8(ByteToChar()[b], &character);
    ByteSymbol& symbol = m.byte_symbols[b];
    if (const auto it = vocab_by_text->find(character); it != vocab_by_text->end()) {
      symbol.kind = ByteSymbol::kToken;
      symbol.count = 1;
      symbol.ids[0] = it->second;
      continue;
    }
    if (byte_fallback) {  // <0xXX> for each byte of the character (as tokenizers does)
      bool found = true;
      for (size_t k = 0; k < character.size() && found; ++k) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", static_cast<unsigned char>(character[k]));
        const auto it = vocab_by_text->find(name);
        found = it != vocab_by_text->end();
        if (found) symbol.ids[k] = it->second;
      }
      if (found) {
        symbol.kind = ByteSymbol::kByteFallback;
        symbol.count = static_cast<uint8_t>(character.size());
        continue;
      }
    }
    symbol.kind = m.unk_id ? ByteSymbol::kUnknown : ByteSymbol::kDropped;
  }

  m.merges.Reserve(merges->size());
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const json& merge = (*merges)[rank];
    const std::string field = "model.merges[" + std::to_string(rank) + "]";
    std::string left, right;
    if (merge.is_string()) {
      const std::string& text = merge.get_ref<const std::string&>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        return Bad(field, "is " + Quoted(text) + ": a merge is two tokens with one space between them");
      }
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      return Bad(field, "is " + merge.dump() + ": a merge is \"A B\" or [\"A\", \"B\"]");
    }
    const auto l = vocab_by_text->find(left), r = vocab_by_text->find(right), merged = vocab_by_text->find(left + right);
    if (l == vocab_by_text->end()) return Bad(field, "names " + Quoted(left) + ", which is not in model.vocab");
    if (r == vocab_by_text->end()) return Bad(field, "names " + Quoted(right) + ", which is not in model.vocab");
    if (merged == vocab_by_text->end()) return Bad(field, "makes " + Quoted(left + right) + ", which is not in model.vocab");
    // A pair listed twice takes its later rank, as tokenizers' merge map does.
    m.merges.Insert(l->second, r->second, {static_cast<uint32_t>(rank), merged->second});
  }
  return Status::Ok();
}

Status Loader::LoadNormalizer(const json& normalizer, const std::string& field, bool* nfc) {
  if (normalizer.is_null()) return Status::Ok();
  if (!normalizer.is_object()) return Bad(field, "is " + normalizer.dump() + ", not an object");
  const auto type = normalizer.find("type");
  if (type == normalizer.end() || !type->is_string()) return Bad(field + ".type", "is missing");
  const std::string name = type->get<std::string>();
  if (name == "NFC") {
    *nfc = true;  // NFC twice is NFC once
    return Status::Ok();
  }
  if (name == "Sequence") {
    const auto list = normalizer.find("normalizers");
    if (list == normalizer.end() || !list->is_array()) return Bad(field + ".normalizers", "is missing or not a list");
    for (size_t i = 0; i < list->size(); ++i) {
      STRATA_RETURN_IF_ERROR(LoadNormalizer((*list)[i], field + ".normalizers[" + std::to_string(i) + "]", nfc));
    }
    return Status::Ok();
  }
  return Unsupported(field + ".type", "is " + type->dump() + "; strata reads no normalizer or NFC (Qwen2)" + kWhatWeRead);
}

Status Loader::LoadPreTokenizer(const json& pre_tokenizer, const std::string& field, std::vector<PreTokenizerStage>* stages) {
  if (!pre_tokenizer.is_object()) return Bad(field, "is " + pre_tokenizer.dump() + ", not an object");
  const auto type = pre_tokenizer.find("type");
  if (type == pre_tokenizer.end() || !type->is_string()) return Bad(field + ".type", "is missing");
  const std::string name = type->get<std::string>();
  if (name == "Sequence") {
    const auto list = pre_tokenizer.find("pretokenizers");
    if (list == pre_tokenizer.end() || !list->is_array()) return Bad(field + ".pretokenizers", "is missing or not a list");
    for (size_t i = 0; i < list->size(); ++i) {
      STRATA_RETURN_IF_ERROR(LoadPreTokenizer((*list)[i], field + ".pretokenizers[" + std::to_string(i) + "]", stages));
    }
    return Status::Ok();
  }
  PreTokenizerStage stage;
  stage.field = field + " (" + name + ")";
  if (name == "ByteLevel") {
    stage.byte_level = true;
    const auto add_prefix_space = pre_tokenizer.find("add_prefix_space");
    if (add_prefix_space == pre_tokenizer.end() || !add_prefix_space->is_boolean()) {
      return Bad(field + ".add_prefix_space", "is missing or not true / false");
    }
    stage.add_prefix_space = add_prefix_space->get<bool>();
    STRATA_ASSIGN_OR_RETURN(const bool use_regex, OptionalBool(pre_tokenizer, "use_regex", field, true));
    if (use_regex) {
      auto regex = Regex::Compile(kGpt2Pattern);
      STRATA_CHECK(regex.ok());
      stage.regex = std::move(regex).value();
    }
  } else if (name == "Split") {
    const auto pattern = pre_tokenizer.find("pattern");
    if (pattern == pre_tokenizer.end() || !pattern->is_object() || pattern->size() != 1) {
      return Bad(field + ".pattern", "is missing or not {\"Regex\": \"...\"} / {\"String\": \"...\"}");
    }
    const std::string kind = pattern->begin().key();
    const json& text = pattern->begin().value();
    if (!text.is_string() || (kind != "Regex" && kind != "String")) {
      return Bad(field + ".pattern", "is " + pattern->dump() + ", not {\"Regex\": \"...\"} / {\"String\": \"...\"}");
    }
    auto regex = kind == "Regex" ? Regex::Compile(text.get<std::string>()) : Regex::CompileLiteral(text.get<std::string>());
    if (!regex.ok()) return Bad(field + ".pattern." + kind, regex.status().message());
    stage.regex = std::move(regex).value();
    const auto behavior = pre_tokenizer.find("behavior");
    const std::string b = behavior != pre_tokenizer.end() && behavior->is_string() ? behavior->get<std::string>() : "";
    if (b == "Isolated") {
      stage.behavior = SplitBehavior::kIsolated;
    } else if (b == "Removed") {
      stage.behavior = SplitBehavior::kRemoved;
    } else if (b == "MergedWithPrevious") {
      stage.behavior = SplitBehavior::kMergedWithPrevious;
    } else if (b == "MergedWithNext") {
      stage.behavior = SplitBehavior::kMergedWithNext;
    } else if (b == "Contiguous") {
      stage.behavior = SplitBehavior::kContiguous;
    } else {
      return Bad(field + ".behavior", "is " + (behavior == pre_tokenizer.end() ? std::string("missing") : behavior->dump()) +
                                          ", not Isolated, Removed, MergedWithPrevious, MergedWithNext or Contiguous");
    }
    STRATA_ASSIGN_OR_RETURN(stage.invert, OptionalBool(pre_tokenizer, "invert", field, false));
  } else {
    return Unsupported(field + ".type", "is " + type->dump() + "; strata reads ByteLevel, Split and Sequence pre-tokenizers" + kWhatWeRead);
  }
  stages->push_back(std::move(stage));
  return Status::Ok();
}

Status Loader::LoadAddedTokens(const json& added, const std::unordered_map<std::string, uint32_t>& vocab_by_text,
                               ByteLevelBpeTokenizer* t) {
  if (!added.is_array()) return Bad("added_tokens", "is not a list");
  std::vector<AddedTokenSpec> raw, normalized;
  for (size_t i = 0; i < added.size(); ++i) {
    const json& token = added[i];
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    if (!token.is_object()) return Bad(field, "is not an object");
    const auto content = token.find("content");
    if (content == token.end() || !content->is_string()) return Bad(field + ".content", "is missing or not a string");
    const auto id = token.find("id");
    if (id == token.end() || !id->is_number_unsigned() || id->get<uint64_t>() > 0xFFFFFFFEull) {
      return Bad(field + ".id", "is missing or not a token id (a whole number from 0)");
    }
    AddedTokenSpec spec;
    spec.content = content->get<std::string>();
    if (!IsValidUtf8(spec.content)) return Bad(field + ".content", "is not UTF-8");
    // A token the model's vocabulary has keeps the vocabulary's id, as tokenizers assigns it.
    const auto in_vocab = vocab_by_text.find(spec.content);
    spec.id = in_vocab != vocab_by_text.end() ? in_vocab->second : id->get<uint32_t>();
    STRATA_ASSIGN_OR_RETURN(spec.single_word, OptionalBool(token, "single_word", field, false));
    STRATA_ASSIGN_OR_RETURN(spec.lstrip, OptionalBool(token, "lstrip", field, false));
    STRATA_ASSIGN_OR_RETURN(spec.rstrip, OptionalBool(token, "rstrip", field, false));
    STRATA_ASSIGN_OR_RETURN(const bool is_normalized, OptionalBool(token, "normalized", field, true));
    if (spec.id >= t->id_to_token_.size()) t->id_to_token_.resize(size_t{spec.id} + 1);
    t->id_to_token_[spec.id] = spec.content;
    if (is_normalized) {
      if (t->nfc_) {  // matched in normalized text, so as its normalized form
        std::string nfc;
        t->nfc_->AppendNormalized(spec.content, &nfc);
        spec.content = std::move(nfc);
      }
      normalized.push_back(std::move(spec));
    } else {
      raw.push_back(std::move(spec));
    }
  }
  t->raw_tokens_ = std::make_unique<AddedTokenMatcher>(std::move(raw));
  t->normalized_tokens_ = std::make_unique<AddedTokenMatcher>(std::move(normalized));
  return Status::Ok();
}

}  // namespace

HuggingFaceLoad LoadByteLevelBpe(const std::string& path) { return Loader(path).Load(); }

}  // namespace strata::tokenizer
