// data.format = "text": a submit (submit.cc: `strata submit`, the Python package) turns the text
// into token ids with the model's own tokenizer once, into a cached u32 file, and the run reads
// that: workers read ids only (and never link a tokenizer: Debian's libsentencepiece carries a
// protobuf that clashes with LibTorch's).
#pragma once

#include <iosfwd>

#include "common/status.h"
#include "spec/run_spec.h"

namespace strata::client {

// For a spec with data.format = "text": the cache file is DATA.tok-<16 hex>.u32 beside the text
// (or, where that directory is not writable, under STATE_DIR/token-cache), the hex an XXH3 of
// the tokenizer files' bytes and the text's size and modification time: an edited text or
// another tokenizer gets a new file, an unchanged one is reused. Tokenizes when the cache is
// missing (progress and the tokenizer's summary on `log`), then points spec->data at it (format
// "u32"). InvalidArgument when the tokenizer's vocabulary does not fit model.vocab or the text
// gives fewer than model.sequence + 1 tokens. A spec of any other format is left as it is.
Status PrepareTextData(RunSpec* spec, const std::string& state_dir, int progress_every_s, std::ostream& log);

}  // namespace strata::client
