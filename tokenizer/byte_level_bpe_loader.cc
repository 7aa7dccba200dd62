// Reads a Hugging Face tokenizer.json into a ByteLevelBpeTokenizer (byte_level_bpe_internal.h),
// checking each field it uses; what the fields mean for encoding: byte_level_bpe.cc.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "tokenizer/byte_level_bpe.h"
#include "tokenizer/byte_level_bpe_internal.h"

namespace strata::tokenizer {
namespace internal {
namespace {

using json = nlohmann::json;

// GPT-2's pre-tokenizer regex (ByteLevel with use_regex): contractions, letters, digits, other
// symbols, each with one optional leading space; whitespace runs leave their last space to the
// next word.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

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
  Status Bad(const std::string& field, const std::string& what) const {
    return InvalidArgument(path_ + ": " + field + " " + what);
  }
  // A well-formed file of a kind this library does not read.
  Status Unsupported(const std::string& field, const std::string& what) {
    unsupported_ = true;
    return InvalidArgument(path_ + ": " + field + " " + what);
  }

  Status LoadModel(const json& model, ByteLevelBpeTokenizer* t,
                   std::unordered_map<std::string, uint32_t>* vocab_by_text);
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
    result.tokenizer = InvalidArgument(path_ + ": not valid JSON (" + e.what() +
                                       "); the file is damaged or cut short: fetch it again");
    return result;
  }
  auto fail = [&](Status status) {
    result.tokenizer = std::move(status);
    result.unsupported_kind = unsupported_;
    return std::move(result);
  };
  if (!root.is_object()) return fail(Bad("(the top level)", "is not a JSON object: this is not a tokenizer.json"));
  const auto model = root.find("model");
  if (model == root.end() || !model->is_object())
    return fail(Bad("model", "is missing or not an object: this is not a tokenizer.json"));

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
    return fail(
        Unsupported("pre_tokenizer",
                    std::string("is null: a BPE without the ByteLevel pre-tokenizer is not byte-level") + kWhatWeRead));
  }
  if (Status st = LoadPreTokenizer(*pre_tokenizer, "pre_tokenizer", &t->stages_); !st.ok()) return fail(st);
  // The byte-level alphabet is applied last: a split after it would see 'Ġ' for ' '.
  bool byte_level_last = false;
  for (size_t i = 0; i < t->stages_.size(); ++i) {
    const bool byte_level = t->stages_[i].byte_level;
    if (byte_level && i + 1 != t->stages_.size()) {
      return fail(Unsupported(t->stages_[i + 1].field,
                              "comes after ByteLevel; strata reads pre-tokenizers whose ByteLevel is the last step"));
    }
    byte_level_last = byte_level;
  }
  if (!byte_level_last) {
    return fail(Unsupported("pre_tokenizer",
                            std::string("has no ByteLevel step: the vocabulary is not byte-level") + kWhatWeRead));
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

Status Loader::LoadModel(const json& model, ByteLevelBpeTokenizer* t,
                         std::unordered_map<std::string, uint32_t>* vocab_by_text) {
  const auto type = model.find("type");
  if (type != model.end() && !(type->is_string() && type->get<std::string>() == "BPE")) {
    return Unsupported("model.type", "is " + type->dump() + kWhatWeRead);
  }
  const auto vocab = model.find("vocab");
  const auto merges = model.find("merges");
  if (type == model.end() &&
      (merges == model.end() || vocab == model.end())) {  // untagged: tokenizers infers the model from its fields
    return Unsupported("model", std::string("has no \"type\" and is not a BPE (no vocab and merges)") + kWhatWeRead);
  }
  if (vocab == model.end() || !vocab->is_object())
    return Bad("model.vocab", "is missing or not an object of token: id");
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
      return Unsupported(std::string("model.") + key,
                         "is " + it->dump() + ": a word-piece style BPE, not byte-level" + kWhatWeRead);
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
    if (it == vocab_by_text->end())
      return Bad("model.unk_token", Quoted(unk->get<std::string>()) + " is not in model.vocab");
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
    const auto l = vocab_by_text->find(left), r = vocab_by_text->find(right),
               merged = vocab_by_text->find(left + right);
    if (l == vocab_by_text->end()) return Bad(field, "names " + Quoted(left) + ", which is not in model.vocab");
    if (r == vocab_by_text->end()) return Bad(field, "names " + Quoted(right) + ", which is not in model.vocab");
    if (merged == vocab_by_text->end())
      return Bad(field, "makes " + Quoted(left + right) + ", which is not in model.vocab");
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
  return Unsupported(field + ".type",
                     "is " + type->dump() + "; strata reads no normalizer or NFC (Qwen2)" + kWhatWeRead);
}

Status Loader::LoadPreTokenizer(const json& pre_tokenizer, const std::string& field,
                                std::vector<PreTokenizerStage>* stages) {
  if (!pre_tokenizer.is_object()) return Bad(field, "is " + pre_tokenizer.dump() + ", not an object");
  const auto type = pre_tokenizer.find("type");
  if (type == pre_tokenizer.end() || !type->is_string()) return Bad(field + ".type", "is missing");
  const std::string name = type->get<std::string>();
  if (name == "Sequence") {
    const auto list = pre_tokenizer.find("pretokenizers");
    if (list == pre_tokenizer.end() || !list->is_array())
      return Bad(field + ".pretokenizers", "is missing or not a list");
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
    auto regex =
        kind == "Regex" ? Regex::Compile(text.get<std::string>()) : Regex::CompileLiteral(text.get<std::string>());
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
      return Bad(field + ".behavior",
                 "is " + (behavior == pre_tokenizer.end() ? std::string("missing") : behavior->dump()) +
                     ", not Isolated, Removed, MergedWithPrevious, MergedWithNext or Contiguous");
    }
    STRATA_ASSIGN_OR_RETURN(stage.invert, OptionalBool(pre_tokenizer, "invert", field, false));
  } else {
    return Unsupported(
        field + ".type",
        "is " + type->dump() + "; strata reads ByteLevel, Split and Sequence pre-tokenizers" + kWhatWeRead);
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
}  // namespace internal

HuggingFaceLoad LoadByteLevelBpe(const std::string& path) { return internal::Loader(path).Load(); }

}  // namespace strata::tokenizer
