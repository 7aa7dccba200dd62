#include "worker/extractor.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "common/log.h"

#ifdef STRATA_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace strata::worker {
namespace {

constexpr size_t kMaxQueuedChunks = 2;

torch::ScalarType StoredType(const std::string& dtype) {
  if (dtype == "bf16") return torch::kBFloat16;
  if (dtype == "fp16") return torch::kHalf;
  return torch::kFloat;
}

// After an OOM, the tensors of the failed forward are gone but their blocks stay in the caching
// allocator; give them back so the retry at half the size starts from a clean pool.
void ReleaseCachedMemory(const torch::Device& device) {
#ifdef STRATA_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

// Stores chunks on its own thread, so the device computes chunk c + 1 while chunk c is written.
// Push blocks while kMaxQueuedChunks are waiting (bounded host memory).
template <typename Chunk>
class ChunkWriter {
 public:
  using WriteFn = std::function<Status(Chunk&)>;
  explicit ChunkWriter(WriteFn write) : write_(std::move(write)), thread_([this] { Loop(); }) {}
  ~ChunkWriter() { (void)Finish(); }

  // False when an earlier write failed (Finish() says why).
  bool Push(Chunk chunk) {
    std::unique_lock<std::mutex> lock(mutex_);
    space_.wait(lock, [&] { return queue_.size() < kMaxQueuedChunks || !status_.ok(); });
    if (!status_.ok()) return false;
    queue_.push_back(std::move(chunk));
    ready_.notify_one();
    return true;
  }

  // Writes what is queued, stops the thread, returns the first error.
  Status Finish() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closing_ = true;
      ready_.notify_one();
    }
    if (thread_.joinable()) thread_.join();
    std::lock_guard<std::mutex> lock(mutex_);
    return status_;
  }

 private:
  void Loop() {
    while (true) {
      Chunk chunk;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [&] { return !queue_.empty() || closing_; });
        if (queue_.empty()) return;
        chunk = std::move(queue_.front());
        queue_.pop_front();
      }
      Status st = write_(chunk);
      std::lock_guard<std::mutex> lock(mutex_);
      space_.notify_all();
      if (!st.ok()) {
        status_ = st;
        queue_.clear();
        return;
      }
    }
  }

  WriteFn write_;
  std::mutex mutex_;
  std::condition_variable ready_, space_;
  std::deque<Chunk> queue_;  // guarded by mutex_
  bool closing_ = false;     // guarded by mutex_
  Status status_;            // guarded by mutex_
  std::thread thread_;       // last: starts after the members it uses exist
};

}  // namespace

Extractor::Extractor(const TaskContext& context, TokenData data, torch::Device device)
    : context_(context), data_(std::move(data)), device_(device) {
  const RunSpec& spec = context.spec;
  sequences_ = ExtractSequences(spec, static_cast<int64_t>(data_.size()));
  micro_batch_ = spec.extract.batch;
  stored_type_ = StoredType(spec.extract.dtype);
  auto model = BuildCausalLm(spec.model, spec.train.seed);
  if (!model.ok()) {
    init_status_ = model.status();
    return;
  }
  model_ = *model;
  model_->eval();
  // bf16 inference runs the whole model in bf16 (as transformers does with torch_dtype=bf16).
  model_->to(device_, spec.extract.precision == "bf16" ? torch::kBFloat16 : torch::kFloat);
}

std::vector<torch::Tensor> Extractor::Forward(int64_t begin, int64_t end) {
  const RunSpec& spec = context_.spec;
  const int64_t t = spec.model.sequence;
  auto tokens = torch::from_blob(const_cast<int32_t*>(data_.tokens().data()) + begin * t, {end - begin, t}, torch::kInt)
                    .to(device_, torch::kLong);
  const auto& layers = spec.extract.layers;
  std::vector<torch::Tensor> out;
  model_->RunBlocks(tokens, layers.back(), [&](int64_t layer, const BlockOutputs& block) {
    if (!std::binary_search(layers.begin(), layers.end(), layer)) return;
    for (const std::string& site : spec.extract.sites) {
      const torch::Tensor& value = site == "attn_out" ? block.attn_out : site == "mlp_out" ? block.mlp_out : block.resid_post;
      auto rows = value.reshape({-1, spec.model.hidden}).to(stored_type_);
      if (!device_.is_cuda()) {
        out.push_back(rows.contiguous());
        continue;
      }
      // Pinned host memory (LibTorch's caching host allocator reuses it once the writer drops the
      // chunk): the copy runs at DMA speed instead of through a pageable bounce buffer.
      auto host = torch::empty(rows.sizes(), torch::TensorOptions().dtype(stored_type_).pinned_memory(true));
      host.copy_(rows);
      out.push_back(host);
    }
  });
  return out;
}

