// SentencePiece tokenizer.model files (Llama 2, Gemma), through Debian's libsentencepiece:
// SentencePieceProcessor::Encode, no BOS / EOS.
//
// Streaming. SentencePiece encodes a text as one sentence: spaces become '▁', a dummy '▁' may be
// put in front of the whole (add_dummy_prefix), leading spaces may be dropped
// (remove_extra_whitespaces), and pieces never cross a '▁' that starts a word (split_by_whitespace).
// So a long text is cut just before a space that has a letter or digit on each side, and the part
// after the cut is encoded behind a probe word: Encode("a" + " word ...") minus the ids of
// Encode("a") is exactly what the part gives inside the whole text, whatever the model's options.
// Where that does not hold (the probe's ids are not a prefix: a model whose pieces cross spaces),
// or where no such space comes within 64 MiB (Chinese without spaces), the part is encoded on its
// own, after a newline, and counted in inexact_cuts(): there the ids may differ from the whole
// text's by the pieces at the cut.
#include <sentencepiece_processor.h>

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "tokenizer/byte_level_bpe.h"
#include "tokenizer/unicode_text.h"

namespace strata::tokenizer {
namespace {

// Encode about this much at a time: libsentencepiece's encoding of one sentence grows faster than
// its length (0.04 s for 100 kB, 0.8 s for 1 MB, 2.5 s for 2.3 MB of English with a small BPE).
constexpr size_t kCutEvery = 256 << 10;
constexpr size_t kMaxWithoutSpace = 64 << 20;  // then cut at a newline, inexactly
constexpr const char* kProbe = "a";            // the word a part after a cut is encoded behind

// A character on either side of a space where SentencePiece may be cut: letters and digits of the
// common scripts, none of which NFKC (nmt_nfkc) turns into or merges with a space.
bool IsCutNeighbour(std::string_view text, size_t i) {
  const unsigned char b = static_cast<unsigned char>(text[i]);
  if (b < 0x80) return std::isalnum(b) != 0;
  if ((b & 0xC0) == 0x80) return false;
  size_t length = Utf8SequenceLength(text, i);
  if (length == 0) return false;
  const char32_t c = DecodeUtf8At(text, i, &length);
  return (c >= 0xC0 && c <= 0x24F && c != 0xD7 && c != 0xF7) ||  // Latin letters
         (c >= 0x391 && c <= 0x3C9) ||                            // Greek
         (c >= 0x400 && c <= 0x4FF) ||                            // Cyrillic
         (c >= 0x5D0 && c <= 0x5EA) ||                            // Hebrew
         (c >= 0x620 && c <= 0x64A) ||                            // Arabic
         (c >= 0x3041 && c <= 0x30FF) ||                          // kana
         (c >= 0x4E00 && c <= 0x9FFF) ||                          // CJK
         (c >= 0xAC00 && c <= 0xD7A3);                            // Hangul
}

class SentencePieceTokenizer;

class SentencePieceStream final : public EncodeStream {
 public:
  explicit SentencePieceStream(const SentencePieceTokenizer& t) : t_(t) {}
  void Feed(std::string_view text, std::vector<uint32_t>* ids) override;
  void Finish(std::vector<uint32_t>* ids) override;
  size_t held_bytes() const override { return held_.size(); }
  int64_t inexact_cuts() const override { return inexact_cuts_; }

 private:
  void EncodePart(std::string_view part, std::vector<uint32_t>* ids);

  const SentencePieceTokenizer& t_;
  std::string held_;
  size_t searched_ = 0;     // held_[0, searched_) has no place to cut at a space
  bool after_cut_ = false;  // held_ starts at a cut (with its space), not at the start of the text
  bool after_newline_cut_ = false;
  int64_t inexact_cuts_ = 0;
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  Status Load(const std::string& path) {
    const auto status = processor_.Load(path);
    if (!status.ok()) {
      return InvalidArgument(path + ": not a SentencePiece model (" + status.ToString() +
                             "); the file is damaged or of another kind: fetch the model's tokenizer.model again");
    }
    path_ = path;
    probe_ids_ = Encode(kProbe);
    return Status::Ok();
  }

