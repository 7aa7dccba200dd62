// Issue #24, the CLI as a user meets it, through the real `strata` binary against a local cluster
// of one CPU worker: runs addressed by name, id prefix and `latest`; global options anywhere,
// --version, defaults in help, bash completion; submit saying what it knows (an auto mesh is
// planned when the run starts; a fixed mesh larger than the cluster is refused without --queue);
// progress into a pipe every 5% / N seconds; `status --watch` with a header and active runs only;
// `down` returning once its processes have exited.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::CommandResult;

class CliExperienceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = testing::MakeClusterScratchDir("/tmp/strata-cli-XXXXXX");
    auto up = Strata("up --workers 1");
    ASSERT_EQ(up.rc, 0) << up.err;
  }
  static void TearDownTestSuite() {
    Strata("down");
    if (!std::getenv("STRATA_KEEP_TEST_DIRS")) fs::remove_all(dir_);
  }

  static CommandResult Run(const std::string& command) { return testing::RunCommand(command, dir_); }
  static CommandResult Strata(const std::string& args) { return Run(std::string(STRATA_BIN_DIR) + "/strata " + args); }
  static json StrataJson(const std::string& args) { return testing::RunStrataJson(args, dir_); }

  // A tiny model; `parallel` is the [parallel] table ("" leaves every field auto).
  static std::string Spec(const std::string& name, int steps, const std::string& parallel = "") {
    const std::string path = dir_ + "/" + name + "-" + std::to_string(++specs_) + ".toml";
    std::ofstream(path) << "name = \"" << name
                        << "\"\n[model]\nlayers = 2\nhidden = 64\nheads = 4\nvocab = 256\nsequence = 32\n"
                        << "[data]\npath = \"corpus.txt\"\n[train]\nsteps = " << steps
                        << "\nglobal_batch = 8\nlr = 0.003\nseed = 7\ncheckpoint_every = 2\n"
                        << parallel;
    return path;
  }
  static std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }
  static std::string SubmitAndFollow(const std::string& spec) {
    auto r = Strata("submit " + spec + " --follow");
    EXPECT_EQ(r.rc, 0) << r.out << r.err;
    return FirstLine(r.out);
  }
  static bool Contains(const std::string& haystack, const std::string& needle) {
    return haystack.find(needle) != std::string::npos;
  }

  static std::string dir_;
  static int specs_;
};
std::string CliExperienceTest::dir_;
int CliExperienceTest::specs_ = 0;

TEST_F(CliExperienceTest, VersionHelpDefaultsGlobalOptionsAnywhereAndCompletion) {
  auto version = Strata("--version");
  EXPECT_EQ(version.rc, 0) << version.err;
  EXPECT_TRUE(Contains(version.out, "strata 0.")) << version.out;
  EXPECT_TRUE(Contains(version.out, "(git ")) << version.out;
  EXPECT_TRUE(Contains(version.out, "LibTorch ")) << version.out;
  EXPECT_TRUE(Contains(version.out, "CUDA ")) << version.out;
  EXPECT_FALSE(Contains(version.out, "@")) << "unconfigured placeholders: " << version.out;

  // Defaults in every help: a subcommand's and the top level's.
  auto up_help = Strata("up --help");
  EXPECT_EQ(up_help.rc, 0);
  EXPECT_TRUE(Contains(up_help.out, "=2000")) << "--heartbeat-timeout-ms default: " << up_help.out;
  EXPECT_TRUE(Contains(up_help.out, "=10000")) << "--replace-grace-ms default: " << up_help.out;
  EXPECT_TRUE(Contains(Strata("--help").out, "=3000")) << "--timeout-ms default";
  // RUN's help says what it may be.
  auto events_help = Strata("events --help");
  EXPECT_TRUE(Contains(events_help.out, "unique prefix")) << events_help.out;
  EXPECT_TRUE(Contains(events_help.out, "latest")) << events_help.out;

  // Global options after the subcommand: a state dir with no cluster is named in the error.
  const std::string elsewhere = dir_ + "/no-cluster-here";
  auto late = Strata("status --state-dir " + elsewhere);
  EXPECT_NE(late.rc, 0);
  EXPECT_TRUE(Contains(late.err, elsewhere)) << "--state-dir after the subcommand was not used: " << late.err;
  auto bad_cluster = Strata("workers --cluster nonsense");
  EXPECT_EQ(bad_cluster.rc, 2) << bad_cluster.err;
  EXPECT_TRUE(Contains(bad_cluster.err, "--cluster nonsense is not a coordinator address")) << bad_cluster.err;
  // ... and still before it; and with this cluster's state dir anywhere the listing works.
  EXPECT_EQ(Strata("--state-dir " + dir_ + "/state workers").rc, 0);
  EXPECT_EQ(Strata("workers --json --state-dir " + dir_ + "/state").rc, 0);

  // Completion: valid bash, made from the parser (every subcommand, nested ones and options).
  auto completion = Strata("completion bash");
  ASSERT_EQ(completion.rc, 0) << completion.err;
  for (const char* word :
       {"complete -F _strata strata", " checkpoints", " activations get", "--resume", "--queue", "--state-dir"}) {
    EXPECT_TRUE(Contains(completion.out, word)) << word << " missing from:\n" << completion.out;
  }
  std::ofstream(dir_ + "/completion.bash") << completion.out;
  auto syntax = Run("bash -n " + dir_ + "/completion.bash");
  EXPECT_EQ(syntax.rc, 0) << syntax.err;
  // It completes: subcommands after `strata`, options after `strata submit --`.
  auto complete =
      Run("bash -c 'source " + dir_ +
          "/completion.bash; COMP_WORDS=(strata che); COMP_CWORD=1; _strata; "
          "echo \"${COMPREPLY[@]}\"; COMP_WORDS=(strata submit --q); COMP_CWORD=2; _strata; echo \"${COMPREPLY[@]}\"'");
  EXPECT_TRUE(Contains(complete.out, "checkpoints")) << complete.out << complete.err;
  EXPECT_TRUE(Contains(complete.out, "--queue")) << complete.out << complete.err;
  EXPECT_EQ(Strata("completion fish").rc, 2);
}

