"""The capture method our users use today (TransformerLens / hand-rolled scripts): a transformers
model in bf16, output_hidden_states=True, and one torch.save per layer per batch.

usage: hf_capture_baseline.py MODEL_DIR TOKENS_U16 SEQ BATCH OUT_DIR
Prints one JSON line: tokens, bytes written, seconds (including a final sync), GB/s, tokens/s.
"""
import json
import os
import sys
import time

import torch
from hf_inputs import load

model_dir, tokens_path, seq, batch, out_dir = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
model, tokens = load(model_dir, tokens_path, seq)
os.makedirs(out_dir, exist_ok=True)
written = 0
torch.cuda.synchronize()
start = time.time()
with torch.no_grad():
    for b in range(0, tokens.shape[0], batch):
        out = model(tokens[b : b + batch].cuda(), output_hidden_states=True)
        for layer, h in enumerate(out.hidden_states):
            path = f"{out_dir}/batch{b // batch:06d}_layer{layer:02d}.pt"
            torch.save(h.cpu(), path)
            written += h.numel() * h.element_size()
os.sync()
seconds = time.time() - start
print(json.dumps({"method": "transformers output_hidden_states + torch.save", "tokens": tokens.numel(),
                  "bytes": written, "seconds": round(seconds, 2), "GB_per_s": round(written / seconds / 1e9, 3),
                  "tokens_per_s": round(tokens.numel() / seconds)}))
