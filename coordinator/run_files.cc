#include "coordinator/run_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "common/log.h"
#include "common/task_log.h"
#include "tensorboard/event_file.h"

namespace strata::coordinator {

RunFiles::RunFiles(Cluster& c) : c_(c) {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  own_host_ = name;
}

// One JSON line per step, from rank 0's report, appended to STATE_DIR/metrics/RUN.jsonl (0600):
// a step already written (a replay after a recovery, a resent report) is not written again, so
// the file has one line per step with the loss `strata status` shows. The learning rate is the
// spec's schedule at that step; the reports carry no gradient norm, so there is none.
void RunFiles::AppendMetrics(const RunEntry& run, int64_t step, StepReport::Reader s) {
  auto written = metrics_step_.find(run.id);
  if (written == metrics_step_.end()) written = metrics_step_.emplace(run.id, LastMetricsStep(run.id)).first;
  if (step <= written->second) return;
  written->second = step;
  auto number = [](double v) {
    if (!std::isfinite(v)) return std::string("null");
    char text[40];
    const auto end = std::to_chars(text, text + sizeof(text), v).ptr;  // shortest that reads back equal
    return std::string(text, end);
  };
  const std::string line =
      "{\"step\":" + std::to_string(step) + ",\"loss\":" + number(s.getLoss()) +
      ",\"lr\":" + number(LearningRate(run.spec.train, step)) + ",\"grad_norm\":" + number(s.getGradNorm()) +
      ",\"tokens_per_second\":" + number(s.getTokensPerSecond()) +
      ",\"memory_bytes\":" + std::to_string(std::max(s.getSchedulePeakBytes(), s.getUpdatePeakBytes())) +
      ",\"unix_ms\":" + std::to_string(c_.clock.UnixMs()) + "}\n";
  std::error_code ec;
  std::filesystem::create_directories(c_.options.state_dir + "/metrics", ec);
  const std::string path = MetricsPath(run.id);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0 || ::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    STRATA_LOG(kWarn) << "could not append step " << step << " of " << run.id << " to " << path << ": "
                      << std::strerror(errno);
  }
  if (fd >= 0) ::close(fd);
  // The same step for TensorBoard: STATE_DIR/tensorboard/RUN/events.out.tfevents.* (`tensorboard
  // --logdir STATE_DIR/tensorboard` shows every run).
  const std::string board = c_.options.state_dir + "/tensorboard/" + run.id;
  const int64_t unix_ms = c_.clock.UnixMs();
  auto writer = boards_.find(run.id);
  Status appended = Status::Ok();
  if (writer == boards_.end()) {
    auto opened = tensorboard::EventFileWriter::Open(board, unix_ms / 1000);
    if (opened.ok()) writer = boards_.emplace(run.id, std::move(opened).value()).first;
    appended = opened.status();
  }
  if (appended.ok()) {
    appended = writer->second.Append(
        step, static_cast<double>(unix_ms) / 1000.0,
        tensorboard::StepScalars(s.getLoss(), LearningRate(run.spec.train, step), s.getGradNorm(),
                                 s.getTokensPerSecond(),
                                 static_cast<double>(std::max(s.getSchedulePeakBytes(), s.getUpdatePeakBytes()))));
  }
  if (!appended.ok())
    STRATA_LOG(kWarn) << "could not append step " << step << " of " << run.id << " to its TensorBoard file in " << board
                      << ": " << appended.message();
}

// The last step in a run's metrics file (0 if none): a restarted coordinator goes on after it.
int64_t RunFiles::LastMetricsStep(const std::string& run_id) const {
  std::ifstream in(MetricsPath(run_id));
  int64_t last = 0;
  for (std::string line; std::getline(in, line);) {
    long long step = 0;
    if (std::sscanf(line.c_str(), "{\"step\":%lld", &step) == 1) last = std::max<int64_t>(last, step);
  }
  return last;
}

// A piece of a run's metrics file or of one rank's log. Logs are read by path: the store of the
// worker that ran the rank last (else any known worker's store holding that rank's log) must be
// on this host's filesystem; a worker on another host gets an error saying so.
void RunFiles::HandleRunFileRequest(const std::string& identity, uint64_t rid, const RunEntry& run,
                                    RunFileRequest::Reader req) {
  const std::string& id = run.id;
  std::string path;
  if (req.getKind() == RunFileRequest::Kind::METRICS) {
    path = MetricsPath(id);
  } else {
    const uint32_t rank = req.getRank();
    std::vector<const WorkerEntry*> candidates;
    if (rank < run.workers.size()) {
      if (auto w = c_.workers.all().find(run.workers[rank]); w != c_.workers.all().end())
        candidates.push_back(&w->second);
    }
    for (const auto& [name, w] : c_.workers.all()) candidates.push_back(&w);
    std::string tried;
    for (const WorkerEntry* w : candidates) {
      if (w->store_path.empty()) continue;
      const std::string p = log::TaskLogPath(w->store_path, id, rank);
      std::error_code ec;
      if (std::filesystem::exists(p, ec)) {
        path = p;
        break;
      }
      if (tried.empty() && w->host != own_host_) {
        tried = " (worker " + w->id + " is on host " + w->host + " and this coordinator, on " + own_host_ +
                ", reads logs only from stores on its own host)";
      }
    }
    // A rank of a live run that has not started yet (the run waits for workers, or is being
    // re-planned) has no log so far: empty, so `strata logs --follow` waits for it.
    if (path.empty() && !run.terminal() && rank < std::max<int64_t>(1, run.spec.parallel.workers())) {
      schema::EnvelopeBuilder reply(rid);
      reply.root().initRunFileReply();
      c_.outbox.Send(identity, reply.Serialize());
      return;
    }
    if (path.empty()) {
      c_.outbox.Send(identity,
                     schema::MakeErrorReply(
                         rid, NotFound("no log of rank " + std::to_string(rank) + " of run " + id +
                                       " in the stores of the known workers" + tried + "; the run has ranks 0-" +
                                       std::to_string(std::max<int64_t>(1, run.spec.parallel.workers()) - 1))));
      return;
    }
  }
  schema::EnvelopeBuilder reply(rid);
  auto r = reply.root().initRunFileReply();
  r.setPath(path);
  r.setTerminal(run.terminal());
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    struct stat st {};
    ::fstat(fd, &st);
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    r.setSize(size);
    const uint64_t offset = std::min<uint64_t>(req.getOffset(), size);
    std::string data(std::min<uint64_t>(size - offset, kRunFileChunk), '\0');
    const ssize_t n = ::pread(fd, data.data(), data.size(), static_cast<off_t>(offset));
    data.resize(n > 0 ? static_cast<size_t>(n) : 0);
    ::close(fd);
    r.setData(capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(data.data()), data.size()));
  }  // no metrics file yet: no step reported, empty
  c_.outbox.Send(identity, reply.Serialize());
}

}  // namespace strata::coordinator
