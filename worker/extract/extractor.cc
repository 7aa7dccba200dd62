#include "worker/extract/extractor.h"

#include <algorithm>
#include <deque>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <thread>

#include "common/log.h"
#include "common/thread_annotations.h"
#include "common/token_file.h"
#include "shard/planner.h"

#ifdef STRATA_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace strata::worker {
namespace {

constexpr size_t kMaxQueuedChunks = 2;

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
  bool Push(Chunk chunk) STRATA_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    space_.Wait(lock, [&]() STRATA_REQUIRES(mutex_) { return queue_.size() < kMaxQueuedChunks || !status_.ok(); });
    if (!status_.ok()) return false;
    queue_.push_back(std::move(chunk));
    ready_.NotifyOne();
    return true;
  }

  // Writes what is queued, stops the thread, returns the first error.
  Status Finish() STRATA_EXCLUDES(mutex_) {
    {
      MutexLock lock(mutex_);
      closing_ = true;
      ready_.NotifyOne();
    }
    if (thread_.joinable()) thread_.join();
    MutexLock lock(mutex_);
    return status_;
  }

 private:
  void Loop() STRATA_EXCLUDES(mutex_) {
    while (true) {
      Chunk chunk;
      {
        MutexLock lock(mutex_);
        ready_.Wait(lock, [&]() STRATA_REQUIRES(mutex_) { return !queue_.empty() || closing_; });
        if (queue_.empty()) return;
        chunk = std::move(queue_.front());
        queue_.pop_front();
      }
      Status st = write_(chunk);
      MutexLock lock(mutex_);
      space_.NotifyAll();
      if (!st.ok()) {
        status_ = st;
        queue_.clear();
        return;
      }
    }
  }

  WriteFn write_;
  Mutex mutex_;
  CondVar ready_, space_;
  std::deque<Chunk> queue_ STRATA_GUARDED_BY(mutex_);
  bool closing_ STRATA_GUARDED_BY(mutex_) = false;
  Status status_ STRATA_GUARDED_BY(mutex_);
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace

Result<std::unique_ptr<Extractor>> Extractor::Create(const TaskContext& context, TokenData data, torch::Device device,
                                                     MemorySnapshot device_memory) {
  std::unique_ptr<Extractor> extractor(new Extractor(context, std::move(data), device, std::move(device_memory)));
  STRATA_RETURN_IF_ERROR(extractor->Init());
  return extractor;
}

Extractor::Extractor(const TaskContext& context, TokenData data, torch::Device device, MemorySnapshot device_memory)
    : context_(context), data_(std::move(data)), device_(device), device_memory_(std::move(device_memory)) {}

Status Extractor::Init() {
  const RunSpec& spec = context_.spec;
  sequences_ = ExtractSequences(spec, static_cast<int64_t>(data_.size()));
  micro_batch_ = spec.extract.batch;
  stored_type_ = ScalarTypeOf(spec.extract.dtype);
  // bf16 inference runs the whole model in bf16 (as transformers does with torch_dtype=bf16).
  compute_type_ = ScalarTypeOf(spec.extract.precision);
  std::tie(mode_, mode_reason_) = ChooseMode();
  // The weights go where the mode keeps them (whole: the device; layerwise: host memory, visiting
  // the device a block at a time), read there tensor by tensor from init_from.
  const torch::Device place = mode_ == ExtractMode::kWhole ? device_ : torch::Device(torch::kCPU);
  auto model = BuildCausalLm(spec.model, spec.train.seed, /*for_resume=*/false,
                             torch::TensorOptions().device(place).dtype(compute_type_));
  if (!model.ok()) return model.status();
  model_ = *model;
  model_->eval();
  return Status::Ok();
}

