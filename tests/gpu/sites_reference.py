"""Reference side of the capture-site and patch checks (tests/gpu/sites_gpu_test.sh).

  compare DIR NPY_DIR LAYERS SEQ          every site Strata stored (NPY_DIR/l{L}_{site}.npy; the
                                          model-level ones at the last layer) against transformers
                                          in fp32 with eager attention, on DIR/tokens.u16
  patch DIR NPY SITE LAYER SEQ [MEAN]     a patch run's stored loss (zero ablation of SITE at
                                          LAYER, or with MEAN.npy every row's value) against
                                          transformers with the same ablation hook
  mean DIR OUT SITE LAYER SEQ             transformers' mean of SITE at LAYER over every row,
                                          saved as fp32 OUT (patch.source of a mean ablation)
Models come from family_reference.py's `make` (tiny random models of every family). Exit 0 when
every max |ours - theirs| / max |theirs| <= 1e-5; prints one JSON object.

How transformers' sites are taken (docs/extract.md defines ours):
  resid_pre     forward pre-hook on the decoder layer (its hidden_states input)
  attn_out      the attention module's output[0];  resid_mid = resid_pre + attn_out (a block with
                norms on its sublayers' outputs, OLMo 2: + post_attention_layernorm(attn_out))
  q, k, v       the query, key, value the attention module hands to eager_attention_forward
                (after rotary, before repeat_kv), wrapped in each family's modeling module
  attn_pattern  the attention weights eager_attention_forward returns
  mlp_hidden    forward pre-hook on the MLP's down projection (c_proj / dense_4h_to_h / down_proj)
  mlp_out       the MLP's output;  resid_post  the decoder layer's output
  final_norm    the final norm module's output;  logits  the model's logits
  loss          cross_entropy(logits[:, p], tokens[:, p + 1]) per row, NaN at the last position
"""
import importlib
import json
import sys

import numpy as np
import torch

REL_TOL = 1e-5
FAMILY_MODULES = ["gpt2", "gpt_neox", "llama", "mistral", "qwen2", "qwen3", "olmo2", "gemma"]


def load(directory, seq):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32, attn_implementation="eager").cuda().eval()
    tokens = torch.from_numpy(np.fromfile(f"{directory}/tokens.u16", dtype="<u2").astype(np.int64)).view(-1, seq).cuda()
    return model, tokens


def parts(model):
    base = getattr(model, "model", None) or getattr(model, "transformer", None) or model.gpt_neox
    layers = getattr(base, "layers", None) or base.h
    final = getattr(base, "norm", None) or getattr(base, "ln_f", None) or base.final_layer_norm
    out = []
    for layer in layers:
        attn = getattr(layer, "self_attn", None) or getattr(layer, "attention", None) or layer.attn
        mlp = layer.mlp
        down = getattr(mlp, "down_proj", None) or getattr(mlp, "c_proj", None) or mlp.dense_4h_to_h
        out.append((layer, attn, mlp, down))
    return out, final


def first(output):
    return output[0] if isinstance(output, tuple) else output


def capture(model, tokens):
    """Every site of every layer, as numpy [rows, row shape...] in fp32."""
    return {k: v.detach().float().cpu().numpy() for k, v in capture_tensors(model, tokens).items()}


