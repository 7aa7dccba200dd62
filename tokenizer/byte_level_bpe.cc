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
//     The loader does the inverse once, at load: the vocabulary is keyed by the bytes a token
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
#include <algorithm>

#include "common/thread_annotations.h"
#include "tokenizer/byte_level_bpe_internal.h"

namespace strata::tokenizer::internal {
namespace {

// ---------------------------------------------------------------------------------------------
// The BPE model
// ---------------------------------------------------------------------------------------------

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
  bool operator()(const QueuedMerge& a, const QueuedMerge& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

}  // namespace

// Outside the anonymous namespace: byte_level_bpe_internal.h declares it (BpeModel::MergeWord takes one).
struct BpeScratch {
  std::vector<Symbol> symbols;
  std::vector<QueuedMerge> heap;
  std::vector<uint32_t> word_ids;
};

void BpeModel::MergeWord(std::string_view word, BpeScratch& scratch, std::vector<uint32_t>* out) const {
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

namespace {

// ---------------------------------------------------------------------------------------------
// Pre-tokenizer
// ---------------------------------------------------------------------------------------------

struct Span {
  size_t start, end;
  bool is_match;
};

// ---------------------------------------------------------------------------------------------
// The tokenizer
// ---------------------------------------------------------------------------------------------

class BpeStream final : public EncodeStream {
 public:
  // With `shared_cache` (and its mutex) the stream uses the tokenizer's cache; else its own.
  BpeStream(const ByteLevelBpeTokenizer& tokenizer, WordCache* shared_cache, Mutex* shared_cache_mutex);
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
  WordCache* shared_cache_ STRATA_PT_GUARDED_BY(shared_cache_mutex_);
  Mutex* shared_cache_mutex_;
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

BpeStream::BpeStream(const ByteLevelBpeTokenizer& tokenizer, WordCache* shared_cache, Mutex* shared_cache_mutex)
    : t_(tokenizer),
      shared_cache_(shared_cache),
      shared_cache_mutex_(shared_cache_mutex),
      spans_(tokenizer.stages_.size()) {}

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
        const bool join =
            stage.behavior == SplitBehavior::kContiguous ? s.is_match == previous_match : s.is_match && !previous_match;
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
    MutexLock lock(*shared_cache_mutex_);
    if (shared_cache_->Lookup(word, ids)) return;
  } else if (own_cache_.Lookup(word, ids)) {
    return;
  }
  bpe_scratch_.word_ids.clear();
  model.MergeWord(word, bpe_scratch_, &bpe_scratch_.word_ids);
  ids->insert(ids->end(), bpe_scratch_.word_ids.begin(), bpe_scratch_.word_ids.end());
  if (shared_cache_ != nullptr) {
    MutexLock lock(*shared_cache_mutex_);
    shared_cache_->Insert(word, bpe_scratch_.word_ids);
  } else {
    own_cache_.Insert(word, bpe_scratch_.word_ids);
  }
}

}  // namespace

std::vector<uint32_t> ByteLevelBpeTokenizer::Encode(std::string_view text) const {
  std::vector<uint32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  BpeStream stream(*this, &cache_, &cache_mutex_);
  stream.Feed(text, &ids);
  stream.Finish(&ids);
  return ids;
}

std::string ByteLevelBpeTokenizer::Decode(const std::vector<uint32_t>& ids) const {
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

std::unique_ptr<EncodeStream> ByteLevelBpeTokenizer::NewStream() const {
  return std::make_unique<BpeStream>(*this, nullptr, nullptr);
}

}  // namespace strata::tokenizer::internal
