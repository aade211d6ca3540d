#!/usr/bin/env python3
"""The zero-bubble schedules and chimera on the real GPT at P = 2: tokens/s of zb-h1, zb-h2, zb-v and chimera beside
1F1B's, measured and simulated bubble, the activation peak and the weight bytes per rank, from
`meshtrain train --pp 2 --summary`.

Shape as bench/pp_bench.py: L=8, H=8, C=256, V=2048, T=128, a global batch of 16 sequences, M micro-batches,
1 thread per rank on the 2 cores of this machine. The schedules run in turn, `--rounds` times, so a busy
spell of the shared machine falls on all of them; the table gives each schedule's median tokens/s and its ratio
to 1F1B's median. The simulated bubble replays the schedule with the run's measured stage times, the backward
split in halves by the simulator's assumed weight share (1/2), and the measured message latency.
Usage: /usr/bin/python3 bench/zb_bench.py [--meshtrain build/meshtrain] [--steps 6] [--rounds 3] [--m 8]
       [--schedules 1f1b,chimera]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile

from bench_util import write_shard

SHAPE = dict(n_layer=8, n_head=8, n_embd=256, vocab_size=2048, n_positions=128)
T, B = 128, 16
SCHEDULES = ("1f1b", "zb-h1", "zb-h2", "zb-v", "chimera")


def cpu_isa():
    """The widest vector extension the CPU reports (what oneDNN's kernels are chosen from)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return "unknown"
    for isa in ("avx512_bf16", "avx512f", "avx2", "sse4_2"):
        if isa in flags:
            return isa
    return "unknown"


def run(args, work, sched):
    summary = os.path.join(work, f"summary_{sched}.json")
    cmd = [args.meshtrain, "train", "--data", os.path.join(work, "data.bin"), "--seq-len", str(T),
           "--batch-size", str(B), "--steps", str(args.steps), "--threads", "1", "--quiet", "--summary", summary,
           "--nproc", "2", "--pp", "2", "--schedule", sched, "--micro-batch-size", str(B // args.m)]
    if sched in ("zb-v", "chimera"):
        cmd += ["--virtual-stages", "2"]  # zb-v: rank j holds stages j and 3 - j; chimera: j and 1 - j (of 2)
    for k, v in SHAPE.items():
        cmd += ["--" + k.replace("_", "-"), str(v)]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    subprocess.run(cmd, check=True, env=env)
    with open(summary) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meshtrain", default=os.path.join(os.path.dirname(__file__), "..", "build", "meshtrain"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--m", type=int, default=8, help="micro-batches per step (divides 16)")
    ap.add_argument("--schedules", default=",".join(SCHEDULES), help="comma-separated; 1f1b (the peer) is added")
    args = ap.parse_args()
    schedules = ["1f1b"] + [x for x in args.schedules.split(",") if x and x != "1f1b"]
    work = tempfile.mkdtemp(prefix="zb_bench_")
    write_shard(os.path.join(work, "data.bin"), 200000, SHAPE["vocab_size"])
    print(f"host: kernel {platform.release()} {platform.machine()}; load average at start "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (shared machine)")
    got = {s: [] for s in schedules}
    last = {}
    for r in range(args.rounds):
        for sched in schedules:
            s = run(args, work, sched)
            got[sched].append(s["tokens_per_s"])
            last[sched] = s
            print(f"  round {r} {sched:<6} {s['tokens_per_s']:8.0f} tokens/s", flush=True)
    print(f"ISA: {cpu_isa()}; load average at end {os.getloadavg()[0]:.1f}")
    base = statistics.median(got["1f1b"])
    print(f"\nP = 2, M = {args.m}, {args.steps} steps, median of {args.rounds} rounds")
    print(f"{'schedule':<8} {'tokens/s':>9} {'/1f1b':>6} {'bubble meas':>12} {'simulated':>10} {'act peak MiB':>20} "
          f"{'weights MiB':>14}")
    for sched in schedules:
        med = statistics.median(got[sched])
        p = last[sched]["pipeline"]
        act = "/".join(f"{r['activation_peak_bytes'] / 1048576:.1f}" for r in last[sched]["ranks"])
        wts = "/".join(f"{r['param_bytes'] / 1048576:.2f}" for r in last[sched]["ranks"])
        print(f"{sched:<8} {med:>9.0f} {med / base:>6.3f} {100 * p['bubble_measured']:>11.1f}% "
              f"{100 * p['bubble_simulated']:>9.1f}% {act:>20} {wts:>14}")


if __name__ == "__main__":
    main()
