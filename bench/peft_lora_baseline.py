"""The LoRA fine-tuning a user would write instead of Strata: transformers' Llama (SDPA attention)
with its weights in bf16, PEFT's LoRA (LoraConfig r, lora_alpha, target_modules="all-linear",
dropout 0: PEFT keeps the adapters in fp32 and casts the input to them), torch.optim.AdamW(fused)
over the adapters, optionally torch.compile. The base is drawn at random (the speed and memory of
a step do not depend on the values). Prints one JSON line: tokens/s over the timed steps, the
allocator's peak over them, the adapters' parameter count.

usage: python3 peft_lora_baseline.py --layers 32 --hidden 4096 --heads 32 --kv-heads 8
       --ffn 14336 --vocab 128256 --sequence 2048 --batch 2 --rank 16 --alpha 32 --steps 5 [--compile]
"""
import argparse
import json
import time

import peft
import torch
import transformers

p = argparse.ArgumentParser()
p.add_argument("--layers", type=int, required=True)
p.add_argument("--hidden", type=int, required=True)
p.add_argument("--heads", type=int, required=True)
p.add_argument("--kv-heads", type=int, required=True)
p.add_argument("--ffn", type=int, required=True)
p.add_argument("--vocab", type=int, required=True)
p.add_argument("--sequence", type=int, required=True)
p.add_argument("--batch", type=int, required=True)
p.add_argument("--rank", type=int, default=16)
p.add_argument("--alpha", type=float, default=32)
p.add_argument("--steps", type=int, default=5)
p.add_argument("--compile", action="store_true")
a = p.parse_args()

config = transformers.LlamaConfig(
    hidden_size=a.hidden, intermediate_size=a.ffn, num_hidden_layers=a.layers, num_attention_heads=a.heads,
    num_key_value_heads=a.kv_heads, vocab_size=a.vocab, max_position_embeddings=a.sequence, rope_theta=500000.0,
    rms_norm_eps=1e-5, tie_word_embeddings=False, attn_implementation="sdpa")
with torch.device("cuda"):
    model = transformers.LlamaForCausalLM._from_config(config, torch_dtype=torch.bfloat16)
model = peft.get_peft_model(model, peft.LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=0.0,
                                                   target_modules="all-linear"))
trainable = [q for q in model.parameters() if q.requires_grad]
opt = torch.optim.AdamW(trainable, lr=1e-4, betas=(0.9, 0.95), fused=True)
step_fn = torch.compile(model) if a.compile else model
ids = torch.randint(0, a.vocab, (a.batch, a.sequence), device="cuda")


def step():
    loss = step_fn(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


for _ in range(3):
    loss = step()
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats()
start = time.perf_counter()
for _ in range(a.steps):
    loss = step()
loss = loss.item()
torch.cuda.synchronize()
seconds = time.perf_counter() - start
print(json.dumps({
    "impl": "peft" + ("+compile" if a.compile else ""), "peft": peft.__version__,
    "transformers": transformers.__version__, "torch": torch.__version__,
    "trainable_params": sum(q.numel() for q in trainable), "batch": a.batch, "sequence": a.sequence,
    "tokens_per_s": round(a.steps * a.batch * a.sequence / seconds), "step_ms": round(1000 * seconds / a.steps, 1),
    "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3), "loss": round(loss, 4)}))
