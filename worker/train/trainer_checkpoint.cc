// Trainer's checkpoint I/O: resuming from a checkpoint written under any mesh, and copying and
// writing this rank's shard (shard/layout.h names the pieces). Split from trainer.cc, which
// keeps the step; the class and its maths are in trainer.h.
#include "worker/train/trainer.h"

#ifdef STRATA_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iomanip>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>
#include <thread>

#include "common/log.h"
#include "common/thread_annotations.h"
#include "worker/nn/causal_lm.h"
#include "worker/nn/hf_format.h"
#include "worker/nn/torch_compat.h"
#include "worker/train/device_memory.h"

namespace strata::worker {

// One parameter unit at a time: its pieces (of every kind, from every shard's store) are read
// straight into their place in the assembled tensors, cut to this rank's part and placed, then
// dropped, so host memory holds one unit's state, not the whole checkpoint (a 7B model's full
// state is ~112 GB on every rank that resumes).
Status Trainer::Resume(const ResumePoint& resume) {
  STRATA_RETURN_IF_ERROR(optimizer_->Settle());  // an offloaded update still running (optimizer.h)
  step_graph_->Reset();  // the loaded values go into the same tensors, but a graph is cheap to capture again
  const std::string where = "checkpoint of run " + resume.run_id + " at step " + std::to_string(resume.step);
  const auto start = std::chrono::steady_clock::now();
  std::map<std::string, size_t> unit_of;  // parameter name -> its unit
  for (size_t u = 0; u < model_->units().size(); ++u) {
    for (const auto& name : model_->units()[u].names) unit_of[name] = u;
  }
  // Where each shard is read (this worker's store, a store of this host, or another host's store
  // server: OpenShardReader) and, per unit, the pieces to read: (reader, stored name, piece).
  std::vector<std::unique_ptr<ShardReader>> readers;
  struct Source {
    ShardReader* reader;
    const std::string* name;
    shard::PieceName piece;
  };
  std::vector<std::vector<Source>> sources(model_->units().size());
  for (const auto& shard : resume.shards) {
    auto reader = OpenShardReader(resume, shard, context_.store, context_.store_path, context_.shard_access);
    // No copy reachable is this checkpoint unreadable here: the coordinator then takes an older one.
    if (!reader.ok()) return Corruption(where + ": " + reader.status().message());
    readers.push_back(std::move(reader).value());
    ShardReader* source_reader = readers.back().get();
    for (const auto& name : shard.tensors) {
      auto piece = shard::ParsePiece(name);
      if (!piece.ok()) {
        return InvalidArgument(where + " holds '" + name +
                               "', which is not a checkpoint piece (written before mesh-"
                               "independent checkpoints); resume from a newer checkpoint");
      }
      auto unit = unit_of.find(piece->name);
      if (unit == unit_of.end() || (piece->kind != "param" && piece->kind != "adam_m" && piece->kind != "adam_v"))
        continue;
      sources[unit->second].push_back({source_reader, &name, std::move(piece).value()});
    }
  }

  // Where the time goes, for the log: opening the shards' stores, the store reads, the copies to
  // the device (issue #5's time to train again is mostly this function on a large model).
  using Clock = std::chrono::steady_clock;
  auto ms_since = [](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
  };
  const int64_t open_ms = ms_since(start);
  int64_t read_ms = 0, place_ms = 0;
  int64_t read_bytes = 0;
  torch::NoGradGuard no_grad;
  for (size_t u = 0; u < model_->units().size(); ++u) {
    ParamUnit& unit = model_->units()[u];
    UnitOptimizer::Moments& m = optimizer_->moments(u);
    std::map<std::string, size_t> index_of;  // parameter name -> its place in the unit
    for (size_t i = 0; i < unit.names.size(); ++i) index_of[unit.names[i]] = i;
    auto slice_numel = [&](size_t i) {
      int64_t n = 1;
      for (int64_t d : unit.shapes[i]) n *= d;
      return n;
    };
    // Per kind, the range [lo, hi) of the unit's flat vector this rank holds (all of it, its ZeRO-3
    // shard, or its optimizer range) and where it lands: the tensor itself where it lives in host
    // memory (a CPU worker; offloaded moments and master copies, host-streamed parameters), else a
    // pinned host buffer copied to the device once the unit is read.
    struct Target {
      torch::Tensor host, device;
      int64_t lo = 0, hi = 0;
    };
    std::map<std::string, Target> targets;
    auto target = [&](const torch::Tensor& on_device, int64_t lo, int64_t hi) {
      Target t{on_device, on_device, lo, hi};
      if (on_device.is_cuda())
        t.host = torch::empty({hi - lo}, torch::TensorOptions().dtype(torch::kFloat).pinned_memory(true));
      return t;
    };
    targets["param"] =
        target(unit.flat.detach(), unit.sharded ? unit.shard_begin : 0, unit.sharded ? unit.shard_end : unit.numel);
    // adamw8bit: the stored fp32 values land in fp32 buffers, quantized once the unit is read.
    const bool eight_bit = optimizer_->eight_bit();
    const auto fp32 = torch::TensorOptions().dtype(torch::kFloat).device(device_);
    const torch::Tensor m_values = eight_bit ? torch::zeros({m.end - m.begin}, fp32) : m.exp_avg;
    const torch::Tensor v_values = eight_bit ? torch::zeros({m.end - m.begin}, fp32) : m.exp_avg_sq;
    targets["adam_m"] = target(m_values, m.begin, m.end);
    targets["adam_v"] = target(v_values, m.begin, m.end);

    // Each piece goes straight into its place when it is a range of this rank's tensor-parallel
    // slice (written under the same tp, or replicated): one copy, from the store to where the
    // state lives. Pieces of another tp rank's slice are not read; a tensor written under
    // another tp is assembled whole, then this rank's slice is cut from it.
    // One kind at a time (param, adam_m, adam_v): where a tensor is assembled whole, only one
    // kind's copy of it is held.
    for (const std::string kind : {"param", "adam_m", "adam_v"}) {
      Target& t = targets.at(kind);
      shard::TensorAssembler assembler(context_.spec.model);
      std::set<size_t> assembled;  // the tensors this kind assembles whole
      // Per tensor read directly: which elements of this rank's slice its pieces cover (each
      // exactly once; shard::ElementCoverage).
      std::map<size_t, shard::ElementCoverage> covered;
      struct Read {
        const Source* source;
        std::span<uint8_t> into;
        std::vector<uint8_t> staging;  // a piece only part of which this rank holds
        uint8_t* part_to = nullptr;
        int64_t part_offset = 0, part_bytes = 0;
      };
      std::vector<Read> reads;
      for (const Source& source : sources[u]) {
        const shard::PieceName& piece = source.piece;
        if (piece.kind != kind) continue;
        const size_t i = index_of.at(piece.name);
        // This rank's slice of tensor i is cut under tp = layout_tp (1: the whole tensor). A piece
        // written under the same cut is a range of some tp rank's slice; one written under another
        // (tp 2 -> 1, 1 -> 2, 2 -> 4) is assembled whole first.
        const int64_t layout_tp = unit.replicated[i] ? 1 : mesh_.tp;
        const bool same_cut = piece.tp == layout_tp;
        if (same_cut && layout_tp > 1 && piece.tp_rank != position_.tp_rank) continue;
        if (!same_cut) {
          STRATA_ASSIGN_OR_RETURN(std::span<uint8_t> slot, assembler.Slot(piece, sizeof(float)));
          assembled.insert(i);
          reads.push_back({&source, slot, {}, nullptr, 0, 0});
          continue;
        }
        if (piece.begin < 0 || piece.end > slice_numel(i) || piece.begin >= piece.end) {
          return Corruption(where + ": piece '" + *source.name + "' runs past the " + std::to_string(slice_numel(i)) +
                            " elements of its slice");
        }
        auto [slot, fresh] = covered.try_emplace(i, slice_numel(i));
        if (Status added = slot->second.Add(piece.begin, piece.end); !added.ok()) {
          return Corruption(where + ": piece '" + *source.name + "': " + added.message());
        }
        const int64_t a = unit.offsets[i] + piece.begin, b = unit.offsets[i] + piece.end;
        const int64_t lo = std::max(a, t.lo), hi = std::min(b, t.hi);
        if (lo >= hi) continue;  // another data-parallel rank's part
        auto* base = static_cast<uint8_t*>(t.host.data_ptr());
        if (lo == a && hi == b) {
          reads.push_back({&source,
                           {base + (a - t.lo) * sizeof(float), static_cast<size_t>(b - a) * sizeof(float)},
                           {},
                           nullptr,
                           0,
                           0});
        } else {
          Read r{&source,
                 {},
                 std::vector<uint8_t>(static_cast<size_t>(b - a) * sizeof(float)),
                 base + (lo - t.lo) * sizeof(float),
                 static_cast<int64_t>((lo - a) * sizeof(float)),
                 static_cast<int64_t>((hi - lo) * sizeof(float))};
          r.into = std::span<uint8_t>(r.staging);
          reads.push_back(std::move(r));
        }
      }
      // Every tensor of this kind is whole: all its pieces were there (read or not needed here).
      for (size_t i = 0; i < unit.names.size(); ++i) {
        if (assembled.count(i)) continue;
        const auto found = covered.find(i);
        if (found == covered.end() || !found->second.complete()) {
          const int64_t have = found == covered.end() ? 0 : found->second.covered();
          const int64_t missing = found == covered.end() ? 0 : found->second.first_missing();
          return Corruption(where + ": " + kind + " of " + unit.names[i] + " has " + std::to_string(have) + " of its " +
                            std::to_string(slice_numel(i)) + " elements in the checkpoint's pieces (element " +
                            std::to_string(missing) + " is in none)");
        }
      }
      // The reads are independent: they run on the intra-op threads at once.
      Mutex failed_mutex;
      Status failed = Status::Ok();  // under failed_mutex until parallel_for returns
      const auto reads_start = Clock::now();
      at::parallel_for(0, static_cast<int64_t>(reads.size()), 1, [&](int64_t begin, int64_t end) {
        for (int64_t k = begin; k < end; ++k) {
          Read& r = reads[static_cast<size_t>(k)];
          Status read = r.source->reader->ReadInto(*r.source->name, storage::DType::kF32, r.into);
          if (read.code() == StatusCode::kInvalidArgument) {
            read = Corruption(where + ": piece '" + *r.source->name + "' in " + r.source->reader->where() +
                              " is not the fp32 range its name describes (" + read.message() + ")");
          }
          if (read.ok()) {
            if (r.part_to) std::memcpy(r.part_to, r.staging.data() + r.part_offset, static_cast<size_t>(r.part_bytes));
            continue;
          }
          MutexLock lock(failed_mutex);
          if (failed.ok()) failed = read;
        }
      });
      STRATA_RETURN_IF_ERROR(failed);
      read_ms += ms_since(reads_start);
      for (const Read& r : reads) read_bytes += static_cast<int64_t>(r.into.size());
      const auto place_start = Clock::now();
      // Tensors written under another tp: this rank's slice, then the part of it this rank holds.
      for (size_t i : assembled) {
        auto full = assembler.Take(unit.names[i]);
        if (!full.ok())
          return Status(full.status().code(),
                        where + ", " + kind + " of " + unit.names[i] + ": " + full.status().message());
        const auto split =
            shard::TensorParallelSplit(context_.spec.model, unit.names[i], unit.full_shapes[i], mesh_.tp);
        std::vector<uint8_t> slice(static_cast<size_t>(slice_numel(i)) * sizeof(float));
        shard::CopySlice(split, unit.full_shapes[i], mesh_.tp, position_.tp_rank, sizeof(float), full->data(),
                         slice.data());
        const int64_t a = unit.offsets[i], b = a + slice_numel(i);
        const int64_t lo = std::max(a, t.lo), hi = std::min(b, t.hi);
        if (lo < hi) {
          std::memcpy(static_cast<uint8_t*>(t.host.data_ptr()) + (lo - t.lo) * sizeof(float),
                      slice.data() + (lo - a) * sizeof(float), static_cast<size_t>(hi - lo) * sizeof(float));
        }
      }
      place_ms += ms_since(place_start);
    }
    const auto place_start = Clock::now();
    for (auto& [kind, t] : targets) {
      if (!t.host.is_same(t.device)) t.device.copy_(t.host);
    }
    if (eight_bit) {
      optimizer_->SetMomentValues(u, false, m_values);
      optimizer_->SetMomentValues(u, true, v_values);
    }
    place_ms += ms_since(place_start);
  }
  step_ = resume.step;
  model_->RefreshWorkingWeights();
  optimizer_->ParametersChanged();
  STRATA_LOG(kInfo) << where << ": read and placed " << (read_bytes >> 20) << " MiB on " << device_.str() << " in "
                    << ms_since(start) << " ms (opening the stores " << open_ms << " ms, reading " << read_ms
                    << " ms on " << at::get_num_threads() << " threads, placing " << place_ms
                    << " ms), one parameter unit at a time ("
                    << std::count_if(readers.begin(), readers.end(), [](const auto& r) { return r->remote(); })
                    << " of " << readers.size() << " shards through another host's store server)";
  return Status::Ok();
}

Result<SavedShard> Trainer::SaveCheckpointShard() {
  STRATA_ASSIGN_OR_RETURN(HostCheckpoint copy, CopyCheckpointShard());
  return WriteCheckpointShard(*context_.store, &copy);
}

Result<HostCheckpoint> Trainer::CopyCheckpointShard() {
  STRATA_RETURN_IF_ERROR(optimizer_->Settle());  // the parameters and moments of step_, whole
  HostCheckpoint copy;
  copy.step = step_;
  // An earlier attempt of this run (stopped by a lost worker or a replay) may have committed this
  // step's shard here before the checkpoint was complete everywhere. The state at a step is the
  // same in every attempt, so the same pieces are that shard: report it again rather than write.
  // Pieces cut for another mesh (or other stages) stay where they are: committed shards are
  // immutable, and a checkpoint of the coordinator may name them. This shard then goes under a
  // key named by its own cut (a hash of its piece names), which a later attempt cut the same way
  // finds in turn.
  std::set<std::string> want;
  CollectCheckpointPieces(nullptr, &want);
  std::string names;
  for (const auto& name : want) names += name + '\n';
  char cut[17];
  std::snprintf(cut, sizeof(cut), "%016llx",
                static_cast<unsigned long long>(
                    storage::Checksum({reinterpret_cast<const uint8_t*>(names.data()), names.size()})));
  const std::string keys[] = {context_.run_id,
                              context_.run_id + "/rank-" + std::to_string(context_.rank) + "-cut-" + cut};
  for (const std::string& key : keys) {
    STRATA_ASSIGN_OR_RETURN(std::optional<storage::CheckpointInfo> at_step, context_.store->GetCheckpoint(key, step_));
    if (!at_step) {
      copy.key_run = key;
      CollectCheckpointPieces(&copy.pieces, nullptr);
      return copy;
    }
    std::set<std::string> have;
    for (const auto& t : at_step->tensors) have.insert(t.name);
    if (have == want) {
      copy.key_run = key;
      copy.existing = at_step->tensors;
      return copy;
    }
  }
  return Status(StatusCode::kAlreadyExists, "the checkpoint of step " + std::to_string(step_) +
                                                " is already in this worker's store under " + keys[1] +
                                                ", cut differently; the store is not the one this rank wrote");
}

Result<SavedShard> Trainer::WriteCheckpointShard(storage::ShardStore& store, HostCheckpoint* copy) {
  if (!copy->existing.empty()) return SavedShard{copy->key_run, copy->existing};
  const std::string& run = copy->key_run;
  auto& pieces = copy->pieces;
  // A few threads stage the pieces at once: copying gigabytes into the page cache is CPU-bound on
  // one thread (~2 GB/s), below a fast disk. Not the intra-op pool: training uses it meanwhile.
  constexpr size_t kWriteThreads = 4;
  std::atomic<size_t> next{0};
  std::vector<Status> results(std::min(kWriteThreads, pieces.size()));
  std::vector<char> staged(pieces.size(), 0);  // one writer per index
  auto stage = [&](size_t t) {
    for (size_t i = next.fetch_add(1); i < pieces.size() && results[t].ok(); i = next.fetch_add(1)) {
      const auto& [name, values] = pieces[i];
      results[t] = store.PutCheckpointTensor(run, copy->step, name, ViewOf(values));
      staged[i] = results[t].ok();
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < results.size(); ++t) {
    try {
      pool.emplace_back(stage, t);
    } catch (const std::system_error&) {
      break;  // no thread to be had (e.g. under a worker's --memory-limit): fewer threads do it all
    }
  }
  if (!results.empty()) stage(0);
  for (auto& thread : pool) thread.join();
  for (const Status& result : results) {
    if (result.ok()) continue;
    size_t kept = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (staged[i]) continue;
      if (kept != i) pieces[kept] = std::move(pieces[i]);  // never onto itself: that empties the name
      ++kept;
    }
    pieces.resize(kept);
    return result;
  }
  STRATA_RETURN_IF_ERROR(store.CommitCheckpoint(run, copy->step));
  STRATA_ASSIGN_OR_RETURN(std::optional<storage::CheckpointInfo> committed, store.GetCheckpoint(run, copy->step));
  if (committed) return SavedShard{run, std::move(committed->tensors)};
  return Internal("checkpoint at step " + std::to_string(copy->step) + " missing right after its commit");
}

// This rank's pieces of the checkpoint (shard/layout.h): host copies of their values into
// `pieces` (owned copies, never views of live parameters: a write may outlast the next step), or
// only their names into `names`. The copies are views of host blocks, filled by non-blocking
// copies and one wait: on a GPU the blocks are page-locked and kept for the next checkpoint once
// its write has let go of them (page-locking gigabytes takes seconds; the copy itself ~20 GB/s).
void Trainer::CollectCheckpointPieces(std::vector<std::pair<std::string, torch::Tensor>>* pieces,
                                      std::set<std::string>* names) {
  torch::NoGradGuard no_grad;
  // Piece name -> which state (0 the parameters, 1 m, 2 v) of which unit, from where, how many.
  struct Source {
    std::string name;
    size_t unit;
    int state;
    int64_t at, n;
  };
  std::vector<Source> sources;
  const int64_t zero = context_.spec.parallel.zero;
  for (size_t u = 0; u < model_->units().size(); ++u) {
    const ParamUnit& unit = model_->units()[u];
    if (unit.tied_copy) continue;  // the first stage writes wte
    for (size_t i = 0; i < unit.names.size(); ++i) {
      const bool split = !unit.replicated[i];
      if (!split && position_.tp_rank != 0) continue;  // replicated: tensor-parallel rank 0 writes it
      int64_t n = 1;
      for (int64_t d : unit.shapes[i]) n *= d;
      // This rank's piece: its data-parallel shard of the unit, where it overlaps parameter i.
      const int64_t begin = std::max(unit.offsets[i], unit.shard_begin);
      const int64_t end = std::min(unit.offsets[i] + n, unit.shard_end);
      if (end <= begin) continue;
      shard::PieceName piece;
      piece.name = unit.names[i];
      piece.tp_rank = split ? position_.tp_rank : 0;
      piece.tp = split ? mesh_.tp : 1;
      piece.begin = begin - unit.offsets[i];
      piece.end = end - unit.offsets[i];
      piece.shape = unit.full_shapes[i];
      const int64_t param_at = unit.sharded ? begin - unit.shard_begin : begin;
      const int64_t moment_at = zero >= 1 ? begin - unit.shard_begin : begin;
      int state = 0;
      for (const char* kind : {"param", "adam_m", "adam_v"}) {
        piece.kind = kind;
        if (names) names->insert(shard::FormatPiece(piece));
        if (pieces)
          sources.push_back({shard::FormatPiece(piece), u, state, state == 0 ? param_at : moment_at, end - begin});
        ++state;
      }
    }
  }
  if (!pieces) return;
  // Pieces are packed into blocks of up to kBlockFloats (a bigger piece gets a block of its own):
  // page-locking is slow (~1.5-3 GB/s) and holds the driver's lock while it runs, so each call is
  // kept short and other device users of the process get in between. (Heartbeats never wait on
  // it: they send the memory TorchExecutor samples on a thread of its own.)
  constexpr int64_t kBlockFloats = (int64_t{256} << 20) / static_cast<int64_t>(sizeof(float));
  std::vector<int64_t> block_numel;
  std::vector<std::pair<size_t, int64_t>> place;  // per piece: block, offset
  for (const Source& source : sources) {
    const int64_t n = source.n;
    if (block_numel.empty() || (block_numel.back() > 0 && block_numel.back() + n > kBlockFloats))
      block_numel.push_back(0);
    place.emplace_back(block_numel.size() - 1, block_numel.back());
    block_numel.back() += n;
  }
  // Reused only when the layout is the same and no write still holds a view of a block.
  const bool keep = device_.is_cuda();  // a CPU worker's copy is plain memory: no reason to hold it between checkpoints
  bool reuse = keep && checkpoint_blocks_.size() == block_numel.size();
  for (size_t b = 0; reuse && b < block_numel.size(); ++b) {
    reuse = checkpoint_blocks_[b].numel() == block_numel[b] && checkpoint_blocks_[b].storage().use_count() == 1;
  }
  if (!reuse) {
    checkpoint_blocks_.clear();  // let go of the old ones first: both may not fit
    for (int64_t n : block_numel) checkpoint_blocks_.push_back(HostBufferFor(device_, n, torch::kFloat));
  }
  // The moments as fp32 values (UnitOptimizer::MomentValues): the live tensors, or under
  // adamw8bit one unit's dequantized copies at a time, kept until their copies are done.
  size_t values_unit = SIZE_MAX;
  torch::Tensor values[2];
  for (size_t i = 0; i < sources.size(); ++i) {
    Source& source = sources[i];
    torch::Tensor from;
    if (source.state == 0) {
      from = model_->units()[source.unit].flat.detach();
    } else {
      if (source.unit != values_unit) {
        if (optimizer_->eight_bit() && values_unit != SIZE_MAX)
          WaitForDevice(device_);  // the last unit's copies read them
        values[0] = optimizer_->MomentValues(source.unit, false);
        values[1] = optimizer_->MomentValues(source.unit, true);
        values_unit = source.unit;
      }
      from = values[source.state - 1];
    }
    auto into = checkpoint_blocks_[place[i].first].narrow(0, place[i].second, source.n);
    into.copy_(from.narrow(0, source.at, source.n), /*non_blocking=*/true);
    pieces->emplace_back(std::move(source.name), into);
  }
  if (!keep) checkpoint_blocks_.clear();
  WaitForDevice(device_);
}

}  // namespace strata::worker
