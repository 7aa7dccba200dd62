// `strata export`: a complete checkpoint as a Hugging Face directory that transformers'
// from_pretrained loads, laid out as save_pretrained writes it: config.json (the init_from
// model's config with every field kept, Strata's fields overwritten), model.safetensors or, past
// max_shard_bytes, model-0000K-of-0000N.safetensors with model.safetensors.index.json, and the
// tokenizer / generation files of model.init_from copied along.
#pragma once

#include <string>

#include "common/status.h"
#include "schema/messages.capnp.h"
#include "spec/run_spec.h"

namespace strata::client {

struct ExportOptions {
  std::string dtype = "fp32";                // "fp32" or "bf16" (round to nearest even, as torch)
  uint64_t max_shard_bytes = 5'000'000'000;  // save_pretrained's default "5GB"
  // A LoRA run: the merged model (W + scale * B A over model.init_from's base, in fp32, then
  // `dtype`); without it a LoRA run's export is refused, pointing at ExportAdapter.
  bool merge = false;
  // The blocks' linears as bitsandbytes NF4 (quantize_4bit: blocks of 64, double-quantized
  // scales, from the bf16-rounded weight), with the quant-state entries beside each and a
  // quantization_config in config.json: the layout of a `*-bnb-4bit` repository, which
  // transformers loads with bitsandbytes and init_from loads here. The other tensors in bf16
  // (`dtype` does not apply).
  bool quantized = false;
};

struct ExportSummary {
  size_t tensors = 0;
  uint64_t bytes = 0;
  size_t files = 0;            // safetensors files written
  size_t companion_files = 0;  // copied from model.init_from
};

// Reads the parameters of `manifest` from the shard stores it names (opened read-only, so the
// workers may keep running), checks each against the manifest's checksum, and writes `out_dir`
// one file at a time: host memory holds one output file and one tensor, not the model. On an
// error no weight file of this export is left behind.
Result<ExportSummary> ExportCheckpoint(const RunSpec& spec, CheckpointManifest::Reader manifest,
                                       const std::string& out_dir, const ExportOptions& options = {});

// `strata export --adapter`: a LoRA run's adapters in PEFT's layout, which
// peft.PeftModel.from_pretrained(base, out_dir) loads: adapter_model.safetensors
// (base_model.model.<module>.lora_A.weight / lora_B.weight, model/peft_adapter.h) and
// adapter_config.json. options.dtype applies; max_shard_bytes does not (adapters are small).
Result<ExportSummary> ExportAdapter(const RunSpec& spec, CheckpointManifest::Reader manifest,
                                    const std::string& out_dir, const ExportOptions& options = {});

}  // namespace strata::client
