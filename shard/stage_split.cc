// The layers of each pipeline stage: balanced by compute and parameters (BalanceStages), or the
// job's fixed split, computed once per pipeline depth (StageSplits).
#include <algorithm>
#include <cmath>
#include <limits>

#include "shard/internal.h"
#include "shard/layout.h"

namespace strata::shard::internal {

// Stage balancing: the split of the layers over `pp` stages whose busiest stage is least busy, a
// stage's load being the larger of its share of the compute and of the parameters. Every
// transformer layer costs the same, so a stage's load depends only on its layer count and on
// whether it is the first (the embedding), the last (the head) or one between, and it grows with
// the count. So the least busiest load of stages 0..k over the first j layers, best(k, j), is the
// smallest of the finitely many loads load(stage, count) at which the stages' largest counts
// within it add up to j; each is found by bisection. Going back from the last stage, stage k
// then starts at the smallest cut i with max(best(k - 1, i), load(k, j - i)) = best(k, j): since
// best grows with i, that is j less the most layers stage k holds within best(k, j). This is the
// O(pp layers^2) dynamic programme's answer (smallest cut on ties), bit for bit, in
// O(pp log layers): planning a 1,024-layer model over 512 stages no longer takes seconds
// (shard/estimator_test.cc holds the programme as the reference).
std::vector<LayerRange> BalanceStages(const Problem& problem, int64_t pp) {
  const int64_t layers = problem.model.layers;
  const UnitParams u = CountUnits(problem.model, pp, /*tp=*/1);  // whole units: the stages' shares of the model
  const double layer = static_cast<double>(u.layer_sharded + u.layer_replicated);
  const double head_flops = static_cast<double>(problem.model.vocab * problem.model.hidden);
  const double embedding = static_cast<double>(u.embedding_sharded + u.embedding_replicated);
  const double head = static_cast<double>(u.head_sharded + u.head_replicated);
  const double total_flops = layers * layer + head_flops;
  const double total_params = layers * layer + embedding + head;
  auto load = [&](int64_t stage, int64_t count) {
    double flops = count * layer, params = count * layer;
    if (stage == 0) params += embedding;
    if (stage == pp - 1) flops += head_flops, params += head;
    return std::max(flops / total_flops, params / total_params);
  };
  // The most layers `stage` holds with a load within `bound` (0: not even one): the count the
  // load's formula solves for, then stepped to what `load` itself says, so that it agrees with
  // every comparison of loads bit for bit.
  auto most_within = [&](int64_t stage, double bound) {
    const double flops_extra = stage == pp - 1 ? head_flops : 0.0;
    const double params_extra = (stage == 0 ? embedding : 0.0) + (stage == pp - 1 ? head : 0.0);
    const double solved =
        std::min((bound * total_flops - flops_extra) / layer, (bound * total_params - params_extra) / layer);
    int64_t count = static_cast<int64_t>(std::clamp(std::floor(solved), 0.0, static_cast<double>(layers)));
    while (count < layers && load(stage, count + 1) <= bound) ++count;
    while (count > 0 && load(stage, count) > bound) --count;
    return count;
  };
  // Stages 0..k: the first, `between` stages between the first and the last, and the last when
  // k is it (pp > 1). Whether they hold j layers with no load above `bound`.
  auto has_last = [&](int64_t k) { return pp > 1 && k == pp - 1; };
  auto between = [&](int64_t k) { return k - (has_last(k) ? 1 : 0); };
  auto holds = [&](int64_t k, int64_t j, double bound) {
    int64_t total = most_within(0, bound);
    if (total == 0) return false;
    if (between(k) > 0) {
      const int64_t each = most_within(1, bound);
      if (each == 0) return false;
      total += between(k) * each;
    }
    if (has_last(k)) {
      const int64_t last = most_within(pp - 1, bound);
      if (last == 0) return false;
      total += last;
    }
    return total >= j;
  };
  // best(k, j): the smallest load of a stage kind present in 0..k at which they hold j layers.
  auto best = [&](int64_t k, int64_t j) {
    std::vector<int64_t> kinds = {0};
    if (between(k) > 0) kinds.push_back(1);
    if (has_last(k)) kinds.push_back(pp - 1);
    double found = std::numeric_limits<double>::infinity();
    for (int64_t stage : kinds) {
      int64_t lo = 1, hi = j;  // the smallest count whose load holds the layers (j always does)
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (holds(k, j, load(stage, mid)))
          hi = mid;
        else
          lo = mid + 1;
      }
      if (holds(k, j, load(stage, lo))) found = std::min(found, load(stage, lo));
    }
    return found;
  };
  std::vector<LayerRange> ranges(pp);
  int64_t end = layers;
  for (int64_t k = pp - 1; k >= 1; --k) {
    const int64_t begin = std::max(k, end - most_within(k, best(k, end)));
    ranges[k] = {begin, end};
    end = begin;
  }
  ranges[0] = {0, end};
  return ranges;
}

const std::vector<LayerRange>& StageSplits::For(const Problem& problem, int64_t pp) {
  auto it = by_pp_.find(pp);
  if (it == by_pp_.end()) {
    std::vector<LayerRange> ranges;
    if (static_cast<int64_t>(problem.job.stages.size()) == pp) {
      for (int64_t k = 0; k < pp; ++k) {
        const auto [begin, end] = StageLayers(problem.model.layers, pp, k, problem.job.stages);
        ranges.push_back({begin, end});
      }
    } else {
      ranges = BalanceStages(problem, pp);
    }
    it = by_pp_.emplace(pp, std::move(ranges)).first;
  }
  return it->second;
}

}  // namespace strata::shard::internal
