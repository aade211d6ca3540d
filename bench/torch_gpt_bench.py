#!/usr/bin/python3
"""Training throughput of the same GPT in PyTorch: the yardstick for `meshtrain` tokens/s on this CPU.

The model is GPT-2 shaped (pre-LN blocks, tied embeddings, GELU tanh, causal softmax attention) in float32
with torch's fused building blocks (nn.Linear = addmm, F.layer_norm, F.gelu, F.softmax, F.cross_entropy);
torch 1.13 has no scaled_dot_product_attention, so attention is the explicit q k^T -> mask -> softmax -> v.
One step = forward, backward, global-norm clipping at 1.0 and torch.optim.AdamW (weight decay 0.1 on
tensors of 2+ dimensions, foreach implementation), i.e. the work of one meshtrain step. Tokens are random.

Timing: `--warmup` steps are run and discarded, then `--steps` steps are timed one by one.
tokens_per_s = B*T / median step time (the median, not the mean, because the machine is shared and a
neighbour's burst should not move the figure). The last line of stdout is one JSON object:
  {"tokens_per_s", "step_s_median", "step_s_mean", "step_s_min", "threads", "params", ...}
Thread count: torch.set_num_threads(N) controls torch's own pool, but the BLAS library (OpenBLAS on
Debian) and OpenMP read OPENBLAS_NUM_THREADS / OMP_NUM_THREADS at load time, so run it as e.g.
  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 python3 bench/torch_gpt_bench.py --threads 1 ...
A warning is printed when those variables are unset or differ from --threads.
Mixed precision: `--autocast bf16` runs forward (and so backward) under torch.autocast("cpu", bfloat16): the
products (addmm, matmul) take bf16 inputs through oneDNN, float32 master weights and optimizer as with
meshtrain --precision bf16 (autocast also runs some other ops in bf16, so it is the peer, not the rule).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C: int, H: int, Tmax: int):
        super().__init__()
        self.H = H
        self.ln_1, self.ln_2 = nn.LayerNorm(C, eps=1e-5), nn.LayerNorm(C, eps=1e-5)
        self.c_attn, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        self.register_buffer("future", torch.ones(Tmax, Tmax, dtype=torch.bool).triu(1), persistent=False)

    def attn(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, C] -> [B, T, C]
        B, T, C = x.shape
        hs = C // self.H
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (z.view(B, T, self.H, hs).transpose(1, 2) for z in (q, k, v))   # [B, H, T, hs]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))                     # [B, H, T, T]
        att = F.softmax(att.masked_fill(self.future[:T, :T], float("-inf")), dim=-1)
        return self.attn_proj((att @ v).transpose(1, 2).reshape(B, T, C))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V: int, Tmax: int, L: int, H: int, C: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(Tmax, C)
        self.h = nn.ModuleList(Block(C, H, Tmax) for _ in range(L))
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied output layer
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--n-layer", type=int, default=6)
    ap.add_argument("--n-head", type=int, default=6)
    ap.add_argument("--n-embd", type=int, default=384)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--autocast", choices=["off", "bf16"], default="off",
                    help="bf16: forward under torch.autocast('cpu', dtype=torch.bfloat16)")
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < 0 or a.threads < 1 or a.n_embd % a.n_head:
        ap.error(f"need steps >= 1, warmup >= 0, threads >= 1 and n_embd % n_head == 0; got steps {a.steps}, "
                 f"warmup {a.warmup}, threads {a.threads}, n_embd {a.n_embd}, n_head {a.n_head}")

    torch.set_num_threads(a.threads)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        val = os.environ.get(var)
        if val != str(a.threads):
            print(f"warning: {var} is {'unset' if val is None else repr(val)}, not {a.threads}: the BLAS/OpenMP "
                  f"pools may use another thread count than --threads; set {var}={a.threads}", file=sys.stderr)
    torch.manual_seed(a.seed)
    B, T = a.batch_size, a.seq_len
    model = GPT(a.vocab_size, T, a.n_layer, a.n_head, a.n_embd)
    params = list(model.parameters())  # the tied wte appears once
    n_params = sum(p.numel() for p in params)
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    gen = torch.Generator().manual_seed(a.seed + 1)
    autocast = ((lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if a.autocast == "bf16"
                else contextlib.nullcontext)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, params {n_params / 1e6:.2f}M, "
          f"B={B} T={T} L={a.n_layer} H={a.n_head} C={a.n_embd} V={a.vocab_size}", file=sys.stderr)

    times, losses = [], []
    for step in range(a.warmup + a.steps):
        tokens = torch.randint(0, a.vocab_size, (B, T + 1), generator=gen)
        t0 = time.perf_counter()
        with autocast():
            loss = model(tokens[:, :-1], tokens[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        losses.append(float(loss))
        if step >= a.warmup:
            times.append(dt)
        print(f"step {step:3d}{' (warmup)' if step < a.warmup else ''}: loss {losses[-1]:.4f}, {dt:.3f} s, "
              f"{B * T / dt:.0f} tokens/s", file=sys.stderr, flush=True)
    if not all(math.isfinite(x) for x in losses):
        print("error: non-finite loss", file=sys.stderr)
        return 1
    med = statistics.median(times)
    print(json.dumps({"tokens_per_s": round(B * T / med, 1), "step_s_median": round(med, 4),
                      "step_s_mean": round(statistics.fmean(times), 4), "step_s_min": round(min(times), 4),
                      "threads": a.threads, "params": n_params, "batch_size": B, "seq_len": T,
                      "n_layer": a.n_layer, "n_head": a.n_head, "n_embd": a.n_embd, "vocab_size": a.vocab_size,
                      "steps_timed": len(times), "torch": torch.__version__, "autocast": a.autocast}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
