// `strata tokenize MODEL_DIR INPUT --out FILE [--format u32|u16] [--force]`: a text file (or - for
// standard input) to a flat file of token ids, with the model's own tokenizer (docs/tokenize.md);
// the work is client/tokenize.h's. Progress on stderr, the closing summary on stdout.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>

#include "cli/command_set.h"
#include "cli/exit.h"
#include "client/tokenize.h"

namespace strata::cli {

void RegisterTokenizeCommand(CommandSet& set) {
  auto request = std::make_shared<client::TokenizeRequest>();
  auto* command = set.Add(
      "tokenize", "turn a text file into token ids with a model's tokenizer (tokenizer.json or tokenizer.model)",
      [request] {
        const Status st = client::TokenizeFile(*request, std::cerr, std::cout);
        return st.ok() ? kExitOk : Fail(st);
      });
  command->add_option("model_dir", request->model_dir, "the model's directory (a Hugging Face checkout)")->required();
  command->add_option("input", request->input, "a UTF-8 text file, or - for standard input")->required();
  command
      ->add_option("--out", request->out,
                   "the ids, flat little-endian (FILE.u32 / FILE.u16); written whole or not at all")
      ->required();
  command->add_option("--format", request->format, "u32, or u16 when every id is below 65536")
      ->check(CLI::IsMember({"u32", "u16"}));
  command->add_flag("--force", request->force, "replace an existing --out file");
  command
      ->add_option("--progress-every-s", request->progress_every_s,
                   "a progress line on stderr at most every this many seconds, or every 5% of the input if sooner")
      ->check(CLI::Range(1, 86400));
}

}  // namespace strata::cli
