#!/usr/bin/python3
"""A/B of the shared heap on training (issue 29): 2-rank runs with the collectives' send buffers in the job's shared
heap (the default: peers read them with ordinary loads) and with MESHTRAIN_SHARED_HEAP_MB=0 (no heap: peers read
them with process_vm_readv), alternating in one job, PAIRS rounds, the order flipped each round. Two workloads:
  zero3  data-parallel GPT, ZeRO 3 (every group's parameters all-gathered before its forward and its backward)
  ep     MoE GPT, --ep 2 (every MoE block's dispatch and combine are all-to-all(v)s, forward and backward)
Both --threads 1 (ranks bound to CPUs of their own on a 2-CPU host). Prints per run the median step time (the steps
after the first two) with the run's single-copy reads from --summary, then per workload the median over runs, the
ratio heap / no heap (< 1: the heap is faster) and the ratio of each pair.

Usage: /usr/bin/python3 bench/symheap_train_ab.py [--meshtrain build/meshtrain] [--pairs 4] [--steps 16]
       [--per-rank 4] [--seq-len 128]   (fewer tokens per rank: the collectives take a larger share of a step)
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

from bench_util import write_shard

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPE = dict(n_layer=4, n_head=4, n_embd=256, vocab_size=4096, n_positions=128)
WORKLOADS = {
    "zero3": ["--zero", "3"],
    "ep": ["--ep", "2", "--moe-every", "1", "--experts", "4", "--moe-top-k", "2", "--expert-hidden", "512",
           "--capacity-factor", "0"],
}
VARIANTS = [("heap", {}), ("noheap", {"MESHTRAIN_SHARED_HEAP_MB": "0"})]


def isa():
    with open("/proc/cpuinfo") as f:
        info = f.read()
    model = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), "?")
    flags = next((l.split(":", 1)[1].split() for l in info.splitlines() if l.startswith("flags")), [])
    ext = [x for x in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if x in flags]
    return f"{model} ({' '.join(ext)})"


def run(args, work, workload, tag, env_extra):
    metrics = os.path.join(work, f"metrics_{tag}.jsonl")
    summary = os.path.join(work, f"summary_{tag}.json")
    cmd = [args.meshtrain, "train", "--data", os.path.join(work, "data.bin"), "--seq-len", str(args.seq_len),
           "--batch-size", str(args.per_rank * 2), "--steps", str(args.steps), "--nproc", "2", "--threads", "1",
           "--quiet", "--metrics", metrics, "--summary", summary, *WORKLOADS[workload]]
    for k, v in SHAPE.items():
        cmd += ["--" + k.replace("_", "-"), str(v)]
    env = dict(os.environ)
    env.pop("MESHTRAIN_SHARED_HEAP_MB", None)
    env.update(env_extra)
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    subprocess.run(cmd, check=True, env=env, timeout=300)
    rows = [json.loads(l) for l in open(metrics)]
    times = [r["step_time_s"] for r in rows if "step_time_s" in r][2:]
    reads = json.load(open(summary))["ranks"][0]["comm"]["peer_reads"]
    return statistics.median(times), reads


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", default=os.path.join(HERE, "..", "build", "meshtrain"))
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--per-rank", type=int, default=4, help="sequences per rank per step")
    ap.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (at most n_positions, 128)")
    args = ap.parse_args()
    with open("/proc/loadavg") as f:
        load0 = " ".join(f.read().split()[:3])
    print(f"# host kernel {platform.release()}, {os.cpu_count()} CPUs, {isa()}; load before {load0}")
    print(f"# GPT {SHAPE}, T={args.seq_len}, {args.per_rank} sequences per rank, 2 ranks, --threads 1; "
          f"{args.pairs} pairs of {args.steps} steps per workload")
    res = {(w, v): [] for w in WORKLOADS for v, _ in VARIANTS}
    with tempfile.TemporaryDirectory() as work:
        write_shard(os.path.join(work, "data.bin"), args.per_rank * 2 * args.seq_len * (args.steps + 1) + 1, SHAPE["vocab_size"])
        for i in range(args.pairs):
            for w in WORKLOADS:
                order = VARIANTS if i % 2 == 0 else VARIANTS[::-1]
                for v, env in order:
                    t, reads = run(args, work, w, f"{w}_{v}{i}", env)
                    res[(w, v)].append(t)
                    print(f"round {i} {w:6s} {v:7s} median step {t * 1e3:8.2f} ms  rank 0 reads: "
                          f"direct {reads['direct_bytes'] / 2**20:.1f} MiB, kernel {reads['kernel_bytes'] / 2**20:.1f} MiB",
                          flush=True)
    with open("/proc/loadavg") as f:
        load1 = " ".join(f.read().split()[:3])
    for w in WORKLOADS:
        h, n = res[(w, "heap")], res[(w, "noheap")]
        mh, mn = statistics.median(h), statistics.median(n)
        per_pair = ", ".join(f"{a / b:.3f}" for a, b in zip(h, n))
        print(f"# {w}: median step heap {mh * 1e3:.2f} ms, no heap {mn * 1e3:.2f} ms, ratio heap/no heap "
              f"{mh / mn:.3f} (per pair {per_pair})")
    print(f"# load after {load1}")


if __name__ == "__main__":
    sys.exit(main())
