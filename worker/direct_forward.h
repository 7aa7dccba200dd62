// A single-process forward pass of an extract spec's model over its data, in chunks of
// extract.batch sequences as extract workers run it, on the CPU: the reference that activations
// stored by an extract run are checked against (tests, tooling). Shares the model code with the
// workers, not the capture, storage or scheduling path. Torch-free header.
#pragma once

#include <cstdint>
#include <string>

#include "common/run_spec.h"
#include "common/status.h"

namespace strata::worker {

// Rows of (layer, site) for every sequence the run captures, [rows, hidden] row-major in
// extract.dtype. Uses spec.worker.threads intra-op threads (sets LibTorch's process-wide count),
// as a CPU worker does, so fp32 results are bit-identical to theirs.
Result<std::string> DirectForwardActivations(const RunSpec& spec, int64_t layer, const std::string& site);

}  // namespace strata::worker
