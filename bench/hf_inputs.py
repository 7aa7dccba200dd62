"""What the users'-method baselines (hf_capture_baseline.py, hf_sites_baseline.py) share: a
transformers model in bf16 on the GPU, and the token file as [sequences, SEQ] int64 (a trailing
partial sequence dropped)."""
import numpy as np
import torch
from transformers import AutoModelForCausalLM


def load(model_dir, tokens_path, seq, **model_kwargs):
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.bfloat16, **model_kwargs).cuda().eval()
    tokens = torch.from_numpy(np.fromfile(tokens_path, dtype="<u2").astype(np.int64))
    return model, tokens[: len(tokens) // seq * seq].view(-1, seq)