TEST_F(CliExperienceTest, RunsAreAddressedByNamePrefixAndLatest) {
  const std::string alpha1 = SubmitAndFollow(Spec("alpha", 4));
  const std::string alpha2 = SubmitAndFollow(Spec("alpha", 4));
  const std::string beta = SubmitAndFollow(Spec("beta", 4));
  ASSERT_FALSE(alpha1.empty());
  ASSERT_NE(alpha1, alpha2);

  // `latest` is the newest run; a name is its newest run (saying so when it names several).
  EXPECT_EQ(StrataJson("status latest")["run_id"], beta);
  auto by_name = Strata("status alpha --json");
  EXPECT_EQ(by_name.rc, 0) << by_name.err;
  EXPECT_EQ(json::parse(by_name.out)["run_id"], alpha2);
  EXPECT_TRUE(Contains(by_name.err, "alpha names 2 runs; using the newest, " + alpha2)) << by_name.err;
  // A unique id prefix.
  const std::string prefix = alpha1.substr(0, alpha1.size() - 2);
  EXPECT_EQ(StrataJson("status " + prefix)["run_id"], alpha1);
  // A prefix of several ids is refused, listing them.
  auto ambiguous = Strata("events alpha-");
  EXPECT_EQ(ambiguous.rc, 2) << ambiguous.out;
  EXPECT_TRUE(Contains(ambiguous.err, "ambiguous")) << ambiguous.err;
  EXPECT_TRUE(Contains(ambiguous.err, alpha1) && Contains(ambiguous.err, alpha2)) << ambiguous.err;

  // Every command that takes RUN.
  json events = StrataJson("events beta");
  ASSERT_TRUE(events.is_array());
  ASSERT_FALSE(events.empty());
  EXPECT_TRUE(Contains(events[0]["message"].get<std::string>(), beta)) << events.dump();
  json checkpoints = StrataJson("checkpoints latest");
  ASSERT_TRUE(checkpoints.is_array());
  EXPECT_EQ(checkpoints.back()["run_id"], beta);
  auto exported = Strata("export " + prefix + " --out " + dir_ + "/exported");
  EXPECT_EQ(exported.rc, 0) << exported.err;
  EXPECT_TRUE(Contains(exported.out, "exported run " + alpha1)) << exported.out;
  auto activations = Strata("activations latest");  // resolved, then refused as not an extract run
  EXPECT_FALSE(Contains(activations.err, "latest")) << "RUN was not resolved: " << activations.err;
  const std::string resumed = SubmitAndFollow(Spec("alpha", 6) + " --resume alpha@2");
  json submitted = StrataJson("events " + resumed);
  EXPECT_TRUE(Contains(submitted[0]["message"].get<std::string>(), "resuming from " + alpha2 + " at step 2"))
      << submitted.dump();
  // cancel: a pending run (a fixed mesh of 2 on a 1-worker cluster, queued) by its name.
  auto queued = Strata("submit " + Spec("gamma", 4, "[parallel]\ndp = 2\npp = 1\ntp = 1\n") + " --queue");
  ASSERT_EQ(queued.rc, 0) << queued.err;
  auto cancel = Strata("cancel gamma");
  EXPECT_EQ(cancel.rc, 0) << cancel.err;
  EXPECT_TRUE(Contains(cancel.out, "cancelled " + FirstLine(queued.out))) << cancel.out;
  // A run that does not exist is still the coordinator's "no such run".
  EXPECT_NE(Strata("status no-such-run").rc, 0);
}

