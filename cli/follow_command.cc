// Watching runs: `strata submit --follow` / `strata status --follow` (one run's progress and
// events until it ends) and `strata watch` (every run, refreshed).
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "cli/exit.h"
#include "common/net.h"
#include "schema/envelope.h"
#include "spec/run_spec_capnp.h"

namespace strata::cli {

namespace {

// Client-side progress of one run, and its ETA: a train run's from its last step's speed (the
// record's tokens/s, so the minutes of loading before step 1 count for nothing), otherwise from
// the steps seen while watching, counted from the first step that moved (not from submit).
class ProgressTracker {
 public:
  // "step  120/200  loss 2.4312  3210 tok/s  ETA 0:25  dp=2 pp=2 on worker-0,...,worker-3"
  std::string Line(RunRecord::Reader r) {
    const int64_t now = net::SteadyMs();
    const int64_t step = r.getStep(), total = r.getTotalSteps();
    if (first_step_ < 0 || step < first_step_) {  // the first look, or the run went back (a resume)
      first_step_ = step;
      moved_step_ = -1;
    } else if (moved_step_ < 0 && step > first_step_) {
      moved_step_ = step;
      moved_ms_ = now;
    }
    auto losses = r.getLosses();
    std::string workers;
    for (auto w : r.getWorkers()) workers += (workers.empty() ? "" : ",") + Printable(w);
    const std::string kind = r.getKind().cStr();
    const bool extract = kind == "extract" || kind == "patch";  // steps count stored chunks
    auto spec = extract ? Result<RunSpec>(InvalidArgument("extract")) : ReadRunRecordSpec(r);
    char buf[512];
    int n = std::snprintf(buf, sizeof(buf), "%s %5ld/%ld", extract ? "chunk" : "step", static_cast<long>(step),
                          static_cast<long>(total));
    if (losses.size() > 0) n += std::snprintf(buf + n, sizeof(buf) - n, "  loss %.4f", losses[losses.size() - 1]);
    const double tokens_per_second = r.getTokensPerSecond();
    if (tokens_per_second > 0) n += std::snprintf(buf + n, sizeof(buf) - n, "  %.0f tok/s", tokens_per_second);
    double eta_s = -1;
    if (step < total && spec.ok() && tokens_per_second > 0) {
      eta_s =
          double(total - step) * double(spec->train.global_batch) * double(spec->model.sequence) / tokens_per_second;
    } else if (step < total && moved_step_ >= 0 && step > moved_step_) {
      eta_s = double(now - moved_ms_) / double(step - moved_step_) * double(total - step) / 1000.0;
    }
    if (eta_s >= 0) {
      const int64_t s = static_cast<int64_t>(eta_s);
      n += std::snprintf(buf + n, sizeof(buf) - n, "  ETA %ld:%02ld", static_cast<long>(s / 60),
                         static_cast<long>(s % 60));
    }
    // Train runs show their mesh (it changes when a lost worker makes the run re-plan).
    std::string mesh = (extract ? "workers=" : "dp=") + std::to_string(r.getWorldSize());
    if (spec.ok() && !spec->parallel.planned()) {
      mesh = "mesh planned when it starts";
    } else if (spec.ok()) {
      const ParallelSpec& p = spec->parallel;
      mesh = "dp=" + std::to_string(p.dp) + (p.pp > 1 ? " pp=" + std::to_string(p.pp) : "") +
             (p.tp > 1 ? " tp=" + std::to_string(p.tp) : "") + (p.zero > 0 ? " zero=" + std::to_string(p.zero) : "");
    }
    std::snprintf(buf + n, sizeof(buf) - n, "  %s%s%s", mesh.c_str(), workers.empty() ? "" : " on ", workers.c_str());
    return buf;
  }