  std::vector<uint32_t> Encode(std::string_view text) const override {
    std::vector<int> ids;
    (void)processor_.Encode(text, &ids);  // fails only without a model; Load made sure there is one
    return std::vector<uint32_t>(ids.begin(), ids.end());
  }
  std::string Decode(const std::vector<uint32_t>& ids) const override {
    std::vector<int> known;
    for (const uint32_t id : ids) {
      if (static_cast<int64_t>(id) < vocab_size()) known.push_back(static_cast<int>(id));
    }
    std::string text;
    (void)processor_.Decode(known, &text);
    return text;
  }
  std::unique_ptr<EncodeStream> NewStream() const override { return std::make_unique<SentencePieceStream>(*this); }
  int64_t vocab_size() const override { return processor_.GetPieceSize(); }
  std::string description() const override { return "SentencePiece from " + path_; }

  const std::vector<uint32_t>& probe_ids() const { return probe_ids_; }

 private:
  sentencepiece::SentencePieceProcessor processor_;
  std::string path_;
  std::vector<uint32_t> probe_ids_;  // Encode(kProbe)
};

void SentencePieceStream::EncodePart(std::string_view part, std::vector<uint32_t>* ids) {
  if (after_cut_ && !after_newline_cut_) {  // part starts with the space of a cut
    const std::vector<uint32_t> probed = t_.Encode(std::string(kProbe) + std::string(part));
    const std::vector<uint32_t>& probe = t_.probe_ids();
    if (probed.size() >= probe.size() && std::equal(probe.begin(), probe.end(), probed.begin())) {
      ids->insert(ids->end(), probed.begin() + static_cast<std::ptrdiff_t>(probe.size()), probed.end());
      return;
    }
    ++inexact_cuts_;
  }
  const std::vector<uint32_t> part_ids = t_.Encode(part);
  ids->insert(ids->end(), part_ids.begin(), part_ids.end());
}

void SentencePieceStream::Feed(std::string_view text, std::vector<uint32_t>* ids) {
  held_.append(text);
  if (held_.size() < kCutEvery) return;
  // The last space with a cut neighbour on both sides, not in the first byte (a part is never
  // empty); held text searched before had none.
  size_t cut = std::string::npos;
  const size_t searched = std::max<size_t>(searched_, 1);
  searched_ = held_.size() - 2;  // a space in the last byte needs the next one
  for (size_t i = held_.size() - 1; i > searched; --i) {
    if (held_[i] != ' ' || i + 1 >= held_.size()) continue;
    size_t before = i - 1;
    while (before > 0 && (static_cast<unsigned char>(held_[before]) & 0xC0) == 0x80) --before;
    if (IsCutNeighbour(held_, before) && IsCutNeighbour(held_, i + 1)) {
      cut = i;
      break;
    }
  }
  bool newline_cut = false;
  if (cut == std::string::npos) {
    if (held_.size() < kMaxWithoutSpace) return;
    const size_t newline = held_.rfind('\n');
    if (newline == std::string::npos || newline == 0) return;
    cut = newline + 1;
    newline_cut = true;
  }
  EncodePart(std::string_view(held_).substr(0, cut), ids);
  held_.erase(0, cut);
  searched_ = 0;
  after_cut_ = true;
  after_newline_cut_ = newline_cut;
  if (newline_cut) ++inexact_cuts_;
}

void SentencePieceStream::Finish(std::vector<uint32_t>* ids) {
  if (!held_.empty() || !after_cut_) EncodePart(held_, ids);
  held_.clear();
  searched_ = 0;
  after_cut_ = after_newline_cut_ = false;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> LoadSentencePieceModel(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return InvalidArgument(path + ": no such file");
  auto t = std::make_unique<SentencePieceTokenizer>();
  STRATA_RETURN_IF_ERROR(t->Load(path));
  return std::unique_ptr<Tokenizer>(std::move(t));
}

}  // namespace strata::tokenizer
