// Text to token ids, as a model's own tokenizer files define them: the library behind
// `strata tokenize` (docs/tokenize.md). Pure C++ (PCRE2, ICU, libsentencepiece), no LibTorch.
//
//   auto tokenizer = LoadTokenizer("/models/llama-3-8b");      // tokenizer.json or tokenizer.model
//   std::vector<uint32_t> ids = (*tokenizer)->Encode("Hello world");
//
// Two kinds are read:
//  - DIR/tokenizer.json of Hugging Face `tokenizers` when it is a byte-level BPE (GPT-2, Llama 3,
//    Qwen2 and their kin): ids equal to `tokenizers`' encode(text, add_special_tokens=False),
//    added tokens written in the text (<|endoftext|>) included;
//  - else DIR/tokenizer.model of SentencePiece (Llama 2, Gemma): SentencePieceProcessor::Encode,
//    no BOS / EOS, on parts of a few words (sentencepiece_tokenizer.cc says why).
// A tokenizer.json of another kind (WordPiece, Unigram, a Metaspace BPE) gives way to a
// tokenizer.model beside it; without one it is refused, naming the field that is not supported.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace strata::tokenizer {

// Encodes a text that arrives in pieces (a file read block by block) into exactly the ids that
// Tokenizer::Encode gives for the whole text: it holds back the end of what it was fed for as long
// as text still to come could change its ids (a word, a run of spaces, half of an added token).
// Not thread-safe: one stream per thread.
class EncodeStream {
 public:
  virtual ~EncodeStream() = default;
  // Takes the next piece of the text (UTF-8; a piece may end inside a character, whose rest comes
  // in the next piece) and appends to *ids the ids that no continuation can change.
  virtual void Feed(std::string_view text, std::vector<uint32_t>* ids) = 0;
  // Ends the text: appends the ids of everything held back. The stream is then empty, ready for
  // another text.
  virtual void Finish(std::vector<uint32_t>* ids) = 0;
  // Bytes fed but not encoded yet (what the next Feed or Finish may still change).
  virtual size_t held_bytes() const = 0;
  // Places where the stream had to cut without knowing that the cut is invisible in the ids (only
  // SentencePiece, on long text without a space to cut at; each may differ from encoding the whole
  // text by one token around the cut). 0 for byte-level BPE, which is always exact.
  virtual int64_t inexact_cuts() const = 0;
};

// A loaded tokenizer. Thread-safe: every method may be called from several threads at once.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // The ids of `text`, with no special tokens added (Hugging Face's add_special_tokens=False).
  // Invalid UTF-8 is read as U+FFFD, one per ill-formed sequence (what Python's
  // decode(errors="replace") hands a Hugging Face tokenizer); callers that must not lose bytes
  // check first (IsValidUtf8).
  virtual std::vector<uint32_t> Encode(std::string_view text) const = 0;
  // The text of `ids` (for byte-level BPE, the bytes Encode read: Decode(Encode(t)) == t for valid
  // UTF-8 t). Ids that are not in the vocabulary are skipped.
  virtual std::string Decode(const std::vector<uint32_t>& ids) const = 0;
  // A stream for a text too long to hold in memory at once; see EncodeStream.
  virtual std::unique_ptr<EncodeStream> NewStream() const = 0;

  // One more than the largest id Encode can return: the model's vocabulary and the added tokens
  // (Llama 3: 128256; GPT-2: 50257). Ids fit in uint16_t when this is at most 65536.
  virtual int64_t vocab_size() const = 0;
  // What was loaded, for messages: "byte-level BPE from DIR/tokenizer.json".
  virtual std::string description() const = 0;
};

// Loads the tokenizer of a model directory (a Hugging Face checkout): DIR/tokenizer.json when it is
// a byte-level BPE, else DIR/tokenizer.model. InvalidArgument, naming the file and the field, for
// a directory with neither file or a file this library does not read (and what it reads instead);
// IoError when a file cannot be read.
Result<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_dir);

// The same for one file: a tokenizer.json (Hugging Face) or a tokenizer.model (SentencePiece).
Result<std::unique_ptr<Tokenizer>> LoadHuggingFaceTokenizerJson(const std::string& path);
Result<std::unique_ptr<Tokenizer>> LoadSentencePieceModel(const std::string& path);

// True when `text` is well-formed UTF-8; otherwise *bad_offset (when given) is where the first
// ill-formed sequence starts.
bool IsValidUtf8(std::string_view text, size_t* bad_offset = nullptr);
// How many bytes at the end of `text` are the start of a character that is not complete yet (0 to
// 3): what a reader of a file in blocks keeps for the next block before checking IsValidUtf8.
size_t IncompleteUtf8Suffix(std::string_view text);

}  // namespace strata::tokenizer
