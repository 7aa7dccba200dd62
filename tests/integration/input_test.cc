// Issue #20, "Nothing lost, nothing wedged": bad input to the real `strata` binary is refused at
// once with exit 2 and a message naming the field or flag, the value and the rule, and nothing is
// started, grown without bound, blocked on, overwritten or aborted. Most cases need no cluster
// (they are refused before one is contacted); the last starts a bare coordinator on a store that
// holds names from before the name rule, to check they print escaped.
#include <capnp/message.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/net.h"
#include "schema/envelope.h"
#include "spec/run_spec.h"
#include "storage/keys.h"
#include "storage/shard_store.h"
#include "tests/integration/harness.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::NowMs;
using testing::ReadFile;

class InputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = testing::MakeClusterScratchDir("/tmp/strata-input-XXXXXX"); }
  static void TearDownTestSuite() {
    if (!std::getenv("STRATA_KEEP_TEST_DIRS")) fs::remove_all(dir_);
  }

  // Runs `strata ARGS` (no cluster is up: STRATA_STATE_DIR is an empty directory) and checks it
  // answers within 5 s (the refusals below take milliseconds; a hang or an allocation spree
  // would not).
  static CommandResult Strata(const std::string& args) {
    const int64_t start = NowMs();
    CommandResult r = testing::RunStrata(args, dir_);
    EXPECT_LT(NowMs() - start, 5000) << args;
    return r;
  }
  static void ExpectBadInput(const std::string& args, const std::string& needle) {
    CommandResult r = Strata(args);
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": expected '" << needle << "' in: " << r.err;
  }

  static std::string WriteSpec(const std::string& name, const std::string& body) {
    const std::string path = dir_ + "/" + name + ".toml";
    std::ofstream(path) << body;
    return path;
  }
  static std::string Valid(const std::string& name = "ok") {
    return "name = \"" + name +
           "\"\n[model]\nlayers = 2\nhidden = 64\nheads = 4\nsequence = 32\n[data]\npath = \"corpus.txt\"\n"
           "[train]\nsteps = 5\nglobal_batch = 8\n";
  }
  static std::string With(const std::string& from, const std::string& to) {
    std::string s = Valid();
    s.replace(s.find(from), from.size(), to);
    return s;
  }

  static std::string dir_;
};
std::string InputTest::dir_;

// Before: layers = 2^31 grew submit to 23.7 GB, global_batch = 2^40 spun submit/plan for minutes,
// hidden = 2^62 printed a negative GiB estimate, steps = 10^18 and worker.threads = 100000 were
// accepted.
TEST_F(InputTest, SpecNumbersOverTheirBoundsAreRefusedBySubmitAndPlan) {
  const std::pair<std::string, std::string> cases[] = {
      {With("layers = 2", "layers = 2147483648"), "model.layers = 2147483648 is over the bound of 1024"},
      {With("global_batch = 8", "global_batch = 1099511627776"),
       "train.global_batch = 1099511627776 is over the bound"},
      {With("hidden = 64", "hidden = 4611686018427387904"), "model.hidden = 4611686018427387904 is over the bound"},
      {With("steps = 5", "steps = 1000000000000000000"), "train.steps = 1000000000000000000 is over the bound"},
      {Valid() + "[worker]\nthreads = 100000\n", "worker.threads = 100000 is over the bound of 1024"},
  };
  for (const auto& [body, needle] : cases) {
    const std::string spec = WriteSpec("bounds", body);
    ExpectBadInput("submit " + spec, needle);
    ExpectBadInput("plan " + spec, needle);
  }
}

