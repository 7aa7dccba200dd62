// `strata tokenize MODEL_DIR INPUT --out FILE [--format u32|u16] [--force]`: a text file (or - for
// standard input) to a flat file of token ids, with the model's own tokenizer (tokenizer/tokenizer.h;
// docs/tokenize.md). Reads INPUT in blocks, so a file of any size streams through; writes FILE
// atomically (a temporary file beside it, renamed when complete).
#pragma once

#include <string>

namespace strata::cli {

struct TokenizeRequest {
  std::string model_dir;
  std::string input;  // a file, or "-" for standard input
  std::string out;
  std::string format = "u32";      // little-endian uint32 ids, or uint16 when the vocabulary fits
  bool force = false;              // replace an existing --out
  int progress_every_s = 10;       // a progress line on stderr at most this often (or every 5%)
  bool summary_to_stderr = false;  // the closing "wrote N token ids" line (submit keeps stdout for the run id)
};

// The work itself, for tests and other callers: exit code as Run().
int Tokenize(const TokenizeRequest& request);

}  // namespace strata::cli
