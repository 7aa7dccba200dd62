// `--set key=value` on `strata submit` and `strata plan`: a run spec varied from the command line
// (torchtitan's `--training.steps 10`) without editing its file.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace strata::client {

// `toml_text` with each "key=value" of `overrides` set, in order (a later one wins). `key` is a
// TOML path, "train.steps" or "name"; tables are created as needed. The value is typed like the
// key: where the spec already holds it, as that value's type (an integer stays an integer: "ten"
// is refused naming the key); where it does not, as TOML reads it ("10", "0.5", "true",
// "[1, 2]", "{ type = \"linear\", factor = 2.0 }"), else as a string ("auto", a path).
// InvalidArgument names the override. Unknown keys are the run spec parser's to name.
Result<std::string> ApplySpecOverrides(const std::string& toml_text, const std::vector<std::string>& overrides);

}  // namespace strata::client
