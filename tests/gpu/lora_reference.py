"""Reference side of the GPU LoRA check (tests/gpu/lora_gpu_test.sh).

  compare BASE ADAPTER OURS.npy SEQ   PEFT's logits of BASE with ADAPTER (peft.PeftModel, fp32 on the
                                      GPU) for the first sequences of BASE/tokens.u16, against the
                                      logits Strata stored for the merged model; and the base's own
                                      logits against them, which must be farther (the adapter counts)
Exit 0 when within tolerance; prints the measured differences.
"""
import sys

import numpy as np
import torch

REL_TOL = 1e-3  # fp32 on both sides; the adapters were trained in bf16, the comparison is fp32


def compare(base, adapter, ours_path, seq):
    import peft
    from transformers import AutoModelForCausalLM
    ours = torch.from_numpy(np.load(ours_path)).float()  # [rows, vocab]
    rows = ours.shape[0]
    tokens = torch.from_numpy(np.fromfile(f"{base}/tokens.u16", dtype="<u2").astype(np.int64))[:rows].view(-1, seq)
    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32).cuda()
    model = peft.PeftModel.from_pretrained(model, adapter).cuda().eval()
    with torch.no_grad():
        theirs = model(tokens.cuda()).logits.float().reshape(rows, -1).cpu()
        with model.disable_adapter():
            plain = model(tokens.cuda()).logits.float().reshape(rows, -1).cpu()
    scale = theirs.abs().max().item()
    gap = (theirs - ours).abs().max().item() / scale
    adapter_effect = (theirs - plain).abs().max().item() / scale
    print(f"peft vs strata: max |diff| / max |logit| = {gap:.3e}; the adapter moves the logits by {adapter_effect:.3e}")
    return gap < REL_TOL and adapter_effect > 10 * gap


if __name__ == "__main__":
    if sys.argv[1] == "compare":
        sys.exit(0 if compare(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])) else 1)
    sys.exit(f"unknown mode {sys.argv[1]}")