 private:
  int64_t first_step_ = -1;
  int64_t moved_step_ = -1;  // the first step seen past first_step_, and when
  int64_t moved_ms_ = 0;
};
}  // namespace

// Polls the run until it ends, printing events as they happen and its progress: on a terminal
// one live line, rewritten in place; into a pipe or file (a log) a line every `every_s` seconds
// or every 5% of the steps, whichever comes first, and the last step. 0 iff it finished.
int Follow(GlobalOptions& g, const std::string& run, int every_s) {
  const bool tty = isatty(STDOUT_FILENO);
  ProgressTracker progress;
  int64_t printed_step = 0, printed_ms = net::SteadyMs();
  size_t printed_events = 0;
  int failures = 0, pending_polls = 0;
  bool waiting_noted = false, live_line = false;
  auto clear_live = [&] {
    if (live_line) std::printf("\r\033[K");
    live_line = false;
  };
  while (true) {
    auto reply = client::FetchStatus(g, run);
    if (!reply.ok()) {
      if (++failures > 10) return Fail(reply.status());  // tolerate a coordinator restart
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      continue;
    }
    failures = 0;
    auto r = (*reply)->root().getStatusReply().getRuns()[0];
    if (auto ev = client::FetchEvents(g, run); ev.ok()) {
      auto events = (*ev)->root().getEventsReply().getEvents();
      for (; printed_events < events.size(); ++printed_events) {
        clear_live();
        std::printf("[%s] %s\n", Printable(events[printed_events].getKind()).c_str(),
                    Printable(events[printed_events].getMessage()).c_str());
      }
    }
    const std::string line = progress.Line(r);
    if (tty) {
      clear_live();
      std::printf("%s", line.c_str());
      live_line = true;
    } else {
      const int64_t every = std::max<int64_t>(1, r.getTotalSteps() / 20);  // 5%
      const int64_t now = net::SteadyMs();
      if (r.getStep() > printed_step && (r.getStep() - printed_step >= every || now - printed_ms >= every_s * 1000LL ||
                                         r.getStep() == r.getTotalSteps())) {
        std::printf("%s\n", line.c_str());
        printed_step = r.getStep();
        printed_ms = now;
      }
    }
    std::fflush(stdout);
    const RunState state = r.getState();
    if (state == RunState::PENDING && !waiting_noted && ++pending_polls > 10) {
      waiting_noted = true;
      clear_live();
      std::printf("waiting: the run needs %u idle worker(s); `strata workers` shows who is busy or lost\n",
                  r.getWorldSize());
    }
    if (state == RunState::FINISHED || state == RunState::FAILED || state == RunState::CANCELLED) {
      if (tty) std::printf("\n");
      if (state == RunState::FINISHED) {
        if (const std::string kind = r.getKind().cStr(); kind == "extract" || kind == "patch") {
          std::printf("run %s finished: %ld chunks stored, %.0f tokens/s; `strata activations %s` lists them\n",
                      run.c_str(), static_cast<long>(r.getStep()), r.getTokensPerSecond(), run.c_str());
        } else {
          std::printf("run %s finished: %ld steps, %.0f tokens/s on the last step\n", run.c_str(),
                      static_cast<long>(r.getStep()), r.getTokensPerSecond());
        }
        return kExitOk;
      }
      std::printf("run %s %s: %s\n", Printable(run).c_str(), schema::RunStateName(state),
                  Printable(r.getMessage()).c_str());
      return kExitFailure;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
}

// `status --watch` without a run: a header, then one line per active (pending or running) run, or
// per run with `all`, until interrupted or no run is active. On a terminal the screen is
// redrawn each second; into a pipe or file a block every 5 s.
int WatchAll(GlobalOptions& g, bool all) {
  std::map<std::string, ProgressTracker> trackers;
  const bool tty = isatty(STDOUT_FILENO);
  while (true) {
    auto reply = client::FetchStatus(g, "", /*last_loss_only=*/true);
    if (!reply.ok()) return Fail(reply.status());
    auto runs = (*reply)->root().getStatusReply().getRuns();
    if (tty) std::printf("\033[H\033[2J");
    std::printf("%-28s %-10s %s\n", "RUN", "STATE", "PROGRESS");
    int active = 0;
    for (auto r : runs) {
      const bool is_active = r.getState() == RunState::PENDING || r.getState() == RunState::RUNNING;
      active += is_active;
      if (!is_active && !all) continue;
      const std::string line = trackers[r.getRunId().cStr()].Line(r);
      std::printf("%-28s %-10s %s\n", Printable(r.getRunId()).c_str(), schema::RunStateName(r.getState()),
                  line.c_str());
    }
    if (active == 0)
      std::printf("(no active run%s)\n", all ? "" : "; `strata status` or `--watch --all` shows the ended ones");
    std::fflush(stdout);
    if (active == 0) return kExitOk;
    std::this_thread::sleep_for(std::chrono::milliseconds(tty ? 1000 : 5000));
  }
}

}  // namespace strata::cli
