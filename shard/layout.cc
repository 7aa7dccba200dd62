#include "shard/layout.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>

#include "model/parameters.h"
#include "shard/plan_summary.h"

namespace strata::shard {
namespace {

int64_t Product(const std::vector<int64_t>& v, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to && i < v.size(); ++i) p *= v[i];
  return p;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Copies tp rank `rank`'s slice between the full tensor and the slice (the whole tensor when
// replicated): block `rank` of `tp` along the split dim, per outer index.
void Transfer(const TensorSplit& split, const std::vector<int64_t>& shape, int64_t tp, int64_t rank, size_t element,
              const uint8_t* from, uint8_t* to, bool to_slice) {
  if (split.replicated() || tp == 1) {
    std::memcpy(to, from, static_cast<size_t>(Product(shape, 0, shape.size())) * element);
    return;
  }
  const auto d = static_cast<size_t>(split.dim);
  const int64_t outer = Product(split.view, 0, d);
  const int64_t mid = split.view[d];
  const int64_t inner = Product(split.view, d + 1, split.view.size());
  const size_t block = static_cast<size_t>(mid / tp * inner) * element;
  for (int64_t o = 0; o < outer; ++o) {
    const size_t full_at = (static_cast<size_t>(o * mid * inner) * element) + static_cast<size_t>(rank) * block;
    const size_t slice_at = static_cast<size_t>(o) * block;
    if (to_slice) {
      std::memcpy(to + slice_at, from + full_at, block);
    } else {
      std::memcpy(to + full_at, from + slice_at, block);
    }
  }
}

}  // namespace

MeshShape MeshOf(const ParallelSpec& parallel) { return {parallel.dp, parallel.pp, parallel.tp}; }

MeshPosition PositionOf(const MeshShape& mesh, int64_t rank) {
  return {rank / (mesh.dp * mesh.tp), (rank / mesh.tp) % mesh.dp, rank % mesh.tp};
}

int64_t RankOf(const MeshShape& mesh, const MeshPosition& p) {
  return (p.stage * mesh.dp + p.dp_rank) * mesh.tp + p.tp_rank;
}

std::pair<int64_t, int64_t> StageLayers(int64_t layers, int64_t pp, int64_t stage) {
  // Stage s gets floor(layers / pp) layers, plus one when it is among the last layers % pp.
  const int64_t base = layers / pp, extra = layers % pp;
  auto first = [&](int64_t s) { return s * base + std::max<int64_t>(0, s - (pp - extra)); };
  return {first(stage), first(stage + 1)};
}

std::pair<int64_t, int64_t> StageLayers(int64_t layers, int64_t pp, int64_t stage, const std::vector<int64_t>& stages) {
  if (stages.empty()) return StageLayers(layers, pp, stage);
  int64_t first = 0;
  for (int64_t s = 0; s < stage; ++s) first += stages[static_cast<size_t>(s)];
  return {first, first + stages[static_cast<size_t>(stage)]};
}

int64_t LayerOf(const std::string& name) {
  for (const char* prefix : {"h.", "layers."}) {
    const size_t n = std::strlen(prefix);
    if (name.compare(0, n, prefix) != 0) continue;
    const size_t dot = name.find('.', n);
    if (dot == std::string::npos) return -1;
    return std::stoll(name.substr(n, dot - n));
  }
  return -1;
}

bool VocabParallel(const ModelSpec& spec, int64_t tp) { return tp > 1 && spec.vocab % tp == 0; }

bool SequenceParallel(bool enabled, int64_t sequence, int64_t tp) { return tp > 1 && enabled && sequence % tp == 0; }

bool SequenceParallel(const RunSpec& spec, int64_t tp) {
  return SequenceParallel(spec.parallel.sequence_parallel, spec.model.sequence, tp);
}

TensorSplit TensorParallelSplit(const ModelSpec& spec, const std::string& name, const std::vector<int64_t>& shape,
                                int64_t tp) {
  if (LayerOf(name) < 0) {  // vocab-parallel token embedding and head; positions and final norm replicated
    const bool vocab_rows = name == model::TokenEmbeddingName(spec) || name == model::HeadWeightName(spec);
    if (vocab_rows && VocabParallel(spec, tp) && !shape.empty() && shape[0] == spec.vocab) return {shape, 0};
    return {};
  }
  auto rows = [&] { return TensorSplit{shape, 0}; };
  auto columns = [&] { return TensorSplit{shape, 1}; };
  if (spec.family == Family::kGpt2) {
    const int64_t h = spec.hidden;
    if (EndsWith(name, "c_attn.weight")) return {{3, h, h}, 1};
    if (EndsWith(name, "c_attn.bias")) return {{3, h}, 1};
    if (EndsWith(name, "c_fc.weight") || EndsWith(name, "c_fc.bias")) return rows();
    if (EndsWith(name, "attn_proj.weight") || EndsWith(name, "mlp_proj.weight")) return columns();
    return {};
  }
  // Column-parallel (output rows split, biases with them); row-parallel (input columns split;
  // their biases are added after the all-reduce, so replicated). GPT-NeoX's fused
  // query_key_value holds each head's q, k, v rows together, so cutting its rows gives whole heads.
  for (const char* column_parallel :
       {"q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight", "q_proj.bias",
        "k_proj.bias", "v_proj.bias", "gate_proj.bias", "up_proj.bias", "query_key_value.weight",
        "query_key_value.bias", "dense_h_to_4h.weight", "dense_h_to_4h.bias"}) {
    if (EndsWith(name, column_parallel)) return rows();
  }
  // OLMo 2's q/k norms span the whole projection: their weights split as the projection's rows.
  if (!spec.qk_norm_per_head() &&
      (EndsWith(name, "self_attn.q_norm.weight") || EndsWith(name, "self_attn.k_norm.weight"))) {
    return rows();
  }
  for (const char* row_parallel :
       {"o_proj.weight", "down_proj.weight", "attention.dense.weight", "dense_4h_to_h.weight"}) {
    if (EndsWith(name, row_parallel)) return columns();
  }
  return {};
}

bool HeadSharedWeight(const ModelSpec& spec, const std::string& name) {
  return spec.qk_norm_per_head() &&
         (EndsWith(name, "self_attn.q_norm.weight") || EndsWith(name, "self_attn.k_norm.weight"));
}

std::vector<int64_t> SliceShape(const TensorSplit& split, const std::vector<int64_t>& shape, int64_t tp) {
  std::vector<int64_t> out = shape;
  if (split.replicated() || tp == 1) return out;
  // The original dim holding the view's split dim: the first whose running product reaches the
  // view's running product through the split dim.
  const int64_t reach = Product(split.view, 0, static_cast<size_t>(split.dim) + 1);
  int64_t running = 1;
  for (auto& extent : out) {
    running *= extent;
    if (running >= reach) {
      extent /= tp;
      break;
    }
  }
  return out;
}

bool ColumnParallel(const TensorSplit& split, const std::vector<int64_t>& shape, int64_t tp) {
  return shape.size() == 2 && SliceShape(split, shape, tp)[0] != shape[0];
}

void CopySlice(const TensorSplit& split, const std::vector<int64_t>& shape, int64_t tp, int64_t tp_rank, size_t element,
               const uint8_t* full, uint8_t* slice) {
  Transfer(split, shape, tp, tp_rank, element, full, slice, /*to_slice=*/true);
}

void PlaceSlice(const TensorSplit& split, const std::vector<int64_t>& shape, int64_t tp, int64_t tp_rank,
                size_t element, const uint8_t* slice, uint8_t* full) {
  Transfer(split, shape, tp, tp_rank, element, slice, full, /*to_slice=*/false);
}

std::string FormatPiece(const PieceName& p) {
  std::ostringstream out;
  out << p.kind << '/' << p.name << "@tp=" << p.tp_rank << '/' << p.tp << "@[" << p.begin << ',' << p.end << ")@";
  for (size_t i = 0; i < p.shape.size(); ++i) out << (i ? "x" : "") << p.shape[i];
  return out.str();
}

Result<PieceName> ParsePiece(const std::string& stored) {
  const size_t slash = stored.find('/');
  const size_t at_tp = stored.find("@tp=");
  const size_t at_range = stored.find("@[");
  const size_t at_shape = stored.find(")@", at_range == std::string::npos ? 0 : at_range);
  auto bad = [&] {
    return InvalidArgument("'" + stored + "' is not a checkpoint piece (KIND/NAME@tp=R/T@[B,E)@SHAPE)");
  };
  if (slash == std::string::npos || at_tp == std::string::npos || at_range == std::string::npos ||
      at_shape == std::string::npos || at_tp < slash || at_range < at_tp) {
    return bad();
  }
  PieceName p;
  p.kind = stored.substr(0, slash);
  p.name = stored.substr(slash + 1, at_tp - slash - 1);
  long long r = 0, t = 0, b = 0, e = 0;
  if (std::sscanf(stored.c_str() + at_tp, "@tp=%lld/%lld@[%lld,%lld)", &r, &t, &b, &e) != 4 || t < 1 || r < 0 ||
      r >= t || b < 0 || e < b) {
    return bad();
  }
  p.tp_rank = r;
  p.tp = t;
  p.begin = b;
  p.end = e;
  std::istringstream dims(stored.substr(at_shape + 2));
  std::string dim;
  while (std::getline(dims, dim, 'x')) {
    if (dim.empty() || dim.find_first_not_of("0123456789") != std::string::npos) return bad();
    p.shape.push_back(std::stoll(dim));
  }
  if (p.shape.empty()) return bad();
  return p;
}

Status ElementCoverage::Add(int64_t begin, int64_t end) {
  const std::string range = "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
  if (begin < 0 || end <= begin || end > n_) {
    return Corruption("elements " + range + " are not a range of the " + std::to_string(n_) +
                      " elements it belongs to");
  }
  auto next = ranges_.lower_bound(begin);
  if (next != ranges_.end() && next->first < end) {
    return Corruption("elements " + range + " overlap [" + std::to_string(next->first) + ", " +
                      std::to_string(next->second) + "), written by another piece");
  }
  if (next != ranges_.begin()) {
    auto before = std::prev(next);
    if (before->second > begin) {
      return Corruption("elements " + range + " overlap [" + std::to_string(before->first) + ", " +
                        std::to_string(before->second) + "), written by another piece");
    }
  }
  ranges_.emplace(begin, end);
  covered_ += end - begin;
  return Status::Ok();
}

int64_t ElementCoverage::first_missing() const {
  int64_t at = 0;
  for (const auto& [begin, end] : ranges_) {
    if (begin > at) return at;
    at = end;
  }
  return at;
}

Status TensorAssembler::Add(const PieceName& piece, size_t element, const uint8_t* bytes) {
  STRATA_ASSIGN_OR_RETURN(std::span<uint8_t> slot, Slot(piece, element));
  std::memcpy(slot.data(), bytes, slot.size());
  return Status::Ok();
}

Result<std::span<uint8_t>> TensorAssembler::Slot(const PieceName& piece, size_t element) {
  const std::vector<int64_t>& full_shape = piece.shape;
  Partial& part = partial_[piece.name];
  if (part.shape.empty()) {
    part.shape = full_shape;
    part.element = element;
  } else if (part.shape != full_shape || part.element != element) {
    return Corruption("checkpoint pieces of '" + piece.name + "' disagree on its shape or dtype");
  }
  const TensorSplit split = TensorParallelSplit(spec_, piece.name, full_shape, piece.tp);
  const int64_t tp = split.replicated() ? 1 : piece.tp;
  const auto slice_shape = SliceShape(split, full_shape, tp);
  const int64_t slice_elements = Product(slice_shape, 0, slice_shape.size());
  if (piece.end > slice_elements) {
    return Corruption("checkpoint piece " + FormatPiece(piece) + " runs past its slice of " +
                      std::to_string(slice_elements) + " elements");
  }
  auto& slices = part.slices[tp];
  auto& covered = part.covered[tp];
  if (slices.empty()) {
    slices.assign(static_cast<size_t>(tp), std::vector<uint8_t>(static_cast<size_t>(slice_elements) * element));
    covered.assign(static_cast<size_t>(tp), ElementCoverage(slice_elements));
  }
  const auto rank = static_cast<size_t>(split.replicated() ? 0 : piece.tp_rank);
  if (Status added = covered[rank].Add(piece.begin, piece.end); !added.ok()) {
    return Corruption("checkpoint piece " + FormatPiece(piece) + ": " + added.message());
  }
  return std::span<uint8_t>(slices[rank].data() + static_cast<size_t>(piece.begin) * element,
                            static_cast<size_t>(piece.end - piece.begin) * element);
}

Result<std::vector<uint8_t>> TensorAssembler::Take(const std::string& name) {
  auto it = partial_.find(name);
  if (it == partial_.end()) return NotFound("no checkpoint piece of '" + name + "'");
  Partial& part = it->second;
  const int64_t full_elements = Product(part.shape, 0, part.shape.size());
  std::string missing;
  for (auto& [tp, slices] : part.slices) {
    const auto& covered = part.covered[tp];
    bool complete = true;
    for (size_t r = 0; r < covered.size(); ++r) {
      if (covered[r].complete()) continue;
      complete = false;
      if (missing.empty()) {
        missing = " (written under tp=" + std::to_string(tp) + ": element " +
                  std::to_string(covered[r].first_missing()) + " of tp rank " + std::to_string(r) +
                  "'s slice has no piece)";
      }
    }
    if (!complete) continue;
    if (tp == 1) {  // the one slice is the whole tensor: hand it over rather than copy it
      std::vector<uint8_t> full = std::move(slices[0]);
      partial_.erase(it);
      return full;
    }
    const TensorSplit split = TensorParallelSplit(spec_, name, part.shape, tp);
    std::vector<uint8_t> full(static_cast<size_t>(full_elements) * part.element);
    for (int64_t r = 0; r < tp; ++r) PlaceSlice(split, part.shape, tp, r, part.element, slices[r].data(), full.data());
    partial_.erase(it);
    return full;
  }
  return Corruption("the checkpoint pieces of '" + name + "' do not cover the whole tensor" + missing +
                    "; a store is missing or a write was lost");
}

std::vector<std::string> TensorAssembler::names() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : partial_) out.push_back(name);
  return out;
}

PlanSummary SummarizePlan(const RunSpec& spec) {
  const ParallelSpec& p = spec.parallel;
  PlanSummary plan;
  plan.dp = p.dp;
  plan.pp = p.pp;
  plan.tp = p.tp;
  plan.zero = p.zero;
  plan.micro_batch = spec.micro_batch_rows();
  plan.gradient_accumulation = spec.local_batch() / std::max<int64_t>(plan.micro_batch, 1);
  plan.recompute = p.recompute;
  plan.keep_gathered = p.keep_gathered;
  plan.offload = p.offload;
  plan.planned = p.planned();
  for (int64_t k = 0; k < p.pp && plan.planned; ++k) {
    const auto [first, last] = StageLayers(spec.model.layers, p.pp, k, p.stages);
    plan.stages.push_back(last - first);
  }
  return plan;
}

}  // namespace strata::shard
