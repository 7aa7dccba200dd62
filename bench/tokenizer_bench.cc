// Tokenizer speed on one core: MB/s (and tokens/s) of a text file through a model directory's
// tokenizer (tokenizer/tokenizer.h), the way `strata tokenize` runs it (a stream fed in blocks,
// its word cache cold at the start) and as one Encode of the whole text (the tokenizer's shared
// cache: cold on the first pass, warm after). Results go to docs/benchmarks.md with the machine.
//
//   tokenizer_bench MODEL_DIR TEXT_FILE [--passes N] [--block-mib M]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

void Report(const char* what, int pass, size_t bytes, size_t tokens, double seconds) {
  std::printf("%-22s pass %d: %8.2f MB/s  %10.0f tokens/s  (%zu bytes -> %zu tokens in %.3f s)\n", what, pass,
              bytes / seconds / 1e6, tokens / seconds, bytes, tokens, seconds);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: tokenizer_bench MODEL_DIR TEXT_FILE [--passes N] [--block-mib M]\n";
    return 2;
  }
  int passes = 3;
  size_t block_bytes = 4 << 20;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--passes") {
      passes = std::atoi(argv[i + 1]);
    } else if (flag == "--block-mib") {
      block_bytes = static_cast<size_t>(std::atof(argv[i + 1]) * (1 << 20));
    } else {
      std::cerr << "tokenizer_bench: unknown flag " << flag << "\n";
      return 2;
    }
  }
  const auto load_start = Clock::now();
  auto tokenizer = strata::tokenizer::LoadTokenizer(argv[1]);
  if (!tokenizer.ok()) {
    std::cerr << "tokenizer_bench: " << tokenizer.status().message() << "\n";
    return 2;
  }
  std::printf("%s: loaded in %.2f s\n", (*tokenizer)->description().c_str(), SecondsSince(load_start));
  std::ifstream in(argv[2], std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  const std::string text = contents.str();
  if (!in || text.empty()) {
    std::cerr << "tokenizer_bench: cannot read " << argv[2] << "\n";
    return 2;
  }
  for (int pass = 1; pass <= passes; ++pass) {
    auto start = Clock::now();
    auto stream = (*tokenizer)->NewStream();
    std::vector<uint32_t> ids;
    ids.reserve(text.size() / 3);
    for (size_t pos = 0; pos < text.size(); pos += block_bytes) {
      stream->Feed(std::string_view(text).substr(pos, block_bytes), &ids);
    }
    stream->Finish(&ids);
    Report("stream (cold cache)", pass, text.size(), ids.size(), SecondsSince(start));

    start = Clock::now();
    const std::vector<uint32_t> whole = (*tokenizer)->Encode(text);
    Report(pass == 1 ? "Encode (cold cache)" : "Encode (warm cache)", pass, text.size(), whole.size(),
           SecondsSince(start));
    if (whole != ids) {
      std::cerr << "tokenizer_bench: the stream and Encode disagree (" << ids.size() << " vs " << whole.size()
                << " ids)\n";
      return 1;
    }
  }
  return 0;
}