def capture_tensors(model, tokens):
    """Every site of every layer, as tensors [rows, row shape...] in the model's dtype, on its
    device ((layer, site) -> tensor; the model-level sites at the last layer). Also the users'
    method of bench/hf_sites_baseline.py."""
    captured = {}
    blocks, final = parts(model)
    attention_calls = []

    # q, k, v and the pattern: wrap eager_attention_forward in each family's modeling module
    # (the attention forward looks the global up at call time). Calls come in layer order.
    originals = {}
    for name in FAMILY_MODULES:
        try:
            module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        except ImportError:
            continue
        if not hasattr(module, "eager_attention_forward"):
            continue
        original = module.eager_attention_forward
        originals[module] = original

        def wrapped(mod, query, key, value, *args, _original=original, **kwargs):
            out = _original(mod, query, key, value, *args, **kwargs)
            attention_calls.append((query, key, value, out[1]))
            return out

        module.eager_attention_forward = wrapped
    if not originals:
        raise SystemExit("this transformers has no eager_attention_forward to wrap; use transformers >= 4.48")

    hooks = []
    for index, (layer, attn, mlp, down) in enumerate(blocks):
        def pre(_m, args, kwargs, i=index):
            captured[(i, "resid_pre")] = args[0] if args else kwargs["hidden_states"]
        hooks.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
        hooks.append(layer.register_forward_hook(lambda _m, _i, o, i=index: captured.__setitem__((i, "resid_post"), first(o))))
        hooks.append(attn.register_forward_hook(lambda _m, _i, o, i=index: captured.__setitem__((i, "attn_out"), first(o))))
        hooks.append(mlp.register_forward_hook(lambda _m, _i, o, i=index: captured.__setitem__((i, "mlp_out"), first(o))))
        hooks.append(down.register_forward_pre_hook(lambda _m, args, i=index: captured.__setitem__((i, "mlp_hidden"), args[0])))
    hooks.append(final.register_forward_hook(lambda _m, _i, o: captured.__setitem__("final_norm", o)))
    try:
        with torch.no_grad():
            logits = model(tokens, use_cache=False).logits
    finally:
        for h in hooks:
            h.remove()
        for module, original in originals.items():
            module.eager_attention_forward = original
    assert len(attention_calls) == len(blocks), (len(attention_calls), len(blocks))
    out = {}
    for i, (query, key, value, weights) in enumerate(attention_calls):
        # [b, heads, t, x] -> [b * t, heads, x]
        for site, t in (("q", query), ("k", key), ("v", value), ("attn_pattern", weights)):
            out[(i, site)] = t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3])
        # A block with norms on its sublayers' outputs (OLMo 2) adds the normed attention output.
        layer = blocks[i][0]
        attn_out = captured[(i, "attn_out")]
        if hasattr(layer, "post_feedforward_layernorm"):
            with torch.no_grad():
                attn_out = layer.post_attention_layernorm(attn_out)
        out[(i, "resid_mid")] = captured[(i, "resid_pre")] + attn_out
    for key, t in captured.items():
        if isinstance(key, tuple):
            out[key] = t.reshape(-1, t.shape[-1])
    last = len(blocks) - 1
    out[(last, "final_norm")] = captured["final_norm"].reshape(-1, captured["final_norm"].shape[-1])
    out[(last, "logits")] = logits.reshape(-1, logits.shape[-1])
    return out


def relative(mine, theirs):
    both = ~np.isnan(theirs)
    return float(np.abs(mine[both] - theirs[both]).max() / max(np.abs(theirs[both]).max(), 1e-30))


def compare(directory, ours, layers, seq):
    model, tokens = load(directory, seq)
    ref = capture(model, tokens)
    worst, results = 0.0, {}
    for (layer, site), theirs in sorted(ref.items()):
        if layer not in layers:
            continue
        mine = np.load(f"{ours}/l{layer}_{site}.npy").astype(np.float32)
        if mine.size != theirs.size:
            print(json.dumps({"error": f"layer {layer} {site}: {mine.shape} vs transformers {theirs.shape}"}))
            return 1
        rel = relative(mine.reshape(theirs.shape), theirs)
        results[f"l{layer}_{site}"] = rel
        worst = max(worst, rel)
    print(json.dumps({"max_rel": worst, "per_site": results}))
    return 0 if worst <= REL_TOL else 1


def mean(directory, out, site, layer, seq):
    model, tokens = load(directory, seq)
    values = capture(model, tokens)[(layer, site)]
    np.save(out, values.mean(0).astype(np.float32))
    return 0


def patch(directory, ours, site, layer, seq, mean_path=None):
    model, tokens = load(directory, seq)
    blocks, _ = parts(model)
    block, attn, mlp, _ = blocks[layer]
    module = {"attn_out": attn, "mlp_out": mlp, "resid_post": block}[site]
    vector = torch.from_numpy(np.load(mean_path)).cuda() if mean_path else None

    def replaced(t):
        return torch.zeros_like(t) if vector is None else vector.expand_as(t).clone()

    def zero(_m, _i, o):
        if isinstance(o, tuple):
            return (replaced(o[0]),) + tuple(o[1:])
        return replaced(o)

    hook = module.register_forward_hook(zero)
    with torch.no_grad():
        logits = model(tokens, use_cache=False).logits.float()
    hook.remove()
    b, t, v = logits.shape
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, v), tokens[:, 1:].reshape(-1), reduction="none")
    loss = torch.cat([loss.view(b, t - 1), torch.full((b, 1), float("nan"), device=loss.device)], 1).reshape(-1).cpu().numpy()
    mine = np.load(ours).astype(np.float32).reshape(-1)
    if mine.shape != loss.shape:
        print(json.dumps({"error": f"loss {mine.shape} vs transformers {loss.shape}"}))
        return 1
    nan_same = bool(np.array_equal(np.isnan(mine), np.isnan(loss)))
    rel = relative(mine, loss)
    print(json.dumps({"site": site, "layer": layer, "ablation": "mean" if mean_path else "zero", "max_rel": rel,
                      "nan_positions_match": nan_same}))
    return 0 if rel <= REL_TOL and nan_same else 1


if __name__ == "__main__":
    if sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3], [int(x) for x in sys.argv[4].split(",")], int(sys.argv[5])))
    if sys.argv[1] == "patch":
        sys.exit(patch(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]),
                       sys.argv[7] if len(sys.argv) > 7 else None))
    if sys.argv[1] == "mean":
        sys.exit(mean(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])))
    sys.exit(2)
