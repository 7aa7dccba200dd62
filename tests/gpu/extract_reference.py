"""Reference side of the GPU extract checks (tests/gpu/extract_gpu_test.sh).

  make DIR FAMILY SEQUENCES SEQ   a transformers model (FAMILY gpt2 / llama: a small config;
                                  gpt2-124m: GPT2Config's defaults; llama-1b: TinyLlama 1.1B's
                                  shape), save_pretrained to DIR
                                  (safetensors), and DIR/tokens.u16 with SEQUENCES x SEQ random ids
  compare DIR NPY_PREFIX LAYERS   our stored residual stream (NPY_PREFIX<layer>.npy) against the
                                  transformers block outputs for the same tokens, in fp32
  same A.npy B.npy                two captures of the same data (capped vs uncapped GPU)
Exit 0 when within bf16 tolerance; prints the measured differences.
"""
import sys

import numpy as np
import torch

BF16_REL_TOL = 2e-2  # bf16 has an 8-bit mantissa (~4e-3 relative per op); 4-6 blocks accumulate


def make(directory, family, sequences, seq):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    if family == "gpt2-124m":
        config = GPT2Config()
        model = GPT2LMHeadModel(config)
    elif family == "llama-1b":  # TinyLlama 1.1B's shape (vocab 32000 fits u16 tokens), saved in bf16
        config = LlamaConfig(num_hidden_layers=22, hidden_size=2048, num_attention_heads=32, num_key_value_heads=4,
                             intermediate_size=5632, vocab_size=32000, max_position_embeddings=max(seq, 2048),
                             tie_word_embeddings=False)
        with torch.device("cuda"):  # random init of 1.1B parameters: seconds on the GPU, minutes on the CPU
            model = LlamaForCausalLM(config).to(torch.bfloat16)
    elif family == "gpt2":
        config = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=1000, n_positions=seq)
        model = GPT2LMHeadModel(config)
    else:
        config = LlamaConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=8, num_key_value_heads=2,
                             intermediate_size=704, vocab_size=1000, max_position_embeddings=seq, tie_word_embeddings=False)
        model = LlamaForCausalLM(config)
    model.save_pretrained(directory, safe_serialization=True)
    tokens = torch.randint(0, config.vocab_size, (sequences * seq,), dtype=torch.int64).numpy().astype("<u2")
    tokens.tofile(f"{directory}/tokens.u16")


def block_outputs(directory, seq):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32).cuda().eval()
    tokens = torch.from_numpy(np.fromfile(f"{directory}/tokens.u16", dtype="<u2").astype(np.int64)).view(-1, seq).cuda()
    blocks = model.transformer.h if hasattr(model, "transformer") else model.model.layers
    captured = {}
    hooks = [b.register_forward_hook(lambda m, i, o, l=l: captured.__setitem__(l, (o[0] if isinstance(o, tuple) else o)))
             for l, b in enumerate(blocks)]
    with torch.no_grad():
        model(tokens)
    for h in hooks:
        h.remove()
    return {l: t.reshape(-1, t.shape[-1]).float().cpu().numpy() for l, t in captured.items()}


def relative(ours, ref):
    diff = np.abs(ours.astype(np.float32) - ref)
    return diff.max() / np.abs(ref).max(), diff.mean() / np.abs(ref).mean()


def compare(directory, prefix, layers, seq):
    ref = block_outputs(directory, seq)
    ok = True
    for layer in layers:
        ours = np.load(f"{prefix}{layer}.npy")
        assert ours.shape == ref[layer].shape, (ours.shape, ref[layer].shape)
        worst, mean = relative(ours, ref[layer])
        print(f"layer {layer}: max|diff|/max|ref| = {worst:.2e}, mean|diff|/mean|ref| = {mean:.2e} over {ours.shape}")
        ok = ok and worst < BF16_REL_TOL * 5 and mean < BF16_REL_TOL
    return ok


def same(a_path, b_path):
    a, b = np.load(a_path), np.load(b_path)
    assert a.shape == b.shape, (a.shape, b.shape)
    worst, mean = relative(a, b)
    print(f"{a_path} vs {b_path}: bitwise equal = {np.array_equal(a, b)}, max rel {worst:.2e}, mean rel {mean:.2e}")
    return worst < BF16_REL_TOL


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "make":
        make(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        sys.exit(0)
    if mode == "compare":
        sys.exit(0 if compare(sys.argv[2], sys.argv[3], [int(x) for x in sys.argv[4].split(",")], int(sys.argv[5])) else 1)
    if mode == "same":
        sys.exit(0 if same(sys.argv[2], sys.argv[3]) else 1)
    sys.exit(2)
