// SentencePiece tokenizer.model files (Llama 2, Gemma), through Debian's libsentencepiece:
// SentencePieceProcessor::Encode, no BOS / EOS.
//
// Parts. SentencePiece encodes a text as one sentence: spaces become '▁', a dummy '▁' may be put in
// front of the whole (add_dummy_prefix), leading spaces may be dropped (remove_extra_whitespaces),
// and pieces never cross a '▁' that starts a word (split_by_whitespace). So a text can be cut just
// before a space that has a letter or digit on each side, and the part after the cut encoded
// behind a probe word: Encode("a" + " word ...") minus the ids of Encode("a") is what the part
// gives inside the whole text, whatever the model's options.
//
// A text longer than 256 bytes is encoded in such parts, of about 256 bytes (a few words). A
// unigram model's Viterbi adds up scores in float along the whole sentence, so where two
// segmentations of a word score (nearly) the same ("222" as 22 2 or as 2 22; "▁种" or "▁" "种"),
// which one wins depends on the text before it in the sentence. Given a 6 MB text as one sentence,
// Debian's libsentencepiece 0.1.97 and pip's sentencepiece 0.2.2 segment a few dozen such words one
// way or the other, and not alike. In parts, a word's pieces depend only on its part: a stream and
// Encode agree, and so does any program that cuts the text the same way
// (tests/gpu/tokenizer_parity.py does). Parts are also faster: 0.1.97's time grows faster than a
// sentence's length (0.04 s for 100 kB, 0.8 s for 1 MB). BPE models do not drift: for them the
// parts give the whole sentence's ids.
//
// Where no such space comes within 256 KiB (Chinese without spaces), the cut is made before a
// newline instead, and counted in inexact_cuts(): pieces may cross a newline, so the ids next to it
// may differ from the whole text's. So is a cut where the probe's ids are not a prefix of the
// part's (a model whose pieces cross spaces); that part is then encoded on its own.
#include <sentencepiece_processor.h>

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "tokenizer/byte_level_bpe.h"
#include "tokenizer/unicode_text.h"

namespace strata::tokenizer {
namespace {

constexpr size_t kPartBytes = 256;              // see the top of the file
constexpr size_t kMaxWithoutSpace = 256 << 10;  // then cut before a newline, inexactly
constexpr const char* kProbe = "a";             // the word a part after a cut is encoded behind

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
         (c >= 0x391 && c <= 0x3C9) ||                           // Greek
         (c >= 0x400 && c <= 0x4FF) ||                           // Cyrillic
         (c >= 0x5D0 && c <= 0x5EA) ||                           // Hebrew
         (c >= 0x620 && c <= 0x64A) ||                           // Arabic
         (c >= 0x3041 && c <= 0x30FF) ||                         // kana
         (c >= 0x4E00 && c <= 0x9FFF) ||                         // CJK
         (c >= 0xAC00 && c <= 0xD7A3);                           // Hangul
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
  bool CutAt(size_t start, size_t i) const;

  const SentencePieceTokenizer& t_;
  std::string held_;
  size_t searched_ = 0;     // held_[0, searched_) has no place to cut at a space
  bool after_cut_ = false;  // held_ starts at a cut (with its space), not at the start of the text
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
    probe_ids_ = EncodeSentence(kProbe);
    return Status::Ok();
  }

  std::vector<uint32_t> Encode(std::string_view text) const override {
    if (text.size() <= kPartBytes) return EncodeSentence(text);
    std::vector<uint32_t> ids;
    SentencePieceStream stream(*this);
    stream.Feed(text, &ids);
    stream.Finish(&ids);
    return ids;
  }
  // One call of the processor on `text`.
  std::vector<uint32_t> EncodeSentence(std::string_view text) const {
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
  if (after_cut_) {  // part starts with the space (or newline) of a cut
    const std::vector<uint32_t> probed = t_.EncodeSentence(std::string(kProbe) + std::string(part));
    const std::vector<uint32_t>& probe = t_.probe_ids();
    if (probed.size() >= probe.size() && std::equal(probe.begin(), probe.end(), probed.begin())) {
      ids->insert(ids->end(), probed.begin() + static_cast<std::ptrdiff_t>(probe.size()), probed.end());
      return;
    }
    ++inexact_cuts_;
  }
  const std::vector<uint32_t> part_ids = t_.EncodeSentence(part);
  ids->insert(ids->end(), part_ids.begin(), part_ids.end());
}

// A space at held_[i] with a cut neighbour on both sides, after `start` (a part is never empty).
bool SentencePieceStream::CutAt(size_t start, size_t i) const {
  if (i <= start || i + 1 >= held_.size() || held_[i] != ' ') return false;
  size_t before = i - 1;
  while (before > start && (static_cast<unsigned char>(held_[before]) & 0xC0) == 0x80) --before;
  return IsCutNeighbour(held_, before) && IsCutNeighbour(held_, i + 1);
}

void SentencePieceStream::Feed(std::string_view text, std::vector<uint32_t>* ids) {
  held_.append(text);
  size_t start = 0;  // of what is not encoded yet
  while (held_.size() - start > kPartBytes) {
    // The last place to cut within a part's length, else the first one after it (within 256 KiB).
    size_t cut = std::string::npos;
    for (size_t i = start + kPartBytes; i > start && cut == std::string::npos; --i) {
      if (CutAt(start, i)) cut = i;
    }
    const size_t search_end = std::min(held_.size(), start + kMaxWithoutSpace);
    for (size_t i = std::max(start + kPartBytes, searched_); cut == std::string::npos && i < search_end; ++i) {
      if (CutAt(start, i)) cut = i;
    }
    if (cut == std::string::npos) {
      searched_ = held_.size() - 1;  // held text so far has no place to cut: do not search it again
      if (held_.size() - start < kMaxWithoutSpace) break;
      const size_t newline = held_.rfind('\n', start + kMaxWithoutSpace);
      if (newline == std::string::npos || newline <= start) break;
      cut = newline;
      ++inexact_cuts_;
    }
    EncodePart(std::string_view(held_).substr(start, cut - start), ids);
    start = cut;
    after_cut_ = true;
  }
  held_.erase(0, start);
  searched_ = searched_ > start ? searched_ - start : 0;
}

void SentencePieceStream::Finish(std::vector<uint32_t>* ids) {
  if (!held_.empty() || !after_cut_) EncodePart(held_, ids);
  held_.clear();
  searched_ = 0;
  after_cut_ = false;
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
