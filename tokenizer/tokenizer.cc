#include "tokenizer/tokenizer.h"

#include <filesystem>
#include <system_error>

#include "tokenizer/byte_level_bpe.h"

namespace strata::tokenizer {
namespace {

namespace fs = std::filesystem;

// Says what the tokenizer that is used instead was chosen over.
class DescribedTokenizer final : public Tokenizer {
 public:
  DescribedTokenizer(std::unique_ptr<Tokenizer> inner, std::string note)
      : inner_(std::move(inner)), note_(std::move(note)) {}
  std::vector<uint32_t> Encode(std::string_view text) const override { return inner_->Encode(text); }
  std::string Decode(const std::vector<uint32_t>& ids) const override { return inner_->Decode(ids); }
  std::unique_ptr<EncodeStream> NewStream() const override { return inner_->NewStream(); }
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  std::string description() const override { return inner_->description() + " (" + note_ + ")"; }

 private:
  std::unique_ptr<Tokenizer> inner_;
  std::string note_;
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> LoadHuggingFaceTokenizerJson(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return InvalidArgument(path + ": no such file");
  return LoadByteLevelBpe(path).tokenizer;
}

Result<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_dir) {
  std::error_code ec;
  if (!fs::exists(model_dir, ec)) {
    return InvalidArgument(model_dir +
                           ": no such directory; name a model directory with a tokenizer.json or tokenizer.model");
  }
  if (!fs::is_directory(model_dir, ec)) {
    return InvalidArgument(
        model_dir + " is not a directory; name the model directory that holds tokenizer.json or tokenizer.model");
  }
  const std::string json_path = (fs::path(model_dir) / "tokenizer.json").string();
  const std::string model_path = (fs::path(model_dir) / "tokenizer.model").string();
  const bool has_json = fs::is_regular_file(json_path, ec);
  const bool has_model = fs::is_regular_file(model_path, ec);
  if (has_json) {
    HuggingFaceLoad load = LoadByteLevelBpe(json_path);
    if (load.tokenizer.ok() || !load.unsupported_kind || !has_model) return std::move(load.tokenizer);
    // A tokenizer.json of another kind (Llama 2's and Gemma's are SentencePiece-style BPE): the
    // SentencePiece model it was converted from gives the same ids.
    STRATA_ASSIGN_OR_RETURN(auto sentencepiece, LoadSentencePieceModel(model_path));
    return std::unique_ptr<Tokenizer>(std::make_unique<DescribedTokenizer>(
        std::move(sentencepiece), "tokenizer.json passed over: " + load.tokenizer.status().message()));
  }
  if (has_model) return LoadSentencePieceModel(model_path);
  return InvalidArgument(
      model_dir +
      " has no tokenizer.json or tokenizer.model; strata tokenize reads a Hugging Face "
      "tokenizer.json (byte-level BPE) or a SentencePiece tokenizer.model from the model's directory");
}

}  // namespace strata::tokenizer
