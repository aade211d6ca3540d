#!/usr/bin/python3
"""Data-parallel training throughput of the gpt-bench GPT in PyTorch DDP: the yardstick for
`meshtrain train --nproc 2 --dp 2` tokens/s on this CPU.

Model and step as bench/torch_gpt_bench.py (imported, not copied): V=8192, T=256, L=6, H=6, C=384, float32,
forward + backward + global-norm clip 1.0 + torch.optim.AdamW (wd 0.1 on 2+-dim tensors, foreach).
  --world-size 2 (default): torch.multiprocessing spawns 2 ranks, each one thread
      (OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = torch.set_num_threads = --threads-per-rank), joined by
      torch.distributed with the gloo backend over TCP on 127.0.0.1 (a free port). The model is wrapped in
      DistributedDataParallel (default 25 MB buckets, all-reduce overlapped with backward, gradients
      averaged), global batch --batch-size 8: rank r takes sequences [4r, 4r+4) of each step's batch.
  --world-size 1: the same model and step without a DDP wrapper or process group, batch --batch-size /
      2 = 4 per step (the per-rank work of the 2-rank run), so tokens/s(2) / tokens/s(1) is the scaling
      (2.0 = perfect; below it: all-reduce time not hidden by backward, plus cores shared with others).
Timing: `--warmup` steps are discarded, then `--steps` steps are timed on every rank; a step's time is the
slowest rank's (all-reduced with max), and tokens_per_s = global batch * T / median step time (median,
because the machine is shared). Tokens are random (seeded). The last line of stdout is one JSON object:
  {"tokens_per_s", "step_s_median", "world_size", "threads_per_rank", "step_s_mean", "step_s_min",
   "global_batch", "per_rank_batch", "seq_len", "params", "allreduce_mb_per_step", "replicas_identical",
   "loadavg_1m", ...}
The run fails (exit 1) if a loss is not finite or, with 2 ranks, the replicas' weights differ at the end.
allreduce_mb_per_step is the gradient volume each rank all-reduces per step (4 bytes * params; a ring
moves 2 (n-1)/n of it per rank). loadavg_1m is read at the end: the machine is shared, so a figure taken
under load says so.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import socket
import statistics
import sys
import time


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, a: argparse.Namespace, port: int, results) -> None:
    """One rank: builds the model, trains warmup + steps, and (rank 0) puts the figures in `results`."""
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_gpt_bench import GPT

    torch.set_num_threads(a.threads_per_rank)
    ws = a.world_size
    if ws > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws,
                                timeout=datetime.timedelta(seconds=a.timeout))
    torch.manual_seed(a.seed)  # the same init on every rank (DDP also broadcasts rank 0's at wrap time)
    B_global = a.batch_size if ws > 1 else a.batch_size // 2
    B = B_global // ws
    T = a.seq_len
    model = GPT(a.vocab_size, T, a.n_layer, a.n_head, a.n_embd)
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    if ws > 1:
        # The causal-mask buffers are bool, which gloo cannot broadcast; they are constants, equal on every
        # rank, so DDP is told to leave them alone.
        DDP = torch.nn.parallel.DistributedDataParallel
        DDP._set_params_and_buffers_to_ignore_for_model(model, [n for n, _ in model.named_buffers()])
        net = DDP(model)
    else:
        net = model
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    gen = torch.Generator().manual_seed(a.seed + 1)
    if rank == 0:
        print(f"torch {torch.__version__}, world size {ws}, threads/rank {torch.get_num_threads()}, params "
              f"{n_params / 1e6:.2f}M, global batch {B_global} ({B}/rank) T={T} L={a.n_layer} H={a.n_head} "
              f"C={a.n_embd} V={a.vocab_size}", file=sys.stderr, flush=True)

    times, losses = [], []
    for step in range(a.warmup + a.steps):
        tokens = torch.randint(0, a.vocab_size, (B_global, T + 1), generator=gen)[rank * B:(rank + 1) * B]
        t0 = time.perf_counter()
        with (torch.autocast("cpu", dtype=torch.bfloat16) if a.autocast == "bf16" else contextlib.nullcontext()):
            loss = net(tokens[:, :-1], tokens[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP: bucketed gradient all-reduce (average) overlapped with backward
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if ws > 1:  # the step of a synchronous job is as long as its slowest rank's
            t = torch.tensor([dt, float(loss)], dtype=torch.float64)
            dist.all_reduce(t[:1], op=dist.ReduceOp.MAX)
            dist.all_reduce(t[1:], op=dist.ReduceOp.SUM)
            dt, mean_loss = float(t[0]), float(t[1]) / ws
        else:
            mean_loss = float(loss)
        losses.append(mean_loss)
        if step >= a.warmup:
            times.append(dt)
        if rank == 0:
            print(f"step {step:3d}{' (warmup)' if step < a.warmup else ''}: loss {mean_loss:.4f}, {dt:.3f} s, "
                  f"{B_global * T / dt:.0f} tokens/s", file=sys.stderr, flush=True)
    identical = True
    if ws > 1:  # DDP's promise, checked: after the last step every replica holds the same weights
        with torch.no_grad():
            c = torch.tensor([sum(float(p.double().sum()) for p in params)] * 2, dtype=torch.float64)
        hi, lo = c[:1].clone(), -c[1:].clone()
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        dist.all_reduce(lo, op=dist.ReduceOp.MAX)
        identical = float(hi) == -float(lo)
        dist.destroy_process_group()
    if rank == 0:
        med = statistics.median(times)
        results.put({"tokens_per_s": round(B_global * T / med, 1), "step_s_median": round(med, 4),
                     "world_size": ws, "threads_per_rank": a.threads_per_rank,
                     "step_s_mean": round(statistics.fmean(times), 4), "step_s_min": round(min(times), 4),
                     "global_batch": B_global, "per_rank_batch": B, "seq_len": T, "params": n_params,
                     "allreduce_mb_per_step": round(4 * n_params / 1e6, 2) if ws > 1 else 0.0,
                     "n_layer": a.n_layer, "n_head": a.n_head, "n_embd": a.n_embd, "vocab_size": a.vocab_size,
                     "steps_timed": len(times), "finite_loss": all(math.isfinite(x) for x in losses),
                     "replicas_identical": identical,
                     "loadavg_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
                     "torch": torch.__version__, "backend": "gloo" if ws > 1 else "none"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, choices=(1, 2), default=2)
    ap.add_argument("--threads-per-rank", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    ap.add_argument("--batch-size", type=int, default=8, help="global batch of the 2-rank run (halved for 1)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--n-layer", type=int, default=6)
    ap.add_argument("--n-head", type=int, default=6)
    ap.add_argument("--n-embd", type=int, default=384)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a collective may wait for a peer")
    ap.add_argument("--autocast", choices=["off", "bf16"], default="off",
                    help="bf16: forward under torch.autocast('cpu', bfloat16), the peer of meshtrain --precision bf16")
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < 0 or a.threads_per_rank < 1 or a.batch_size % 2 or a.n_embd % a.n_head:
        ap.error(f"need steps >= 1, warmup >= 0, threads-per-rank >= 1, an even --batch-size and n_embd % n_head "
                 f"== 0; got steps {a.steps}, warmup {a.warmup}, threads-per-rank {a.threads_per_rank}, "
                 f"batch-size {a.batch_size}, n_embd {a.n_embd}, n_head {a.n_head}")
    # BLAS and OpenMP read these when torch loads, in each spawned rank: set them before anything imports torch.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(a.threads_per_rank)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    if a.world_size == 1:
        worker(0, a, 0, results)
    else:
        mp.spawn(worker, args=(a, free_port(), results), nprocs=a.world_size, join=True)
    if results.empty():
        print("error: rank 0 reported no result", file=sys.stderr)
        return 1
    out = results.get()
    if not out.pop("finite_loss"):
        print("error: non-finite loss", file=sys.stderr)
        return 1
    if not out["replicas_identical"]:
        print("error: the ranks' weights differ after training (DDP replicas diverged)", file=sys.stderr)
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
