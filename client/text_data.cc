#include "client/text_data.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>

#include "client/tokenize.h"
#include "storage/shard_store.h"
#include "tokenizer/tokenizer.h"

namespace strata::client {
namespace {

namespace fs = std::filesystem;

// What decides the ids: the tokenizer files' bytes and the text's identity (size, mtime).
Result<std::string> CacheKey(const DataSpec& data) {
  std::string material;
  for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json"}) {
    const fs::path path = fs::path(data.tokenizer) / name;
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) continue;
    std::ifstream in(path, std::ios::binary);
    std::ostringstream bytes;
    bytes << in.rdbuf();
    material += std::string(name) + '\0' + bytes.str() + '\0';
  }
  std::error_code ec;
  const auto size = fs::file_size(data.path, ec);
  if (ec) return IoError("cannot stat " + data.path + ": " + ec.message());
  const auto mtime = fs::last_write_time(data.path, ec).time_since_epoch().count();
  material += std::to_string(size) + ":" + std::to_string(mtime);
  const uint64_t hash = storage::Checksum({reinterpret_cast<const uint8_t*>(material.data()), material.size()});
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return std::string(hex);
}

}  // namespace

Status PrepareTextData(RunSpec* spec, const std::string& state_dir, int progress_every_s, std::ostream& log) {
  DataSpec& data = spec->data;
  if (data.format != TokenFormat::kText) return Status::Ok();
  STRATA_ASSIGN_OR_RETURN(auto tokenizer, tokenizer::LoadTokenizer(data.tokenizer));
  if (tokenizer->vocab_size() > spec->model.vocab) {
    return InvalidArgument("data.tokenizer = " + data.tokenizer + " has " + std::to_string(tokenizer->vocab_size()) +
                           " ids but model.vocab = " + std::to_string(spec->model.vocab) +
                           "; use the model's own tokenizer, or a larger model.vocab");
  }
  STRATA_ASSIGN_OR_RETURN(std::string key, CacheKey(data));
  const fs::path text(data.path);
  fs::path cache = text.parent_path() / (text.filename().string() + ".tok-" + key + ".u32");
  if (::access(text.parent_path().c_str(), W_OK) != 0) {
    std::error_code ec;
    fs::create_directories(fs::path(state_dir) / "token-cache", ec);
    cache = fs::path(state_dir) / "token-cache" / (text.filename().string() + ".tok-" + key + ".u32");
  }
  std::error_code ec;
  if (fs::is_regular_file(cache, ec)) {
    log << "data: " << data.path << " tokenized before, using " << cache.string() << std::endl;
  } else {
    log << "data: tokenizing " << data.path << " with " << data.tokenizer << " into " << cache.string() << std::endl;
    TokenizeRequest request;
    request.model_dir = data.tokenizer;
    request.input = data.path;
    request.out = cache.string();
    request.format = "u32";
    request.progress_every_s = progress_every_s;
    // Its summary on `log` too: a submit keeps stdout for the run id. Its error is said here, and
    // what comes back names the data (as `strata` prints every error: "strata: MESSAGE").
    if (Status st = TokenizeFile(request, log, log); !st.ok()) {
      log << "strata: " << st.message() << std::endl;
      if (st.code() == StatusCode::kInvalidArgument)
        return InvalidArgument("data.path = " + data.path + " could not be tokenized (above)");
      return IoError("tokenizing " + data.path + " into " + cache.string() + " failed (above)");
    }
  }
  const uintmax_t tokens = fs::file_size(cache, ec) / 4;
  if (ec || tokens < static_cast<uintmax_t>(spec->model.sequence + 1)) {
    return InvalidArgument("data.path = " + data.path + " gives " + std::to_string(tokens) +
                           " tokens, fewer than model.sequence + 1 = " + std::to_string(spec->model.sequence + 1) +
                           "; use a longer text or a shorter sequence");
  }
  data.path = cache.string();
  data.format = TokenFormat::kU32;
  data.tokenizer.clear();
  return Status::Ok();
}

}  // namespace strata::client