std::pair<ExtractMode, std::string> Extractor::ChooseMode() const {
  const RunSpec& spec = context_.spec;
  const double gib = double(1ull << 30);
  const uint64_t element = compute_type_ == torch::kFloat ? 4 : 2;
  const uint64_t weights = static_cast<uint64_t>(shard::ParameterCount(spec.model)) * element;
  // A block's forward keeps a few [rows, hidden] and [rows, ffn] tensors alive at once.
  const uint64_t rows = static_cast<uint64_t>(spec.extract.batch * spec.model.sequence);
  uint64_t working = rows * (6 * spec.model.hidden + 2 * spec.model.ffn) * element;
  // Sites that grow past the residual width: attn_pattern's [heads, t] scores, softmax and
  // copy per row; the head's logits (and their fp32 copy for the loss) per row.
  const auto& sites = spec.extract.sites;
  const auto asked = [&](const char* site) { return std::find(sites.begin(), sites.end(), site) != sites.end(); };
  if (asked("attn_pattern"))
    working += rows * static_cast<uint64_t>(spec.model.heads * spec.model.sequence) * (element + 8);
  if (asked("logits") || asked("loss")) working += rows * static_cast<uint64_t>(spec.model.vocab) * (element + 8);
  const uint64_t budget = static_cast<uint64_t>(0.9 * static_cast<double>(device_memory_.free_bytes));
  std::ostringstream why;
  why << std::fixed << std::setprecision(2) << weights / gib << " GiB of weights + ~" << working / gib
      << " GiB working set vs " << device_memory_.free_bytes / gib << " GiB free on " << device_.str();
  ExtractMode mode = spec.extract.mode;
  if (mode == ExtractMode::kAuto) mode = weights + working <= budget ? ExtractMode::kWhole : ExtractMode::kLayerwise;
  return {mode, (mode == ExtractMode::kWhole ? "whole model on the device: "
                                             : "layer by layer (weights visit the device one block at a time): ") +
                    why.str() +
                    (spec.extract.mode == ExtractMode::kAuto
                         ? ""
                         : " (extract.mode = \"" + std::string(Name(spec.extract.mode)) + "\")")};
}

torch::Tensor Extractor::ToHost(const torch::Tensor& t) const {
  if (!t.is_cuda()) return t.contiguous();
  // Pinned host memory (LibTorch's caching host allocator reuses it once the writer drops the
  // chunk): the copy runs at DMA speed instead of through a pageable bounce buffer.
  auto host = torch::empty(t.sizes(), torch::TensorOptions().dtype(t.scalar_type()).pinned_memory(true));
  host.copy_(t);
  return host;
}

Extractor::Chunk Extractor::NewChunk(uint64_t chunk_index) const {
  const RunSpec& spec = context_.spec;
  const int64_t first = static_cast<int64_t>(chunk_index) * spec.extract.batch;
  const int64_t last = std::min(first + spec.extract.batch, sequences_);
  Chunk chunk;
  chunk.info.chunk = chunk_index;
  chunk.info.row_begin = static_cast<uint64_t>(first * spec.model.sequence);
  chunk.info.row_count = static_cast<uint64_t>(std::max<int64_t>(0, last - first) * spec.model.sequence);
  chunk.names = ExtractRecordNames(spec);
  return chunk;
}

Result<torch::Tensor> Extractor::Tokens(int64_t begin, int64_t end) const {
  const int64_t t = context_.spec.model.sequence;
  auto tokens = torch::empty({end - begin, t}, torch::kLong);
  STRATA_RETURN_IF_ERROR(data_.Read(begin * t, (end - begin) * t, tokens.data_ptr<int64_t>()));
  return tokens;
}

std::vector<torch::Tensor> Extractor::Forward(const torch::Tensor& tokens) {
  const RunSpec& spec = context_.spec;
  const auto& layers = spec.extract.layers;
  std::vector<torch::Tensor> out;
  model_->RunBlocks(
      tokens.to(device_), layers.back(),
      [&](int64_t layer, const BlockOutputs& block) {
        for (const torch::Tensor& rows : ExtractRows(*model_, spec, layer, block, tokens)) out.push_back(ToHost(rows));
      },
      [&](int64_t layer) { return ExtractRequest(spec, layer); });
  return out;
}

