// Spec mutation fuzzer (issue #20): takes the example run specs, mutates their TOML (numbers
// replaced by huge, negative, zero, NaN and infinite values; lines dropped and duplicated;
// garbage and NUL bytes; deep nesting; long strings; wrong types; keys from every table) and runs
// the parse + validation + planning path of `strata submit` / `strata plan` on each: in a forked
// child under RLIMIT_AS (the library calls, fast), and every --binary-every inputs through the
// real binary (`strata plan SPEC --cluster-spec` and `strata submit SPEC` against a coordinator
// that is not there). Each answer must come within --time-limit-ms without a crash (a signal, an
// exit code other than 0/1/2 from the binary, or a broken check in the child), in less than
// --memory-limit-mib. A failing input is saved under --scratch as failure-N.toml.
//
//   spec_fuzz --examples examples --strata build/bin/strata --seed 1 --iterations 300   # CI (ctest spec_fuzz)
//   build/bin/spec_fuzz --examples examples --strata build/bin/strata --seed $RANDOM --iterations 200000 --binary-every
//   200
//
// Checks on what is accepted: every number within its bound (spec/run_spec.h), the name
// valid, the canonical TOML parsing back to the same TOML, and every planner estimate (or the
// planner's refusal) free of negative byte counts.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "shard/planner.h"
#include "spec/run_spec.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

struct Options {
  std::string examples = "examples";
  std::string strata;  // empty: library calls only
  std::string scratch;
  uint64_t seed = 1;
  int64_t iterations = 300;
  int64_t binary_every = 25;
  int64_t time_limit_ms = 2000;
  int64_t memory_limit_mib = 1024;
};

// ------------------------------------------------------------------ mutations

const char* const kNumbers[] = {"2147483648",
                                "9223372036854775807",
                                "-9223372036854775808",
                                "1e308",
                                "-1e308",
                                "nan",
                                "inf",
                                "-inf",
                                "-1",
                                "0",
                                "1",
                                "1099511627776",
                                "4611686018427387904",
                                "0x7fffffff",
                                "1_000_000",
                                "3.5",
                                "99999999999999999999",
                                "1024",
                                "1025",
                                "65536",
                                "16777216",
                                "16777217",
                                "1048577",
                                "1000000001",
                                "1e-320",
                                "-0.0",
                                "+7",
                                "0o777",
                                "0b1011"};
const char* const kValues[] = {"\"auto\"",
                               "\"\"",
                               "\"all\"",
                               "true",
                               "false",
                               "[]",
                               "[1, 2, 3]",
                               "[1, 9223372036854775807]",
                               "[\"resid_post\", \"mlp_out\"]",
                               "{ a = 1 }",
                               "1979-05-27T07:32:00Z",
                               "\"x\\u0000y\"",
                               "\"\\u001b[2J\"",
                               "\"bf16\"",
                               "\"llama\"",
                               "\"extract\"",
                               "\"cosine\"",
                               "[[1], [2]]"};
const char* const kKeys[] = {
    "name",         "kind",      "family",      "layers",           "hidden",    "heads",        "kv_heads", "ffn",
    "vocab",        "sequence",  "rope_theta",  "norm_eps",         "init_from", "path",         "format",   "steps",
    "global_batch", "lr",        "lr_schedule", "warmup_steps",     "min_lr",    "weight_decay", "beta1",    "beta2",
    "eps",          "grad_clip", "seed",        "checkpoint_every", "precision", "dp",           "pp",       "tp",
    "micro_batch",  "zero",      "recompute",   "keep_gathered",    "stages",    "threads",      "sites",    "dtype",
    "batch",        "tokens",    "mode"};