Result<Extractor::Chunk> Extractor::Compute(uint64_t chunk_index) {
  const RunSpec& spec = context_.spec;
  const int64_t first = static_cast<int64_t>(chunk_index) * spec.extract.batch;
  const int64_t last = std::min(first + spec.extract.batch, sequences_);
  if (first >= last) {
    return InvalidArgument("chunk " + std::to_string(chunk_index) + " is beyond the " + std::to_string(sequences_) +
                           " sequences this run captures");
  }
  Chunk chunk;
  chunk.info.chunk = chunk_index;
  chunk.info.row_begin = static_cast<uint64_t>(first * spec.model.sequence);
  chunk.info.row_count = static_cast<uint64_t>((last - first) * spec.model.sequence);
  for (int64_t layer : spec.extract.layers) {
    for (const std::string& site : spec.extract.sites) chunk.names.emplace_back(layer, site);
  }
  std::vector<std::vector<torch::Tensor>> parts(chunk.names.size());
  for (int64_t begin = first; begin < last;) {
    if (context_.cancelled->load()) return Aborted("cancelled");
    const int64_t end = std::min(begin + micro_batch_, last);
    std::vector<torch::Tensor> outputs;
    try {
      outputs = Forward(begin, end);
    } catch (const c10::OutOfMemoryError& e) {
      ReleaseCachedMemory(device_);
      if (micro_batch_ == 1) {
        return Status(StatusCode::kResourceExhausted,
                      "out of memory capturing a single sequence of " + std::to_string(spec.model.sequence) + " tokens on " +
                          device_.str() + ": " + e.what_without_backtrace() +
                          "; use a shorter model.sequence, fewer layers, or a larger GPU");
      }
      const int64_t halved = micro_batch_ / 2;
      context_.reporter->ReportNotice("oom", "out of memory at micro-batch " + std::to_string(micro_batch_) +
                                                 " sequences on " + device_.str() + " (chunk " +
                                                 std::to_string(chunk_index) + "); retrying with " +
                                                 std::to_string(halved) + " and keeping it");
      STRATA_LOG(kWarn) << "out of memory at micro-batch " << micro_batch_ << "; halving to " << halved;
      micro_batch_ = halved;
      continue;
    }
    for (size_t i = 0; i < outputs.size(); ++i) parts[i].push_back(std::move(outputs[i]));
    begin = end;
  }
  for (auto& p : parts) {
    chunk.tensors.push_back(p.size() == 1 ? std::move(p[0]) : torch::cat(p));
    chunk.info.bytes += static_cast<uint64_t>(chunk.tensors.back().numel() * chunk.tensors.back().element_size());
  }
  return chunk;
}

Status Extractor::Run() {
  STRATA_RETURN_IF_ERROR(init_status_);
  torch::NoGradGuard no_grad;
  ChunkWriter<Chunk> writer([this](Chunk& chunk) -> Status {
    std::vector<storage::ActivationRecordView> records;
    for (size_t i = 0; i < chunk.tensors.size(); ++i) {
      records.push_back({chunk.names[i].first, chunk.names[i].second, ViewOf(chunk.tensors[i])});
    }
    STRATA_RETURN_IF_ERROR(context_.store->PutActivationChunk(context_.run_id, chunk.info, records));
    context_.reporter->ReportChunk(chunk.info, /*computed=*/true);
    return Status::Ok();
  });
  for (uint64_t chunk : context_.chunks) {
    if (context_.cancelled->load()) break;
    // Resume: a chunk already durable here (an earlier attempt of this task) is reported, not redone.
    STRATA_ASSIGN_OR_RETURN(auto stored, context_.store->GetActivationChunk(context_.run_id, chunk));
    if (stored) {
      context_.reporter->ReportChunk(*stored, /*computed=*/false);
      continue;
    }
    Result<Chunk> computed = Compute(chunk);
    if (!computed.ok()) {
      Status write_status = writer.Finish();
      return write_status.ok() ? computed.status() : write_status;
    }
    if (!writer.Push(std::move(*computed))) break;
  }
  STRATA_RETURN_IF_ERROR(writer.Finish());
  if (context_.cancelled->load()) return Aborted("cancelled");
  return Status::Ok();
}

}  // namespace strata::worker