TEST_F(CliExperienceTest, SubmitSaysWhatItKnowsAndRefusesAMeshTheClusterCannotHold) {
  // Auto mesh: no made-up "on 1 worker(s) (dp=1 ...)" before the planner has chosen.
  const std::string auto_run = SubmitAndFollow(Spec("auto-mesh", 2));
  json events = StrataJson("events " + auto_run);
  ASSERT_FALSE(events.empty());
  const std::string submitted = events[0]["message"];
  EXPECT_TRUE(Contains(submitted, "planned when it starts")) << submitted;
  EXPECT_FALSE(Contains(submitted, "dp=1")) << submitted;
  // A fixed mesh names its workers.
  const std::string fixed = SubmitAndFollow(Spec("fixed-mesh", 2, "[parallel]\ndp = 1\npp = 1\ntp = 1\n"));
  EXPECT_TRUE(
      Contains(StrataJson("events " + fixed)[0]["message"].get<std::string>(), "on 1 worker(s) (dp=1 pp=1 tp=1)"));

  // dp x pp x tp = 2 > 1 live worker: refused at submit, naming the fields, unless --queue.
  const std::string big = Spec("too-big", 2, "[parallel]\ndp = 2\npp = 1\ntp = 1\n");
  auto refused = Strata("submit " + big);
  EXPECT_EQ(refused.rc, 2) << refused.out;
  EXPECT_TRUE(refused.out.empty()) << "a refused submit printed a run id: " << refused.out;
  EXPECT_TRUE(Contains(refused.err, "parallel.dp x parallel.pp x parallel.tp = 2 x 1 x 1 = 2 workers")) << refused.err;
  EXPECT_TRUE(Contains(refused.err, "1 live")) << refused.err;
  EXPECT_TRUE(Contains(refused.err, "--queue")) << refused.err;
  auto queued = Strata("submit " + big + " --queue");
  EXPECT_EQ(queued.rc, 0) << queued.err;
  EXPECT_EQ(StrataJson("status " + FirstLine(queued.out))["state"], "pending");
  EXPECT_EQ(Strata("cancel " + FirstLine(queued.out)).rc, 0);
}