const char* const kTables[] = {"[model]",  "[data]",    "[train]",   "[parallel]",
                               "[worker]", "[extract]", "[[nodes]]", "[model.sub]"};

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  std::string Mutate(std::string text) {
    const int rounds = 1 + static_cast<int>(rng_() % 4);
    for (int i = 0; i < rounds; ++i) text = Once(std::move(text));
    return text;
  }

 private:
  template <typename T, size_t N>
  const T& Pick(const T (&list)[N]) {
    return list[rng_() % N];
  }
  size_t Below(size_t n) { return n == 0 ? 0 : rng_() % n; }

  std::vector<std::string> Lines(const std::string& text) {
    std::vector<std::string> lines;
    std::string line;
    std::istringstream in(text);
    while (std::getline(in, line)) lines.push_back(line);
    return lines;
  }
  static std::string Join(const std::vector<std::string>& lines) {
    std::string out;
    for (const auto& l : lines) out += l + "\n";
    return out;
  }

  std::string Once(std::string text) {
    std::vector<std::string> lines = Lines(text);
    switch (rng_() % 12) {
      case 0:
      case 1: {  // a number replaced
        static const std::regex number(R"((^|[=\[, ])(-?[0-9][0-9_.eE+-]*))");
        std::vector<std::pair<size_t, size_t>> spots;
        for (auto it = std::sregex_iterator(text.begin(), text.end(), number); it != std::sregex_iterator(); ++it) {
          spots.push_back({static_cast<size_t>(it->position(2)), static_cast<size_t>(it->length(2))});
        }
        if (spots.empty()) return text;
        const auto [pos, len] = spots[Below(spots.size())];
        return text.replace(pos, len, Pick(kNumbers));
      }
      case 2:  // a line dropped
        if (!lines.empty()) lines.erase(lines.begin() + static_cast<long>(Below(lines.size())));
        return Join(lines);
      case 3:  // a line duplicated (duplicate keys, repeated tables)
        if (!lines.empty()) {
          const size_t i = Below(lines.size());
          lines.insert(lines.begin() + static_cast<long>(i), lines[i]);
        }
        return Join(lines);
      case 4: {  // garbage bytes, NUL among them
        std::string junk(1 + Below(16), '\0');
        for (auto& c : junk) c = static_cast<char>(rng_() % 4 == 0 ? 0 : rng_());
        return text.insert(Below(text.size() + 1), junk);
      }
      case 5: {  // deep nesting: arrays or inline tables
        const size_t depth = 1 + Below(rng_() % 2 ? 100 : 20000);
        std::string open, close;
        const bool arrays = rng_() % 2;
        for (size_t i = 0; i < depth; ++i) open += arrays ? "[" : "{ a = ", close += arrays ? "]" : " }";
        lines.insert(lines.begin() + static_cast<long>(Below(lines.size() + 1)),
                     std::string(Pick(kKeys)) + " = " + open + "1" + close);
        return Join(lines);
      }
      case 6: {  // a long string value
        const std::string value =
            "\"" + std::string(1 + Below(rng_() % 2 ? 200 : 300000), "a_\\u0007."[rng_() % 4 == 0 ? 2 : 0]) + "\"";
        lines.insert(lines.begin() + static_cast<long>(Below(lines.size() + 1)),
                     std::string(Pick(kKeys)) + " = " + value);
        return Join(lines);
      }
      case 7:  // the name replaced by something unsafe
        lines.insert(lines.begin(), std::string("name = ") + Pick(kValues));
        return Join(lines);
      case 8: {  // a value replaced by another type
        if (lines.empty()) return text;
        std::string& line = lines[Below(lines.size())];
        const size_t eq = line.find('=');
        if (eq != std::string::npos) line = line.substr(0, eq + 1) + " " + Pick(kValues);
        return Join(lines);
      }
      case 9:  // truncated
        return text.substr(0, Below(text.size() + 1));
      case 10: {  // a key of any table, with a hostile number or value
        const std::string value = rng_() % 2 ? Pick(kNumbers) : Pick(kValues);
        lines.insert(lines.begin() + static_cast<long>(Below(lines.size() + 1)),
                     std::string(Pick(kKeys)) + " = " + value);
        return Join(lines);
      }
      default:  // a table header
        lines.insert(lines.begin() + static_cast<long>(Below(lines.size() + 1)), Pick(kTables));
        return Join(lines);
    }
  }

  std::mt19937_64 rng_;
};

// ------------------------------------------------------------------ the checks (in the child)

bool Negative(const std::string& text) {
  static const std::regex negative(R"((^|[ (=])-[0-9])");
  return std::regex_search(text, negative);
}

