#!/usr/bin/env bash
# The GPU node's check of a change, in parts that each fit one device call (README, "GPU build"):
#   build    configure and build build-gpu/ (LibTorch + CUDA; the targets the other parts need)
#   unit     the GPU unit tests: trainer_gpu_test, kernels_gpu_test, hf_parity_test (ctest -L gpu)
#   lora     LoRA: the GPU check against PEFT (lora_gpu), the LoRA trainer tests and the cluster
#            test of the adapter export, whose PEFT check runs where peft is installed
#   suites   the GPU suites against transformers: family parity, extract, and the meshes one GPU
#            can run (mesh_gpu; it skips what needs more GPUs)
#   sites    every capture site and patch against transformers' hooks (about 110 s a family: more
#            than one call holds for all seven, so SITES_VARIANTS="llama3 mistral" picks some)
#   train    bench/train_compare.sh gpt2: the training step against torch.compile, same card
#   capture  bench/extract_bench.sh: capture throughput against the users' method and the disk
#   loraperf bench/lora_bench.sh: LoRA and QLoRA of a Llama-3.1-8B shape against PEFT, same card
#   qlora70b bench/qlora70b_bench.sh: QLoRA of a Llama-3.1-70B shape on one GPU, peak vs estimate
# usage: source scripts/gpu-node-env.sh && bash scripts/gpu-check.sh OUT PART...
# Each part writes its log (and the benchmarks their results) under OUT/PART/.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1
shift
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for part in "$@"; do
  mkdir -p "$out/$part"
  start=$(date +%s)
  case $part in
    build)
      cmake -S . -B build-gpu -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 >"$out/$part/configure.log" 2>&1
      cmake --build build-gpu -j "$(nproc)" --target strata strata-coordinator strata-worker trainer_gpu_test \
        kernels_gpu_test hf_parity_test train_step_bench trainer_lora_test cluster_test >"$out/$part/build.log" 2>&1 ||
        { tail -40 "$out/$part/build.log"; exit 1; }
      ;;
    unit)
      (cd build-gpu && ctest -L gpu -R 'GpuTest|KernelsGpuTest|HfParity' --output-on-failure) >"$out/$part/ctest.log" 2>&1 ||
        { tail -60 "$out/$part/ctest.log"; exit 1; }
      tail -3 "$out/$part/ctest.log"
      ;;
    suites)
      export FAMILY_PARITY_OUT=$out/$part/family.jsonl
      (cd build-gpu && ctest -R 'family_parity_gpu|extract_gpu|mesh_gpu' --output-on-failure) \
        >"$out/$part/ctest.log" 2>&1 || { tail -60 "$out/$part/ctest.log"; exit 1; }
      tail -8 "$out/$part/ctest.log"
      ;;
    sites)
      export SITES_PARITY_OUT=$out/$part/sites.jsonl
      (cd build-gpu && ctest -R 'sites_parity_gpu' --output-on-failure) >"$out/$part/ctest.log" 2>&1 ||
        { tail -60 "$out/$part/ctest.log"; exit 1; }
      tail -4 "$out/$part/ctest.log"
      ;;
    lora)
      (cd build-gpu && ctest -V -R 'lora_gpu|LoraTrainerTest|ClusterTest.LoraAdapters') >"$out/$part/ctest.log" 2>&1 ||
        { tail -60 "$out/$part/ctest.log"; exit 1; }
      tail -5 "$out/$part/ctest.log"
      ;;
    train) bash bench/train_compare.sh build-gpu "$out/$part" gpt2 >"$out/$part/log.txt" 2>&1 || { tail -40 "$out/$part/log.txt"; exit 1; } ;;
    capture) bash bench/extract_bench.sh build-gpu "$out/$part" >"$out/$part/log.txt" 2>&1 || { tail -40 "$out/$part/log.txt"; exit 1; } ;;
    loraperf) bash bench/lora_bench.sh build-gpu "$out/$part" >"$out/$part/log.txt" 2>&1 || { tail -40 "$out/$part/log.txt"; exit 1; }
      tail -30 "$out/$part/log.txt" ;;
    qlora70b) bash bench/qlora70b_bench.sh build-gpu "$out/$part" >"$out/$part/log.txt" 2>&1 || { tail -40 "$out/$part/log.txt"; exit 1; }
      tail -5 "$out/$part/log.txt" ;;
    *)
      echo "unknown part $part (build, unit, suites, sites, lora, train, capture, loraperf, qlora70b)" >&2
      exit 2
      ;;
  esac
  echo "$part: $(($(date +%s) - start)) s"
done
