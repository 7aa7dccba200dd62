// Where every parameter of a model lives under a dp x pp x tp mesh, and how checkpoint pieces
// written under one mesh assemble into whole tensors (to export them, or to resume under another
// mesh). Pure functions, no LibTorch: the worker, the CLI and tests share them.
//
// Ranks: rank = (stage * dp + dp_rank) * tp + tp_rank (planner.h), so a tensor-parallel group is
// tp consecutive ranks.
//
// Tensor parallelism (Shoeybi et al. 2019, Megatron-LM): attention is split by heads and the MLP
// by its inner width. Column-parallel weights (q/k/v, fc / gate / up) split their output rows,
// row-parallel ones (attention output, MLP down projection) their input columns. The token
// embedding and the head (tied or not) are vocab-parallel (Megatron's VocabParallelEmbedding and
// parallel head): split by vocabulary rows, where tp divides the vocabulary (else replicated:
// GPT-2's 50257 rows stay whole; a vocabulary padded to a multiple of tp, e.g. 50304, splits).
// Everything else (norms, biases added after the all-reduce, positions) is replicated. A split is "the
// tensor seen as `view` (row-major), cut into tp equal blocks along `dim`": GPT-2's fused c_attn
// [3h, h] is seen as [3, h, h] and cut along dim 1, so each rank gets its heads' rows of q, k and
// v alike.
//
// Checkpoint pieces: each rank writes, for each parameter it owns, its tensor-parallel slice
// flattened and cut by data-parallel rank (elements [begin, end) of the slice), named
//   KIND/NAME@tp=R/T@[BEGIN,END)@D0xD1...      KIND: param | adam_m | adam_v; D: the full shape
// Replicated parameters are written by tensor-parallel rank 0 only (R/T = 0/1).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "spec/run_spec.h"