// 0: fine; 3: a check failed (printed).
int CheckSpec(const std::string& text, const std::string& base_dir) {
  auto fail = [&](const std::string& what) {
    std::cerr << "spec_fuzz: check failed: " << what << std::endl;
    return 3;
  };
  (void)ParseStoredRunSpec(text);  // the coordinator's and status's path: must not crash either
  auto spec = ParseRunSpec(text, base_dir, /*check_files=*/false);
  if (!spec.ok()) {
    if (spec.status().code() != StatusCode::kInvalidArgument)
      return fail("refused with a non-InvalidArgument code: " + spec.status().ToString());
    return 0;
  }
  const ModelSpec& m = spec->model;
  namespace b = spec_bounds;
  if (m.layers > b::kLayers || m.hidden > b::kHidden || m.heads > b::kHeads || m.kv_heads > b::kHeads ||
      m.ffn > b::kFfn || m.vocab > b::kVocab || m.sequence > b::kSequence || spec->train.steps > b::kSteps ||
      spec->train.global_batch > b::kGlobalBatch || spec->worker.threads > b::kThreads ||
      spec->extract.batch > b::kExtractBatch) {
    return fail("accepted a number over its bound");
  }
  if (!std::isfinite(spec->train.lr) || !std::isfinite(spec->model.rope_theta))
    return fail("accepted a non-finite float");
  if (!(spec->train.eps > 0 && spec->train.eps <= b::kMaxEps)) return fail("accepted train.eps outside (0, 1e-2]");
  if (!ValidateRunName(spec->name).ok()) return fail("accepted the name " + EscapeForTerminal(spec->name));
  const std::string canonical = RunSpecToToml(*spec);
  auto again = ParseRunSpec(canonical, "", false);
  if (!again.ok()) return fail("canonical TOML does not parse back: " + again.status().ToString());
  if (RunSpecToToml(*again) != canonical) return fail("canonical TOML does not round-trip");
  if (spec->is_extract()) return 0;
  // The planner on a CPU cluster as `strata up` makes one, and on a GPU cluster as --cluster-spec.
  shard::ClusterView cpus, gpus;
  for (int i = 0; i < 2; ++i) {
    shard::WorkerView w{"cpu" + std::to_string(i), int64_t{8} << 30, int64_t{6} << 30, "host", "tcp", 1e11, 0, false};
    cpus.workers.push_back(w);
  }
  for (int i = 0; i < 8; ++i)
    gpus.workers.push_back({"gpu" + std::to_string(i), int64_t{80} << 30, int64_t{78} << 30, "n0"});
  for (const shard::ClusterView* cluster : {&cpus, &gpus}) {
    auto plan = shard::ChoosePlan(spec->model, shard::JobForRun(*spec), *cluster);
    if (!plan.ok()) {
      if (Negative(plan.status().message()))
        return fail("negative number in the planner's refusal: " + plan.status().message());
      continue;
    }
    for (const auto& w : plan->workers) {
      const auto& e = w.memory;
      if (e.weights < 0 || e.gradients < 0 || e.optimizer_state < 0 || e.activations < 0 ||
          e.communication_buffers < 0 || e.total() < 0) {
        return fail("negative estimate on " + w.worker);
      }
    }
  }
  if (!spec->parallel.automatic.count("pp") && spec->parallel.pp > 1)
    (void)shard::BalancedStages(spec->model, spec->parallel.pp);
  return 0;
}

// ------------------------------------------------------------------ running one answer

