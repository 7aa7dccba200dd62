@0xca282995902c7fdc;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("strata::wire");
# The validated run spec as it travels between Strata processes (spec/run_spec.h is the C++ type;
# spec/run_spec_capnp.h converts). The user writes TOML, which is parsed and checked once where it
# enters a daemon; behind that edge the spec moves as this struct: the coordinator's assignments
# carry it with the plan filled in (`parallel` is the plan: mesh, stages, ZeRO stage, offload), and
# the journal keeps it beside the TOML display copy.
#
# Each enum lists its values in the order of the C++ enum of the same name (spec/spec_choices.h);
# spec/run_spec_capnp_test.cc checks the two agree value by value.

struct RunSpec {
  name @0 :Text;
  kind @1 :RunKind;
  model @2 :ModelSpec;
  data @3 :DataSpec;
  train @4 :TrainSpec;
  parallel @5 :ParallelSpec;
  worker @6 :WorkerSpec;
  extract @7 :ExtractSpec;
  patch @8 :PatchSpec;
  lora @9 :LoraSpec;
}

enum RunKind { train @0; extract @1; patch @2; }
enum Family { gpt2 @0; llama @1; mistral @2; qwen2 @3; gemma @4; gptNeox @5; qwen3 @6; olmo2 @7; }
enum Activation { familyDefault @0; geluTanh @1; gelu @2; silu @3; }
enum RopeScalingType { none @0; linear @1; llama3 @2; }
enum TokenFormat { bytes @0; u16 @1; u32 @2; npy @3; text @4; }
enum LrSchedule { constant @0; cosine @1; }
enum Precision { fp32 @0; bf16 @1; }
enum Optimizer { adamw @0; adamw8bit @1; }
enum Offload { none @0; optimizer @1; optimizerAndParams @2; }
enum ExtractMode { auto @0; whole @1; layerwise @2; }
enum StoredDType { fp32 @0; bf16 @1; fp16 @2; }
enum Ablation { zero @0; mean @1; steer @2; }
enum LoraBase { dense @0; nf4 @1; }

struct RopeScaling {
  type @0 :RopeScalingType;
  factor @1 :Float64;
  lowFreqFactor @2 :Float64;
  highFreqFactor @3 :Float64;
  originalMaxPositions @4 :Int64;
}

struct ModelSpec {
  family @0 :Family;
  layers @1 :Int64;
  hidden @2 :Int64;
  heads @3 :Int64;
  vocab @4 :Int64;
  sequence @5 :Int64;
  kvHeads @6 :Int64;
  ffn @7 :Int64;
  headDim @8 :Int64;
  maxPositions @9 :Int64;
  ropeTheta @10 :Float64;
  ropeScaling @11 :RopeScaling;
  rotaryPct @12 :Float64;
  normEps @13 :Float64;
  attentionBias @14 :Bool;
  mlpBias @15 :Bool;
  tieEmbeddings @16 :Bool;
  slidingWindow @17 :Int64;
  parallelResidual @18 :Bool;
  activation @19 :Activation;
  initFrom @20 :Text;
  adapterFrom @21 :Text;
}

struct DataSpec {
  path @0 :Text;
  format @1 :TokenFormat;
  documents @2 :Text;
  sampleWithinDocuments @3 :Bool;
  tokenizer @4 :Text;
}

struct TrainSpec {
  steps @0 :Int64;
  globalBatch @1 :Int64;
  lr @2 :Float64;
  weightDecay @3 :Float64;
  beta1 @4 :Float64;
  beta2 @5 :Float64;
  eps @6 :Float64;
  gradClip @7 :Float64;
  seed @8 :Int64;
  checkpointEvery @9 :Int64;   # -1: "auto" (TrainSpec::kAutoCheckpoints)
  keepCheckpoints @10 :Int64;
  lrSchedule @11 :LrSchedule;
  warmupSteps @12 :Int64;
  minLr @13 :Float64;
  precision @14 :Precision;
  cudaGraphs @15 :Bool;
  optimizer @16 :Optimizer;
}

# The mesh and memory settings: in an assignment, the coordinator's plan.
struct ParallelSpec {
  dp @0 :Int64;
  pp @1 :Int64;
  tp @2 :Int64;
  microBatch @3 :Int64;
  zero @4 :Int64;
  recompute @5 :Bool;
  stages @6 :List(Int64);
  offload @7 :Offload;
  keepGathered @8 :Int64;
  sequenceParallel @9 :Bool;
  tpCommOverlap @10 :Bool;
  automatic @11 :List(Text);   # fields left to the planner; empty once planned
}

struct WorkerSpec {
  threads @0 :Int64;
}

struct ExtractSpec {
  layers @0 :List(Int64);
  sites @1 :List(Text);
  dtype @2 :StoredDType;
  precision @3 :Precision;
  batch @4 :Int64;
  tokens @5 :Int64;
  mode @6 :ExtractMode;
  logitsTopK @7 :Int64;
}

struct PatchSpec {
  layers @0 :List(Int64);
  sites @1 :List(Text);
  ablation @2 :Ablation;
  source @3 :Text;
  logits @4 :Bool;
  alpha @5 :Float64 = 1.0;
}

struct LoraSpec {
  enabled @0 :Bool;
  rank @1 :Int64;
  alpha @2 :Float64;
  dropout @3 :Float64;
  targetModules @4 :List(Text);
  useRslora @5 :Bool;
  base @6 :LoraBase;
}
