// A text file (or - for standard input) to a flat file of token ids, with the model's own
// tokenizer (tokenizer/tokenizer.h; docs/tokenize.md): the work of `strata tokenize MODEL_DIR
// INPUT --out FILE` (cli/tokenize_command.cc) and of a submit's data.format = "text"
// (text_data.h). Reads INPUT in blocks, so a file of any size streams through; writes FILE
// atomically (a temporary file beside it, renamed when complete, removed on SIGINT / SIGTERM).
#pragma once

#include <iosfwd>
#include <string>

#include "common/status.h"

namespace strata::client {

struct TokenizeRequest {
  std::string model_dir;
  std::string input;  // a file, or "-" for standard input
  std::string out;
  std::string format = "u32";  // little-endian uint32 ids, or uint16 when the vocabulary fits
  bool force = false;          // replace an existing --out
  int progress_every_s = 10;   // a progress line at most this often (or every 5%)
};

// Progress lines and warnings go to `log`, the closing "wrote N token ids" line to `summary`.
// InvalidArgument for what the request or the input gets wrong (the CLI's exit 2), another code
// for I/O (exit 1); the message names the file.
Status TokenizeFile(const TokenizeRequest& request, std::ostream& log, std::ostream& summary);

}  // namespace strata::client