struct Outcome {
  bool ok = true;
  std::string why;
  double ms = 0;
  int64_t rss_kib = 0;
};

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Runs `child` in a fork under RLIMIT_AS (if `limit_as`), waits at most `time_limit_ms`, and
// judges its end: `allowed_exit(code)` for a normal exit, any signal a failure.
template <typename Child, typename Allowed>
Outcome RunForked(const Options& o, bool limit_as, Child child, Allowed allowed_exit) {
  Outcome out;
  const int64_t start = NowUs();
  const pid_t pid = fork();
  if (pid < 0) return {false, std::string("fork: ") + std::strerror(errno)};
  if (pid == 0) {
    if (limit_as) {
      const rlim_t bytes = static_cast<rlim_t>(o.memory_limit_mib) << 20;
      rlimit limit{bytes, bytes};
      setrlimit(RLIMIT_AS, &limit);
    }
    _exit(child());
  }
  int status = 0;
  rusage usage{};
  bool timed_out = false;
  while (true) {
    const pid_t done = wait4(pid, &status, WNOHANG, &usage);
    if (done == pid) break;
    if ((NowUs() - start) / 1000 > o.time_limit_ms) {
      kill(pid, SIGKILL);
      wait4(pid, &status, 0, &usage);
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  out.ms = (NowUs() - start) / 1000.0;
  out.rss_kib = usage.ru_maxrss;
  if (timed_out) return {false, "no answer within " + std::to_string(o.time_limit_ms) + " ms", out.ms, out.rss_kib};
  if (WIFSIGNALED(status))
    return {false, std::string("killed by signal ") + strsignal(WTERMSIG(status)), out.ms, out.rss_kib};
  if (!allowed_exit(WEXITSTATUS(status)))
    return {false, "exit code " + std::to_string(WEXITSTATUS(status)), out.ms, out.rss_kib};
  if (out.rss_kib > o.memory_limit_mib * 1024)
    return {false, "peak RSS " + std::to_string(out.rss_kib / 1024) + " MiB", out.ms, out.rss_kib};
  return out;
}

Outcome RunBinary(const Options& o, const std::vector<std::string>& args) {
  return RunForked(
      o, /*limit_as=*/false,
      [&] {
        const int null = open("/dev/null", O_RDWR);
        dup2(null, STDIN_FILENO), dup2(null, STDOUT_FILENO), dup2(null, STDERR_FILENO);
        std::vector<char*> argv;
        for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        execv(argv[0], argv.data());
        return 127;
      },
      [](int code) { return code == 0 || code == 1 || code == 2; });
}

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--examples")
      o.examples = value;
    else if (flag == "--strata")
      o.strata = value;
    else if (flag == "--scratch")
      o.scratch = value;
    else if (flag == "--seed")
      o.seed = std::stoull(value);
    else if (flag == "--iterations")
      o.iterations = std::stoll(value);
    else if (flag == "--binary-every")
      o.binary_every = std::stoll(value);
    else if (flag == "--time-limit-ms")
      o.time_limit_ms = std::stoll(value);
    else if (flag == "--memory-limit-mib")
      o.memory_limit_mib = std::stoll(value);
    else {
      std::cerr << "spec_fuzz: unknown flag " << flag << " (see the comment at the top of tests/spec_fuzz.cc)"
                << std::endl;
      return 2;
    }
  }
  const bool own_scratch = o.scratch.empty();
  if (own_scratch) {
    char tmpl[] = "/tmp/strata-spec-fuzz-XXXXXX";
    o.scratch = mkdtemp(tmpl);
  }
  fs::create_directories(o.scratch);
  std::vector<std::pair<std::string, std::string>> examples;  // path, text
  for (const auto& entry : fs::directory_iterator(o.examples)) {
    if (entry.path().extension() != ".toml") continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    examples.push_back({entry.path().string(), text.str()});
  }
  std::sort(examples.begin(), examples.end());  // the seed alone decides the inputs
  if (examples.empty()) {
    std::cerr << "spec_fuzz: no *.toml in " << o.examples << std::endl;
    return 2;
  }
  const std::string cluster_spec = o.scratch + "/cluster.toml";
  std::ofstream(cluster_spec) << "[[nodes]]\ncount = 2\ngpus = 4\nmemory = \"80GiB\"\n";
  Mutator mutator(o.seed);
  std::mt19937_64 pick(o.seed ^ 0x9e3779b97f4a7c15ull);
  int64_t failures = 0, binary_runs = 0, accepted = 0;
  double max_lib_ms = 0, max_bin_ms = 0;
  int64_t max_lib_rss = 0, max_bin_rss = 0;
  const int64_t started = NowUs();
  auto report = [&](const std::string& what, const Outcome& r, const std::string& text) {
    const std::string file = o.scratch + "/failure-" + std::to_string(failures++) + ".toml";
    std::ofstream(file, std::ios::binary) << text;
    std::cerr << "spec_fuzz: FAILED (" << what << "): " << r.why << " after " << r.ms << " ms; input saved as " << file
              << std::endl;
  };
  for (int64_t i = 0; i < o.iterations; ++i) {
    const auto& [path, original] = examples[pick() % examples.size()];
    const std::string text = mutator.Mutate(original);
    const std::string base = fs::path(path).parent_path().string();
    Outcome lib = RunForked(
        o, /*limit_as=*/true, [&] { return CheckSpec(text, base); }, [](int code) { return code == 0; });
    max_lib_ms = std::max(max_lib_ms, lib.ms), max_lib_rss = std::max(max_lib_rss, lib.rss_kib);
    if (!lib.ok) report("library", lib, text);
    if (ParseRunSpec(text, base, false).ok()) ++accepted;
    if (!o.strata.empty() && o.binary_every > 0 && i % o.binary_every == 0) {
      const std::string file = o.scratch + "/spec.toml";  // a relative data path resolves here (and is missing: exit 2)
      std::ofstream(file, std::ios::binary) << text;
      for (const std::vector<std::string>& args :
           {std::vector<std::string>{o.strata, "plan", file, "--cluster-spec", cluster_spec},
            std::vector<std::string>{o.strata, "--cluster", "ipc://" + o.scratch + "/nobody.sock", "--timeout-ms",
                                     "200", "submit", file}}) {
        Outcome bin = RunBinary(o, args);
        ++binary_runs;
        max_bin_ms = std::max(max_bin_ms, bin.ms), max_bin_rss = std::max(max_bin_rss, bin.rss_kib);
        if (!bin.ok) report("strata " + args[1] + (args[1] == "--cluster" ? " submit" : ""), bin, text);
      }
      fs::remove(file);
    }
  }
  std::printf(
      "spec_fuzz: seed %llu, %lld inputs (%lld accepted), %lld runs of strata, %.1f s; library: max %.1f ms, max RSS "
      "%.1f MiB; "
      "binary: max %.1f ms, max RSS %.1f MiB; %lld failure(s)\n",
      static_cast<unsigned long long>(o.seed), static_cast<long long>(o.iterations), static_cast<long long>(accepted),
      static_cast<long long>(binary_runs), (NowUs() - started) / 1e6, max_lib_ms, max_lib_rss / 1024.0, max_bin_ms,
      max_bin_rss / 1024.0, static_cast<long long>(failures));
  if (own_scratch && failures == 0 && !std::getenv("STRATA_KEEP_TEST_DIRS")) fs::remove_all(o.scratch);
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) { return strata::Main(argc, argv); }
