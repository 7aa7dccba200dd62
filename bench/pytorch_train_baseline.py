"""The PyTorch a user would write instead: transformers' model with SDPA attention, bf16 autocast
over fp32 weights, torch.optim.AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), the same
batch and sequence as bench/train_step_bench. Prints one JSON line like the C++ benchmark.

usage: python3 pytorch_train_baseline.py --family gpt2 --layers 12 --hidden 768 --heads 12
       --vocab 50257 --sequence 1024 --batch 8 --precision bf16 --steps 10
Data parallel over the GPUs of one host (DistributedDataParallel, NCCL; --batch is per GPU, the
tokens/s printed is every rank's together):
       torchrun --standalone --nproc_per_node 4 pytorch_train_baseline.py --ddp ... --fused --compile
"""
import argparse
import json
import os
import time

import torch
import transformers

p = argparse.ArgumentParser()
p.add_argument("--family", default="gpt2")
p.add_argument("--layers", type=int, default=12)
p.add_argument("--hidden", type=int, default=768)
p.add_argument("--heads", type=int, default=12)
p.add_argument("--kv-heads", type=int, default=0)
p.add_argument("--ffn", type=int, default=0)
p.add_argument("--vocab", type=int, default=50257)
p.add_argument("--sequence", type=int, default=1024)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--precision", default="bf16")
p.add_argument("--steps", type=int, default=10)
p.add_argument("--fused", action="store_true", help="torch.optim.AdamW(fused=True)")
p.add_argument("--compile", action="store_true", help="torch.compile the model")
p.add_argument("--profile", default="", help="write a chrome trace of two more steps here")
p.add_argument("--ddp", action="store_true", help="DistributedDataParallel under torchrun (--batch per GPU)")
a = p.parse_args()
rank, world = 0, 1
if a.ddp:
    torch.distributed.init_process_group("nccl")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
ffn = a.ffn or 4 * a.hidden
if a.family == "gpt2":
    config = transformers.GPT2Config(n_layer=a.layers, n_embd=a.hidden, n_head=a.heads, n_inner=ffn,
                                     vocab_size=a.vocab, n_positions=a.sequence, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)
else:
    config = transformers.LlamaConfig(num_hidden_layers=a.layers, hidden_size=a.hidden,
                                      num_attention_heads=a.heads, num_key_value_heads=a.kv_heads or a.heads,
                                      intermediate_size=ffn, vocab_size=a.vocab, max_position_embeddings=a.sequence)
model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").cuda()
replicated = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()]) if a.ddp else model
decay = [p for p in model.parameters() if p.dim() >= 2]
no_decay = [p for p in model.parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=3e-4, betas=(0.9, 0.95), fused=a.fused)
forward = torch.compile(replicated) if a.compile else replicated
gen = torch.Generator(device="cuda").manual_seed(1 + rank)


def step():
    tokens = torch.randint(0, a.vocab, (a.batch, a.sequence), device="cuda", generator=gen)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
        out = forward(tokens, labels=tokens)  # transformers shifts the labels by one itself
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return out.loss.item()


for _ in range(3):
    loss = step()
torch.cuda.synchronize()
start = time.perf_counter()
for _ in range(a.steps):
    loss = step()
torch.cuda.synchronize()
seconds = time.perf_counter() - start
if a.profile:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            step()
    prof.export_chrome_trace(a.profile)
if rank != 0:
    torch.distributed.destroy_process_group()
    raise SystemExit(0)
print(json.dumps({"impl": "pytorch" + ("+ddp" if a.ddp else "") + ("+fused" if a.fused else "") + ("+compile" if a.compile else ""),
                  "family": a.family, "params": sum(p.numel() for p in model.parameters()), "gpus": world,
                  "batch": a.batch, "sequence": a.sequence, "precision": a.precision,
                  "tokens_per_s": round(world * a.steps * a.batch * a.sequence / seconds),
                  "step_ms": round(1000 * seconds / a.steps, 1),
                  "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2), "loss": round(loss, 4),
                  "torch": torch.__version__, "transformers": transformers.__version__}))
if a.ddp:
    torch.distributed.destroy_process_group()
