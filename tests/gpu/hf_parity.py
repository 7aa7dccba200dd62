"""Checks that a model exported by Strata loads in transformers and gives the same logits.

usage: python3 hf_parity.py DIR [TOLERANCE]   (DIR holds config.json, model.safetensors from Strata and
expected.safetensors with int64 "tokens" [b, t] and fp32 "logits" [b, t, vocab] from Strata)
Prints the max abs difference; exits 0 when it is within TOLERANCE (default 1e-4, fp32 vs fp32;
bf16 logits are checked relative to the logits' scale).
"""
import json
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

directory = sys.argv[1]
expected = load_file(f"{directory}/expected.safetensors")
model = AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32, attn_implementation="eager")
model.eval()
if torch.cuda.is_available():  # the same device as Strata's logits: fp32 on both, no TF32
    model = model.cuda()
with torch.no_grad():
    logits = model(expected["tokens"].to(model.device)).logits.float().cpu()
diff = (logits - expected["logits"]).abs().max().item()
family = json.load(open(f"{directory}/config.json"))["model_type"]
print(f"{family}: max |logits - transformers| = {diff:.3e} over {tuple(logits.shape)}")
tolerance = float(sys.argv[2]) if len(sys.argv) > 2 else 1e-4
scale = logits.abs().max().item() if len(sys.argv) > 2 else 1.0
print(f"  relative to max |logits| = {scale:.3f}: {diff / scale:.3e} (tolerance {tolerance:.0e})")
sys.exit(0 if diff / scale < tolerance else 1)