// Before: `strata submit /dev/zero` ate memory forever and a FIFO blocked it.
TEST_F(InputTest, SpecFilesMustBeSmallRegularFilesAndAreNeverBlockedOn) {
  ExpectBadInput("submit /dev/zero", "/dev/zero is a character device");
  ExpectBadInput("plan /dev/zero", "/dev/zero is a character device");
  const std::string fifo = dir_ + "/spec.fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  ExpectBadInput("submit " + fifo, fifo + " is a FIFO");  // nobody writes to it: a blocking open would hang
  ExpectBadInput("plan " + fifo, fifo + " is a FIFO");
  ExpectBadInput("submit " + dir_, "is a directory");
  ExpectBadInput("plan " + WriteSpec("ok", Valid()) + " --cluster-spec /dev/zero", "/dev/zero is a character device");
  ExpectBadInput("submit " + WriteSpec("big", std::string(2 << 20, '#')), "larger than 1024 KiB");
}

// Before: a NUL in a name wedged the cluster, 115+ characters failed the checkpoint after
// training, escapes and newlines printed raw.
TEST_F(InputTest, UnsafeRunNamesAreRefusedNamingTheRule) {
  for (const std::string& name : std::vector<std::string>{"a\\u0000b", std::string(115, 'n'), "red\\u001b[31m",
                                                          "two\\nlines", ".hidden", "a/b"}) {
    ExpectBadInput("submit " + WriteSpec("name", Valid(name)), "a run name is 1 to 64 characters of A-Z a-z 0-9 . _ -");
  }
  CommandResult r = Strata("submit " + WriteSpec("name", Valid("red\\u001b[31m")));
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << "the refusal itself printed the escape raw";
}

// Before: `strata --cluster foo://bar status` aborted (exit 134).
TEST_F(InputTest, BadClusterAddressesAreACleanErrorNotAnAbort) {
  ExpectBadInput("--cluster foo://bar status", "--cluster foo://bar is not a coordinator address");
  ExpectBadInput("--cluster tcp://nohost workers", "tcp:// needs HOST:PORT");
  ExpectBadInput("--cluster tcp://host:99999 status", "tcp:// needs HOST:PORT");
  ExpectBadInput("--cluster localhost:5555 status", "no scheme");
  ExpectBadInput("--cluster foo://bar activations some-run", "not a coordinator address");
  CommandResult env =
      testing::RunCommand("STRATA_CLUSTER=zmq://x " + std::string(STRATA_BIN_DIR) + "/strata status", dir_);
  EXPECT_EQ(env.rc, 2) << env.err;
  EXPECT_NE(env.err.find("STRATA_CLUSTER zmq://x is not a coordinator address"), std::string::npos) << env.err;
}

// Before: `up --memory-limit lots` failed but left a coordinator running.
TEST_F(InputTest, UpValidatesEveryFlagBeforeStartingAnything) {
  const std::string state = dir_ + "/up-state";
  ExpectBadInput("--state-dir " + state + " up --workers 1 --memory-limit lots", "--memory-limit");
  ExpectBadInput("--state-dir " + state + " up --workers 1 --memory-limit 0", "--memory-limit 0 is 0");
  ExpectBadInput("--state-dir " + state + " up --workers 1 --hosts 2", "--hosts 2 is more than the 1 workers");
  EXPECT_FALSE(fs::exists(state)) << "up created its state (and so may have started processes) before refusing a flag";
}

// Before: `export --step -1` exported the latest, `export --out NON_EMPTY_DIR` and
// `activations get --out EXISTING` replaced files. All refused before the cluster is contacted.
TEST_F(InputTest, CliWritesNeverClobber) {
  ExpectBadInput("export some-run --step -1 --out " + dir_ + "/new-dir", "--step -1 is not a checkpoint step");
  const std::string full = dir_ + "/full";
  fs::create_directories(full);
  std::ofstream(full + "/mine.txt") << "keep me";
  ExpectBadInput("export some-run --out " + full, "--out " + full + " is not empty");
  EXPECT_EQ(ReadFile(full + "/mine.txt"), "keep me");
  const std::string file = dir_ + "/existing.npy";
  std::ofstream(file) << "keep me too";
  ExpectBadInput("export some-run --out " + file, "exists and is not a directory");
  ExpectBadInput("activations get some-run --layer 0 --out " + file, "--out " + file + " already exists");
  EXPECT_EQ(ReadFile(file), "keep me too");
  // With --force they go on to the cluster (none here: exit 1, unreachable), nothing written.
  CommandResult forced =
      testing::RunStrata("--cluster ipc://" + dir_ +
                             "/nobody.sock --timeout-ms 300 activations get some-run --layer 0 --force --out " + file,
                         dir_);
  EXPECT_EQ(forced.rc, 1) << forced.err;
  EXPECT_EQ(ReadFile(file), "keep me too");
}

