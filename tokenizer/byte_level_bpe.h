// Hugging Face tokenizer.json files that are byte-level BPE (private to tokenizer/; the public
// entry points are in tokenizer.h).
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace strata::tokenizer {

struct HuggingFaceLoad {
  Result<std::unique_ptr<Tokenizer>> tokenizer = Status(StatusCode::kInvalidArgument, "not loaded");
  // The file is well-formed but of a kind this library does not read (another model type,
  // pre-tokenizer or normalizer): a tokenizer.model beside it may be used instead.
  bool unsupported_kind = false;
};

HuggingFaceLoad LoadByteLevelBpe(const std::string& path);

}  // namespace strata::tokenizer
