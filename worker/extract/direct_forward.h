// A single-process forward pass of an extract spec's model over its data, in chunks of
// extract.batch sequences as extract workers run it, on the CPU: the reference that activations
// stored by an extract run are checked against (tests, tooling). Shares the model code with the
// workers, not the capture, storage or scheduling path. Torch-free header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "spec/run_spec.h"

namespace strata::worker {

// Rows of (layer, site) for every sequence the run captures, [rows, row shape...] row-major in
// the site's stored dtype (ExtractSiteRowShape, ExtractSiteDType); model-level sites at layer
// model.layers - 1; a patch run's loss (and logits) with its ablation applied. Uses spec.worker.threads intra-op
// threads (sets LibTorch's process-wide count), as a CPU worker does, so fp32 results are bit-identical to theirs.
Result<std::string> DirectForwardActivations(const RunSpec& spec, int64_t layer, const std::string& site);

// A patch run's per-row loss, computed apart from the capture code (its own block loop and
// LibTorch's cross_entropy), in fp32: the independent reference the stored loss is checked
// against. patch.sites at patch.layers are replaced by zeros, or (non-empty `mean`, of a
// [hidden]-wide site) by `mean` at every row - or, for ablation = "steer", get patch.alpha x
// `mean` added; patch.source is not read. NaN at each sequence's last row.
Result<std::vector<float>> DirectForwardPatchedLoss(const RunSpec& spec, const std::vector<float>& mean = {});

}  // namespace strata::worker