TEST_F(CliExperienceTest, ProgressIntoAPipeIsEveryFivePercentAndWatchShowsActiveRuns) {
  // 100 steps into a pipe: a line every 5 steps (or 10 s) and the last, not one per step.
  auto followed = Strata("submit " + Spec("progress", 100) + " --follow");
  ASSERT_EQ(followed.rc, 0) << followed.err;
  std::istringstream lines(followed.out);
  int progress_lines = 0;
  std::string last_progress;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("step ", 0) == 0) {
      ++progress_lines;
      last_progress = line;
    }
  }
  EXPECT_GE(progress_lines, 2) << followed.out;
  EXPECT_LE(progress_lines, 21) << followed.out;
  // The ETA is the steps left at the last step's speed (8 x 32 tokens a step), not an average
  // since submit, which counted the load before step 1 as steps (a QLoRA run that loaded for
  // three minutes showed "ETA 22:42" at step 1 of 8 taking 0.65 s each).
  {
    std::istringstream again(followed.out);
    const std::regex progress_line(R"(^step +([0-9]+)/100 .* ([0-9]+) tok/s  ETA ([0-9]+):([0-9]+))");
    int checked = 0;
    for (std::string line; std::getline(again, line);) {
      std::smatch m;
      if (!std::regex_search(line, m, progress_line)) continue;
      const double left = 100 - std::stod(m[1]), tokens_per_second = std::stod(m[2]);
      const double eta = std::stod(m[3]) * 60 + std::stod(m[4]);
      const double expected = left * 8 * 32 / tokens_per_second;  // tok/s is printed rounded
      EXPECT_NEAR(eta, expected, 1.0 + expected * 0.01) << line;
      ++checked;
    }
    EXPECT_GE(checked, 1) << followed.out;
  }
  EXPECT_TRUE(Contains(last_progress, "100/100")) << followed.out;
  const std::string finished = FirstLine(followed.out);

  // --watch without RUN: a header, the active runs only (a queued one here), all with --all.
  auto queued = Strata("submit " + Spec("waiting", 4, "[parallel]\ndp = 2\npp = 1\ntp = 1\n") + " --queue");
  ASSERT_EQ(queued.rc, 0) << queued.err;
  const std::string pending = FirstLine(queued.out);
  auto watch = Run("timeout 3 " + std::string(STRATA_BIN_DIR) + "/strata status --watch");
  EXPECT_EQ(FirstLine(watch.out).rfind("RUN", 0), 0u) << watch.out;
  EXPECT_TRUE(Contains(watch.out, pending)) << watch.out;
  EXPECT_FALSE(Contains(watch.out, finished)) << watch.out;
  auto watch_all = Run("timeout 3 " + std::string(STRATA_BIN_DIR) + "/strata status --watch --all");
  EXPECT_TRUE(Contains(watch_all.out, pending) && Contains(watch_all.out, finished)) << watch_all.out;
  ASSERT_EQ(Strata("cancel " + pending).rc, 0);
  // Nothing active: the header, a note, and it returns.
  auto idle = Strata("status --watch");
  EXPECT_EQ(idle.rc, 0) << idle.err;
  EXPECT_TRUE(Contains(idle.out, "(no active run")) << idle.out;
}

// Last: it stops the suite's cluster.
// --set varies a spec from the command line, typed like its key; a key the spec does not have is
// named.
TEST_F(CliExperienceTest, SetVariesTheSpecFromTheCommandLine) {
  const std::string run = SubmitAndFollow(Spec("delta", 6) + " --set train.steps=3 --set name=delta-short");
  const json status = StrataJson("status " + run);
  EXPECT_EQ(status["total_steps"], 3) << status.dump();
  EXPECT_EQ(status["name"], "delta-short") << status.dump();
  EXPECT_EQ(status["state"], "finished") << status.dump();
  auto unknown = Strata("submit " + Spec("eps", 2) + " --set train.stepz=3");
  EXPECT_EQ(unknown.rc, 2);
  EXPECT_TRUE(Contains(unknown.err, "unknown key 'train.stepz'")) << unknown.err;
  auto typed = Strata("submit " + Spec("eps", 2) + " --set train.steps=two");
  EXPECT_EQ(typed.rc, 2);
  EXPECT_TRUE(Contains(typed.err, "--set train.steps=two: train.steps is an integer")) << typed.err;
  const json planned =
      StrataJson("plan " + Spec("zeta", 2) + " --set train.global_batch=16 --set parallel.dp=1 --json");
  EXPECT_EQ(planned["dp"], 1) << planned.dump();
  EXPECT_EQ(planned["micro_batch"].get<int64_t>() * planned["gradient_accumulation"].get<int64_t>(), 16)
      << planned.dump();
}

TEST_F(CliExperienceTest, DownReturnsOnlyOnceItsProcessesHaveExited) {
  auto cluster = json::parse(testing::ReadFile(dir_ + "/state/cluster.json"));
  std::vector<int> pids;
  for (auto& p : cluster["processes"]) pids.push_back(p["pid"].get<int>());
  ASSERT_GE(pids.size(), 2u);
  auto down = Strata("down");
  EXPECT_EQ(down.rc, 0) << down.err;
  EXPECT_TRUE(Contains(down.out, "cluster down: 2 process(es) exited")) << down.out;
  for (int pid : pids) {
    // Gone, or a zombie its reaper has not collected yet: either way it has exited.
    // (A pid reused since by another program is not ours: its command line has no "strata".)
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string pid_field, comm, state;
    stat >> pid_field >> comm >> state;
    const std::string cmdline = testing::ReadFile("/proc/" + std::to_string(pid) + "/cmdline");
    EXPECT_TRUE(!stat || state == "Z" || !Contains(cmdline, "strata"))
        << "pid " << pid << " (" << comm << ") still " << state << " after `strata down` returned";
  }
  EXPECT_FALSE(fs::exists(dir_ + "/state/cluster.json"));
}

}  // namespace
}  // namespace strata
