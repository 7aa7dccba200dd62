"""Reference side of the model-family checks (tests/gpu/family_parity_test.sh).

  make DIR VARIANT SEQUENCES SEQ   a tiny random transformers model of VARIANT (below), fp32,
                                   norms and biases made non-trivial, saved with save_pretrained
                                   as several safetensors files with an index; DIR/tokens.u16
  compare DIR NPY_DIR LAYERS SEQ   every layer and site Strata stored (NPY_DIR/l{L}_{site}.npy)
                                   against transformers' module outputs for the same tokens:
                                   resid_post = the decoder layer's output, attn_out = its
                                   attention module's, mlp_out = its MLP's. fp32, eager attention.
Variants cover what changes the numbers: llama3 rope scaling + head_dim != hidden/heads +
attention and MLP biases; tied embeddings (Llama 3.2); Mistral's sliding window shorter than the
sequence; Qwen2's q/k/v biases (tied); Qwen3's per-head q/k norms; OLMo 2's post-norms and whole-projection q/k norms; Gemma; Pythia (GPT-NeoX, rotary_pct 0.25); GPT-2.
Exit 0 when every max |ours - theirs| / max |theirs| <= 1e-5.
"""
import json
import os
import sys

import numpy as np
import torch

REL_TOL = 1e-5


def config_of(variant, seq):
    import transformers as t
    common = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                  intermediate_size=160, max_position_embeddings=256)
    if variant == "llama3":
        return t.LlamaConfig(**common, num_key_value_heads=2, head_dim=32, attention_bias=True, mlp_bias=True,
                             rope_theta=500000.0, tie_word_embeddings=False,
                             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    if variant == "llama_tied":
        return t.LlamaConfig(**common, num_key_value_heads=1, tie_word_embeddings=True)
    if variant == "mistral":
        return t.MistralConfig(**common, num_key_value_heads=2, sliding_window=seq // 4, tie_word_embeddings=False)
    if variant == "qwen2":
        return t.Qwen2Config(**common, num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1000000.0)
    if variant == "qwen3":  # per-head q/k norms (non-trivial weights below), head_dim != hidden / heads
        return t.Qwen3Config(**common, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False,
                             rope_theta=1000000.0)
    if variant == "olmo2":  # post-norms, q/k norms over the whole projections (non-trivial weights below)
        return t.Olmo2Config(**common, num_key_value_heads=2, tie_word_embeddings=False, rope_theta=500000.0)
    if variant == "gemma":
        return t.GemmaConfig(**common, num_key_value_heads=1, head_dim=32, hidden_activation="gelu_pytorch_tanh")
    if variant == "pythia":
        return t.GPTNeoXConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                               intermediate_size=256, max_position_embeddings=256, rotary_pct=0.25,
                               use_parallel_residual=True, tie_word_embeddings=False)
    if variant == "gpt2":
        return t.GPT2Config(vocab_size=1000, n_embd=64, n_layer=3, n_head=4, n_positions=256)
    raise SystemExit(f"unknown variant {variant}")


def make(directory, variant, sequences, seq):
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    config = config_of(variant, seq)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # a swapped weight / bias, or a missing (1 + w), must show
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5) if "norm" in name or "ln_" in name else p.normal_(0, 0.05)
    model.save_pretrained(directory, safe_serialization=True, max_shard_size="100KB")
    tokens = torch.randint(0, config.vocab_size, (sequences * seq,), dtype=torch.int64).numpy().astype("<u2")
    tokens.tofile(f"{directory}/tokens.u16")


def modules(model):
    base = getattr(model, "model", None) or getattr(model, "transformer", None) or model.gpt_neox
    layers = getattr(base, "layers", None) or base.h
    out = []
    for layer in layers:
        attn = getattr(layer, "self_attn", None) or getattr(layer, "attention", None) or layer.attn
        out.append((layer, attn, layer.mlp))
    return out


def compare(directory, ours, layers, seq):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32, attn_implementation="eager").cuda().eval()
    tokens = torch.from_numpy(np.fromfile(f"{directory}/tokens.u16", dtype="<u2").astype(np.int64)).view(-1, seq).cuda()
    captured = {}

    def hook(key):
        def fn(_module, _inputs, output):
            captured[key] = (output[0] if isinstance(output, tuple) else output).detach().float().reshape(-1, output[0].shape[-1] if isinstance(output, tuple) else output.shape[-1]).cpu()
        return fn

    for index, (layer, attn, mlp) in enumerate(modules(model)):
        layer.register_forward_hook(hook((index, "resid_post")))
        attn.register_forward_hook(hook((index, "attn_out")))
        mlp.register_forward_hook(hook((index, "mlp_out")))
    worst = 0.0
    results = {}
    with torch.no_grad():
        model(tokens)
    for layer in layers:
        for site in ("resid_post", "attn_out", "mlp_out"):
            theirs = captured[(layer, site)].numpy()
            mine = np.load(f"{ours}/l{layer}_{site}.npy").astype(np.float32)
            if mine.shape != theirs.shape:
                print(f"layer {layer} {site}: shape {mine.shape} vs transformers {theirs.shape}")
                return 1
            rel = float(np.abs(mine - theirs).max() / max(np.abs(theirs).max(), 1e-30))
            results[f"l{layer}_{site}"] = rel
            worst = max(worst, rel)
    print(json.dumps({"max_rel": worst, "per_site": results}))
    return 0 if worst <= REL_TOL else 1


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        sys.exit(compare(sys.argv[2], sys.argv[3], [int(x) for x in sys.argv[4].split(",")], int(sys.argv[5])))