// Runs stored before the name rule (names with escapes, newlines, NUL) still load, and `strata
// status` / `events` print them escaped instead of driving the terminal.
TEST_F(InputTest, StoredNamesWithControlBytesPrintEscaped) {
  const std::string state = dir_ + "/coordinator-state";
  const std::string evil = "evil\x1b[2J\nname";
  const std::string id = evil + "-12345678-042";
  {
    auto store = storage::ShardStore::Open(state + "/metadata");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto parsed = ParseRunSpec(Valid(), dir_, true);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    RunSpec spec = *parsed;
    spec.name = evil;
    capnp::MallocMessageBuilder message;
    auto r = message.initRoot<RunRecord>();
    r.setRunId(id);
    r.setName(evil);
    r.setSpecToml(RunSpecToToml(spec));
    r.setState(RunState::FAILED);
    r.setKind("train");
    r.setTotalSteps(5);
    r.setMessage("failed:\x1b[31m red\nsecond line");
    const std::string bytes = schema::StructToBytes(message.getRoot<RunRecord>().asReader());
    ASSERT_TRUE(
        (*store)->PutMetadata("run/" + id, {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}).ok());
    capnp::MallocMessageBuilder event_message;
    auto ev = event_message.initRoot<Event>();
    ev.setUnixMs(net::NowUnixMs());
    ev.setKind("failed");
    ev.setMessage("run " + id + " failed\x07");
    const std::string event = schema::StructToBytes(ev.asReader());
    ASSERT_TRUE((*store)
                    ->PutMetadata("evt/" + storage::EncodeKeyString(id) + storage::EncodeKeyU64(0),
                                  {reinterpret_cast<const uint8_t*>(event.data()), event.size()})
                    .ok());
  }
  const std::string endpoint = "ipc://" + dir_ + "/coord.sock";
  testing::RunCommand("(" + std::string(STRATA_BIN_DIR) + "/strata-coordinator --listen " + endpoint + " --state-dir " +
                          state + " > " + dir_ + "/coord.log 2>&1 & echo $! > " + dir_ + "/coord.pid)",
                      dir_);
  CommandResult status;
  for (int i = 0; i < 50; ++i) {
    status = Strata("--cluster " + endpoint + " status");
    if (status.rc == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  CommandResult watch = Strata("--cluster " + endpoint + " status --watch --all");  // every run has ended: one pass
  CommandResult json = Strata("--cluster " + endpoint + " status --json");
  testing::RunCommand("kill $(cat " + dir_ + "/coord.pid)", dir_);
  ASSERT_EQ(status.rc, 0) << status.err << ReadFile(dir_ + "/coord.log");
  EXPECT_NE(status.out.find("evil\\x1B[2J\\x0Aname-12345678-042"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("failed:\\x1B[31m red\\x0Asecond line"), std::string::npos) << status.out;
  EXPECT_EQ(watch.rc, 0) << watch.err;
  EXPECT_NE(watch.out.find("evil\\x1B[2J\\x0Aname"), std::string::npos) << watch.out;
  for (const CommandResult* r : {&status, &watch}) {
    EXPECT_EQ(r->out.find('\x1b'), std::string::npos) << "an escape printed raw: " << r->out;
    EXPECT_EQ(r->err.find('\x1b'), std::string::npos) << "an escape printed raw: " << r->err;
  }
  EXPECT_EQ(json.rc, 0) << json.err;
  EXPECT_EQ(json.out.find('\x1b'), std::string::npos) << json.out;  // JSON escapes it as \u001b
  EXPECT_NE(json.out.find("\\u001b[2J"), std::string::npos) << json.out;
}

}  // namespace
}  // namespace strata