Result<Extractor::Chunk> Extractor::Compute(uint64_t chunk_index) {
  const RunSpec& spec = context_.spec;
  Chunk chunk = NewChunk(chunk_index);
  if (chunk.info.row_count == 0) {
    return InvalidArgument("chunk " + std::to_string(chunk_index) + " is beyond the " + std::to_string(sequences_) +
                           " sequences this run captures");
  }
  const int64_t first = static_cast<int64_t>(chunk.info.row_begin) / spec.model.sequence;
  const int64_t last = first + static_cast<int64_t>(chunk.info.row_count) / spec.model.sequence;
  std::vector<std::vector<torch::Tensor>> parts(chunk.names.size());
  for (int64_t begin = first; begin < last;) {
    if (context_.cancelled->load()) return Aborted("cancelled");
    const int64_t end = std::min(begin + micro_batch_, last);
    STRATA_ASSIGN_OR_RETURN(torch::Tensor tokens, Tokens(begin, end));
    std::vector<torch::Tensor> outputs;
    try {
      outputs = Forward(tokens);
    } catch (const c10::OutOfMemoryError& e) {
      ReleaseCachedMemory(device_);
      if (micro_batch_ == 1) {
        return Status(StatusCode::kResourceExhausted,
                      "out of memory capturing a single sequence of " + std::to_string(spec.model.sequence) +
                          " tokens on " + device_.str() + ": " + e.what_without_backtrace() +
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

Status Extractor::ComputeLayerwise(const std::vector<uint64_t>& chunks, const std::function<bool(Chunk)>& push) {
  const RunSpec& spec = context_.spec;
  const int64_t t = spec.model.sequence, width = spec.model.hidden;
  const uint64_t compute_size = compute_type_ == torch::kFloat ? 4 : 2;
  // Host bytes a chunk needs while its group is in flight: its hidden state and its captures.
  const uint64_t chunk_rows = static_cast<uint64_t>(spec.extract.batch * t);
  const uint64_t per_chunk = chunk_rows * width * compute_size + ExtractChunkBytes(spec);
  const auto names = ExtractRecordNames(spec);
  const bool model_level =
      std::any_of(names.begin(), names.end(), [](const auto& n) { return IsModelLevelSite(n.second); });
  const uint64_t budget = std::max<uint64_t>(ReadCpuMemory().free_bytes / 4, per_chunk);
  const size_t group_size = std::max<size_t>(1, budget / std::max<uint64_t>(per_chunk, 1));
  const int64_t last_layer = spec.extract.layers.back();
  for (size_t g = 0; g < chunks.size(); g += group_size) {
    std::vector<Chunk> group;
    for (size_t i = g; i < std::min(chunks.size(), g + group_size); ++i) group.push_back(NewChunk(chunks[i]));
    // residual[c]: the chunk's micro-batches of residual stream, on the host; parts[c][record]: captures.
    std::vector<std::vector<torch::Tensor>> residual(group.size());
    std::vector<std::vector<std::vector<torch::Tensor>>> parts(group.size());
    model_->MoveEmbedding(device_, compute_type_);
    for (size_t c = 0; c < group.size(); ++c) {
      parts[c].resize(group[c].names.size());
      const int64_t first = static_cast<int64_t>(group[c].info.row_begin) / t;
      const int64_t last = first + static_cast<int64_t>(group[c].info.row_count) / t;
      for (int64_t begin = first; begin < last; begin += micro_batch_) {
        const int64_t end = std::min(begin + micro_batch_, last);
        STRATA_ASSIGN_OR_RETURN(torch::Tensor tokens, Tokens(begin, end));
        residual[c].push_back(ToHost(model_->Embed(tokens.to(device_))));
      }
    }
    model_->MoveEmbedding(torch::kCPU, compute_type_);
    for (int64_t layer = 0; layer <= last_layer; ++layer) {
      if (context_.cancelled->load()) return Aborted("cancelled");
      model_->MoveBlock(layer, device_, compute_type_);
      const bool last = layer == spec.model.layers - 1;
      if (last && model_level) model_->MoveFinal(device_, compute_type_);
      const bool captured = std::binary_search(spec.extract.layers.begin(), spec.extract.layers.end(), layer);
      const size_t first_record = static_cast<size_t>(
          std::count_if(names.begin(), names.end(), [&](const auto& n) { return n.first < layer; }));
      const BlockRequest request = ExtractRequest(spec, layer);
      for (size_t c = 0; c < group.size(); ++c) {
        for (size_t m = 0; m < residual[c].size();) {
          if (residual[c][m].size(0) > micro_batch_) {  // made before an OOM shrank the micro-batch
            auto whole = residual[c][m];
            residual[c][m] = whole.narrow(0, 0, micro_batch_);
            residual[c].insert(residual[c].begin() + static_cast<int64_t>(m) + 1,
                               whole.narrow(0, micro_batch_, whole.size(0) - micro_batch_));
          }
          BlockOutputs out;
          try {
            out = model_->RunBlock(layer, residual[c][m].to(device_), request);
          } catch (const c10::OutOfMemoryError& e) {
            ReleaseCachedMemory(device_);
            if (residual[c][m].size(0) == 1) {
              return Status(StatusCode::kResourceExhausted, "out of memory running block " + std::to_string(layer) +
                                                                " on a single sequence on " + device_.str() + ": " +
                                                                e.what_without_backtrace());
            }
            // Halve the micro-batch and retry; the loop splits this and later ones to match (row
            // order is unchanged).
            micro_batch_ = residual[c][m].size(0) / 2;
            context_.reporter->ReportNotice("oom", "out of memory in block " + std::to_string(layer) + " on " +
                                                       device_.str() + "; micro-batch now " +
                                                       std::to_string(micro_batch_) +
                                                       " sequences, kept for the rest of the run");
            continue;
          }
          if (captured) {
            torch::Tensor tokens;  // the loss's next tokens: this micro-batch's sequences
            if (last && model_level) {
              int64_t begin = static_cast<int64_t>(group[c].info.row_begin) / t;
              for (size_t before = 0; before < m; ++before) begin += residual[c][before].size(0);
              STRATA_ASSIGN_OR_RETURN(tokens, Tokens(begin, begin + residual[c][m].size(0)));
            }
            std::vector<torch::Tensor> rows = ExtractRows(*model_, spec, layer, out, tokens);
            for (size_t r = 0; r < rows.size(); ++r) parts[c][first_record + r].push_back(ToHost(rows[r]));
          }
          residual[c][m] = ToHost(out.resid_post);
          ++m;
        }
      }
      model_->MoveBlock(layer, torch::kCPU, compute_type_);
      if (last && model_level) model_->MoveFinal(torch::kCPU, compute_type_);
    }
    for (size_t c = 0; c < group.size(); ++c) {
      for (auto& p : parts[c]) {
        group[c].tensors.push_back(p.size() == 1 ? std::move(p[0]) : torch::cat(p));
        group[c].info.bytes +=
            static_cast<uint64_t>(group[c].tensors.back().numel() * group[c].tensors.back().element_size());
      }
      if (!push(std::move(group[c]))) return Status::Ok();  // the writer failed: Run() reports why
    }
  }
  return Status::Ok();
}

storage::ActivationRunInfo Extractor::RunRecord() const {
  const RunSpec& spec = context_.spec;
  storage::ActivationRunInfo info;
  info.layers = spec.extract.layers;
  info.sites = spec.extract.sites;
  for (const std::string& site : spec.extract.sites) info.row_shapes.push_back(ExtractSiteRowShape(spec, site));
  switch (spec.extract.dtype) {
    case StoredDType::kFp32:
      info.dtype = storage::DType::kF32;
      break;
    case StoredDType::kBf16:
      info.dtype = storage::DType::kBF16;
      break;
    case StoredDType::kFp16:
      info.dtype = storage::DType::kF16;
      break;
  }
  info.total_rows = static_cast<uint64_t>(sequences_ * spec.model.sequence);
  info.sequence = static_cast<uint64_t>(spec.model.sequence);
  return info;
}

Status Extractor::LoadDocumentStarts() {
  const std::string& path = context_.spec.data.documents;
  if (path.empty()) return Status::Ok();
  const std::string what = "data.documents = \"" + path + "\"";
  STRATA_ASSIGN_OR_RETURN(DocumentsLayout layout, ReadDocumentsLayout(path));
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(layout.data_offset));
  std::vector<int64_t> raw(layout.count);
  in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size() * sizeof(int64_t)));
  if (!in) return IoError(what + ": cannot read its " + std::to_string(layout.count) + " offsets");
  document_starts_.clear();
  for (uint64_t d = 0; d < layout.count; ++d) {
    const uint64_t start = static_cast<uint64_t>(raw[d]);  // u64 or i64, little-endian like this host
    if ((layout.type.is_signed && raw[d] < 0) || start > data_.size() || (d == 0 && start != 0) ||
        (d > 0 && start < document_starts_.back())) {
      return InvalidArgument(what + ": offset " + std::to_string(d) + " is " + std::to_string(raw[d]) +
                             "; offsets start at 0 and ascend within the " + std::to_string(data_.size()) + " tokens");
    }
    document_starts_.push_back(start);
  }
  return Status::Ok();
}

Result<std::vector<int64_t>> Extractor::TokenRows(const storage::ActivationChunkInfo& chunk) const {
  // Row r is token r of the file (sequence i covers tokens [i T, (i + 1) T)). Its document: the
  // last of data.documents' starts at or before r, else its sequence; its position: r minus
  // that document's start (within the sequence: r mod T).
  const uint64_t t = static_cast<uint64_t>(context_.spec.model.sequence);
  std::vector<int64_t> ids(chunk.row_count);
  STRATA_RETURN_IF_ERROR(
      data_.Read(static_cast<int64_t>(chunk.row_begin), static_cast<int64_t>(chunk.row_count), ids.data()));
  std::vector<int64_t> rows(chunk.row_count * storage::kActivationTokenColumns);
  for (uint64_t i = 0; i < chunk.row_count; ++i) {
    const uint64_t row = chunk.row_begin + i;
    uint64_t document = row / t, start = document * t;
    if (!document_starts_.empty()) {
      document = static_cast<uint64_t>(std::upper_bound(document_starts_.begin(), document_starts_.end(), row) -
                                       document_starts_.begin()) -
                 1;
      start = document_starts_[document];
    }
    rows[i * 3] = ids[i];
    rows[i * 3 + 1] = static_cast<int64_t>(document);
    rows[i * 3 + 2] = static_cast<int64_t>(row - start);
  }
  return rows;
}

Status Extractor::Run() {
  torch::NoGradGuard no_grad;
  context_.reporter->ReportNotice("plan", mode_reason_);
  STRATA_LOG(kInfo) << "extract plan: " << mode_reason_;
  // The run record first, so this store can be read with the coordinator gone (every worker of
  // the run writes the same one; a resumed task rewrites it).
  STRATA_RETURN_IF_ERROR(LoadDocumentStarts());
  STRATA_RETURN_IF_ERROR(context_.store->PutActivationRun(context_.run_id, RunRecord()));
  ChunkWriter<Chunk> writer([this](Chunk& chunk) -> Status {
    std::vector<storage::ActivationRecordView> records;
    for (size_t i = 0; i < chunk.tensors.size(); ++i) {
      records.push_back({chunk.names[i].first, chunk.names[i].second, ViewOf(chunk.tensors[i])});
    }
    STRATA_ASSIGN_OR_RETURN(std::vector<int64_t> tokens, TokenRows(chunk.info));
    records.push_back({0,
                       storage::kActivationTokensSite,
                       {storage::DType::kI64,
                        {static_cast<int64_t>(chunk.info.row_count), storage::kActivationTokenColumns},
                        {reinterpret_cast<const uint8_t*>(tokens.data()), tokens.size() * sizeof(int64_t)}}});
    STRATA_RETURN_IF_ERROR(context_.store->PutActivationChunk(context_.run_id, chunk.info, records));
    context_.reporter->ReportChunk(chunk.info, /*computed=*/true);
    return Status::Ok();
  });
  // Resume: chunks already durable here (an earlier attempt of this task) are reported, not redone.
  std::vector<uint64_t> todo;
  for (uint64_t chunk : context_.chunks) {
    STRATA_ASSIGN_OR_RETURN(auto stored, context_.store->GetActivationChunk(context_.run_id, chunk));
    if (stored) {
      context_.reporter->ReportChunk(*stored, /*computed=*/false);
    } else {
      todo.push_back(chunk);
    }
  }
  Status status;
  if (mode_ == ExtractMode::kLayerwise) {
    status = ComputeLayerwise(todo, [&](Chunk chunk) { return writer.Push(std::move(chunk)); });
  } else {
    for (uint64_t chunk : todo) {
      if (context_.cancelled->load()) break;
      Result<Chunk> computed = Compute(chunk);
      if (!computed.ok()) {
        status = computed.status();
        break;
      }
      if (!writer.Push(std::move(*computed))) break;
    }
  }
  Status write_status = writer.Finish();
  STRATA_RETURN_IF_ERROR(write_status);
  STRATA_RETURN_IF_ERROR(status);
  if (context_.cancelled->load()) return Aborted("cancelled");
  return Status::Ok();
}

}  // namespace strata::worker
