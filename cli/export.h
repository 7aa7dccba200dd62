// `strata export`: a complete checkpoint as a Hugging Face directory (config.json +
// model.safetensors, fp32) that transformers' from_pretrained loads.
#pragma once

#include <string>

#include "common/status.h"
#include "schema/messages.capnp.h"

namespace strata::cli {

struct ExportSummary {
  size_t tensors = 0;
  uint64_t bytes = 0;
};

// Reads the parameters of `manifest` from the shard stores it names (opened read-only, so the
// workers may keep running), checks each against the manifest's checksum, and writes `out_dir`.
Result<ExportSummary> ExportCheckpoint(const std::string& spec_toml, CheckpointManifest::Reader manifest,
                                       const std::string& out_dir);

}  // namespace strata::cli
