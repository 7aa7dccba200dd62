"""The users' method for capturing every hook site (bench/activations_bench.sh): a transformers
model in bf16 with eager attention (the attention pattern needs it), forward hooks on every site
(tests/gpu/sites_reference.py's capture_tensors: the hooks the parity test checks Strata against),
and one torch.save of every site per batch, then a sync.

usage: hf_sites_baseline.py MODEL_DIR TOKENS_U16 SEQ BATCH OUT_DIR
Prints one JSON line: tokens, bytes written, seconds (first batch to after the sync; the model
load is not counted), GB/s, tokens/s.
"""
import json
import os
import sys
import time

import torch
from hf_inputs import load

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu"))
from sites_reference import capture_tensors  # noqa: E402

model_dir, tokens_path, seq, batch, out_dir = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
model, tokens = load(model_dir, tokens_path, seq, attn_implementation="eager")
os.makedirs(out_dir, exist_ok=True)
written = 0
torch.cuda.synchronize()
start = time.time()
for b in range(0, tokens.shape[0], batch):
    sites = capture_tensors(model, tokens[b : b + batch].cuda())
    on_host = {f"layer{layer}.{site}": t.cpu() for (layer, site), t in sites.items()}
    torch.save(on_host, f"{out_dir}/batch{b // batch:06d}.pt")
    written += sum(t.numel() * t.element_size() for t in on_host.values())
    del sites, on_host
os.sync()
seconds = time.time() - start
print(json.dumps({"method": "transformers hooks on every site + torch.save", "tokens": tokens.numel(),
                  "bytes": written, "seconds": round(seconds, 2), "GB_per_s": round(written / seconds / 1e9, 3),
                  "tokens_per_s": round(tokens.numel() / seconds)}))
