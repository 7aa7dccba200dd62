"""Reference side of the train-step check (tests/gpu/train_step_parity_test.sh): the steps a
Strata run took, taken again in PyTorch with the conventions of docs/run-spec.md ("What one step
computes": batches, loss, AdamW), from the same Hugging Face directory.

  compare DIR STATUS_JSON SEQ BATCH LR SEED   transformers' model of DIR (fp32, CPU, eager
                                              attention), the windows of DIR/tokens.u16 that
                                              Strata's steps drew, torch.optim.AdamW (betas 0.9 /
                                              0.999, eps 1e-8, no weight decay, no clipping,
                                              constant lr); every step's loss against the losses
                                              of `strata status RUN --json`
Exit 0 when every step's loss is within 1e-5 relative; prints one JSON object.
"""
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F

REL_TOL = 1e-5
M64 = (1 << 64) - 1


class MT19937_64:  # std::mt19937_64
    def __init__(self, seed):
        self.mt, self.i = [seed & M64], 312
        for i in range(1, 312):
            p = self.mt[-1]
            self.mt.append((6364136223846793005 * (p ^ (p >> 62)) + i) & M64)

    def __call__(self):
        if self.i == 312:
            for k in range(312):
                y = (self.mt[k] & 0xFFFFFFFF80000000) | (self.mt[(k + 1) % 312] & 0x7FFFFFFF)
                self.mt[k] = self.mt[(k + 156) % 312] ^ (y >> 1) ^ (0xB5026F5AA96619E9 if y & 1 else 0)
            self.i = 0
        y = self.mt[self.i]
        self.i += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        return (y ^ (y >> 43)) & M64


def compare(directory, status_path, seq, batch, lr, seed):
    from transformers import AutoModelForCausalLM
    ours = json.load(open(status_path))["losses"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32, attn_implementation="eager")
    model.train()
    tokens = torch.from_numpy(np.fromfile(f"{directory}/tokens.u16", dtype="<u2").astype(np.int64))
    params = list(model.parameters())  # a tied head once
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.0},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.999), eps=1e-8)
    theirs = []
    for s in range(1, len(ours) + 1):
        rng = MT19937_64(seed * 0x9E3779B97F4A7C15 + s - 1)
        offsets = [rng() % (len(tokens) - seq) for _ in range(batch)]
        w = torch.stack([tokens[o:o + seq + 1] for o in offsets])
        logits = model(w[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), w[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        theirs.append(loss.item())
    rel = [abs(a - b) / abs(b) for a, b in zip(ours, theirs)]
    print(json.dumps({"steps": len(ours), "ours": ours, "theirs": theirs, "max_rel": max(rel)}))
    # The later steps are the gradients' and the optimizer's check: they must have moved the loss.
    return max(rel) <= REL_TOL and abs(theirs[-1] - theirs[0]) > 100 * REL_TOL * abs(theirs[0])


if __name__ == "__main__":
    if sys.argv[1] != "compare":
        sys.exit(f"unknown mode {sys.argv[1]}")
    a = sys.argv
    sys.exit(0 if compare(a[2], a[3], int(a[4]), int(a[5]), float(a[6]), int(a[7])) else 1)