namespace strata::shard {

struct MeshShape {
  int64_t dp = 1, pp = 1, tp = 1;
  int64_t size() const { return dp * pp * tp; }
};

struct MeshPosition {
  int64_t stage = 0, dp_rank = 0, tp_rank = 0;
};

MeshShape MeshOf(const ParallelSpec& parallel);
MeshPosition PositionOf(const MeshShape& mesh, int64_t rank);
int64_t RankOf(const MeshShape& mesh, const MeshPosition& position);

// Layers [first, last) of pipeline stage `stage`: contiguous, sizes differing by at most one,
// the larger ones last (the first stage also carries the embedding).
std::pair<int64_t, int64_t> StageLayers(int64_t layers, int64_t pp, int64_t stage);
// The same with explicit layer counts per stage (ParallelSpec::stages); even when `stages` is empty.
std::pair<int64_t, int64_t> StageLayers(int64_t layers, int64_t pp, int64_t stage, const std::vector<int64_t>& stages);

// The layer a parameter name belongs to ("h.3.ln_1.weight" -> 3), or -1 (embedding, final norm,
// head).
int64_t LayerOf(const std::string& name);

struct TensorSplit {
  std::vector<int64_t> view;  // the full tensor seen as this shape; empty = replicated
  int64_t dim = -1;
  bool replicated() const { return view.empty(); }
};

// How parameter `name` (full shape `shape`) of model family spec.family splits over tp ranks.
TensorSplit TensorParallelSplit(const ModelSpec& spec, const std::string& name, const std::vector<int64_t>& shape,
                                int64_t tp);
// Whether `name` is a weight every attention head shares (qwen3's self_attn.q_norm / k_norm; not
// olmo2's, which span the projection and split with its rows):
// replicated over tp ranks, each of which reads it with its own heads only, so a rank's gradient
// of it is a part of the whole.
bool HeadSharedWeight(const ModelSpec& spec, const std::string& name);
// Whether the token embedding and the head are split by vocabulary rows over tp ranks.
bool VocabParallel(const ModelSpec& spec, int64_t tp);
// Whether the elementwise work between the split matmuls runs on 1/tp of the tokens per rank
// (sequence parallelism, worker/train/stage_model.h): tp > 1, tp divides model.sequence, and
// parallel.sequence_parallel is not false. The parameters' layout is the same either way.
bool SequenceParallel(const RunSpec& spec, int64_t tp);
// The same rule from its parts (the planner's job holds no RunSpec): `enabled` is
// parallel.sequence_parallel, `sequence` the tokens of a row.
bool SequenceParallel(bool enabled, int64_t sequence, int64_t tp);

// The shape of tp rank's slice (the full shape when replicated or tp == 1).
std::vector<int64_t> SliceShape(const TensorSplit& split, const std::vector<int64_t>& shape, int64_t tp);
// Whether a matrix [out, in] is split by its output rows (Megatron's column-parallel linear: it
// reads f's output, every token whole, and f's backward sums its input gradient over the ranks).
bool ColumnParallel(const TensorSplit& split, const std::vector<int64_t>& shape, int64_t tp);

// Copies tp rank `tp_rank`'s slice out of `full` (row-major, `element` bytes each), or writes
// `slice` into its place in `full`.
void CopySlice(const TensorSplit& split, const std::vector<int64_t>& shape, int64_t tp, int64_t tp_rank, size_t element,
               const uint8_t* full, uint8_t* slice);
void PlaceSlice(const TensorSplit& split, const std::vector<int64_t>& shape, int64_t tp, int64_t tp_rank,
                size_t element, const uint8_t* slice, uint8_t* full);

struct PieceName {
  std::string kind;  // param | adam_m | adam_v
  std::string name;  // the model's parameter name
  int64_t tp_rank = 0, tp = 1;
  int64_t begin = 0, end = 0;  // elements of the tensor-parallel slice, flattened
  std::vector<int64_t> shape;  // of the whole tensor
};
std::string FormatPiece(const PieceName& piece);
// NotFound-free: InvalidArgument for a name that is not a piece (older checkpoints).
Result<PieceName> ParsePiece(const std::string& stored_name);

// Which elements [0, n) of a tensor (or of one tensor-parallel slice) the pieces of a checkpoint
// cover. A checkpoint is whole only when every element is written exactly once: counting
// elements is not enough (two pieces of [0, n/2) add up to n and leave half the tensor unwritten).
class ElementCoverage {
 public:
  explicit ElementCoverage(int64_t n = 0) : n_(n) {}
  // Adds [begin, end): Corruption when it is empty, runs outside [0, n) or overlaps a range added
  // before (a piece written twice, or pieces of two layouts mixed up).
  Status Add(int64_t begin, int64_t end);
  // The ranges tile [0, n).
  bool complete() const { return covered_ == n_; }
  // The first element no range covers, or n when complete.
  int64_t first_missing() const;
  int64_t covered() const { return covered_; }

 private:
  int64_t n_ = 0;
  int64_t covered_ = 0;
  std::map<int64_t, int64_t> ranges_;  // begin -> end, disjoint
};

// Assembles whole tensors of one kind from pieces: feed every piece, then Take each tensor.
class TensorAssembler {
 public:
  explicit TensorAssembler(ModelSpec spec) : spec_(std::move(spec)) {}
  // `bytes` holds (end - begin) elements of `element` bytes of the piece's slice.
  Status Add(const PieceName& piece, size_t element, const uint8_t* bytes);
  // Where the piece's (end - begin) elements go, counted as covered: the caller fills it (e.g.
  // reads the piece straight into it) or gives up on the whole assembly.
  Result<std::span<uint8_t>> Slot(const PieceName& piece, size_t element);
  // The whole tensor, or an error naming the elements no piece covered.
  Result<std::vector<uint8_t>> Take(const std::string& name);
  std::vector<std::string> names() const;

 private:
  struct Partial {
    std::vector<int64_t> shape;
    size_t element = 0;
    // Per tensor-parallel layout seen (tp size): the slices being filled and elements covered.
    std::map<int64_t, std::vector<std::vector<uint8_t>>> slices;
    std::map<int64_t, std::vector<ElementCoverage>> covered;
  };
  ModelSpec spec_;
  std::map<std::string, Partial> partial_;
};

}  // namespace strata::shard
