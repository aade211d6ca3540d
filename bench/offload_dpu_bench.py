#!/usr/bin/env python3
"""--delayed-update (ZeRO-Offload's delayed parameter update) with and without --offload optimizer, in one run.

Trains the gpt-bench shape (offload_bench.py's: 13.9M parameters, AdamW, batch 4 x 256, one rank, one thread)
six times back to back, --rounds times over: in memory, in memory with --delayed-update (serial: the update
inside the step), in memory with --delayed-update --overlap-update (the update on its own thread during the
next step's forward and backward), and the same three offloaded (--offload optimizer --offload-dir DIR);
prints the median step time of each (steps after the first two, median over rounds), the delayed runs' step
time over their exact peers' (below 1: a speed-up), and the issue's bound for the offloaded runs: step time
over max(compute, I/O), compute the in-memory exact step, I/O the offload tier's read + write seconds per step
from --summary (summed over its threads: an upper estimate). Prints uname -r and the CPU's vector ISA.
Usage: /usr/bin/python3 bench/offload_dpu_bench.py [--meshtrain build/meshtrain] [--dir DIR] [--steps 6]
       [--rounds 2] [--out results.json]
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile

from bench_util import write_shard
from offload_bench import SHAPE, isa, train


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", default="build/meshtrain")
    ap.add_argument("--dir", default="")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="offload_dpu_bench_")
    odir = a.dir or tempfile.mkdtemp(prefix="offload_dir_", dir="/var/tmp")
    write_shard(os.path.join(work, "data.bin"), 400000, SHAPE["vocab_size"])
    off = ["--offload", "optimizer", "--offload-dir", odir]
    ov = ["--delayed-update", "--overlap-update"]
    runs = {"memory": [], "memory_delayed": ["--delayed-update"], "memory_overlap": ov, "offload": off,
            "offload_delayed": off + ["--delayed-update"], "offload_overlap": off + ov}
    steps = {k: [] for k in runs}
    io = {k: [] for k in runs}
    try:
        for _ in range(a.rounds):
            for k, extra in runs.items():
                s = train(a, work, k, extra)
                steps[k].append(s["step_s"])
                o = s.get("offload") or {}
                io[k].append((o.get("read_s", 0) + o.get("write_s", 0)) / a.steps)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not a.dir:
            shutil.rmtree(odir, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in steps.items()}
    res = {"host_kernel": platform.release(), "isa": isa(), "load": os.getloadavg()[0], "steps": a.steps,
           "rounds": a.rounds, "step_s": steps, "median_step_s": med,
           "delayed_over_exact_memory": med["memory_delayed"] / med["memory"],
           "delayed_over_exact_offload": med["offload_delayed"] / med["offload"],
           "offload_over_memory": med["offload"] / med["memory"],
           "overlap_over_exact_memory": med["memory_overlap"] / med["memory"],
           "overlap_over_exact_offload": med["offload_overlap"] / med["offload"],
           "overlap_over_delayed_offload": med["offload_overlap"] / med["offload_delayed"],
           "io_s_per_step": {k: statistics.median(v) for k, v in io.items() if k.startswith("offload")}}
    # Back-to-back ratios, round by round (each pair ran minutes apart at most; the host is shared and noisy).
    res["per_round"] = {f"{x}/{y}": [p / q for p, q in zip(steps[x], steps[y])]
                        for x, y in (("memory_overlap", "memory"), ("offload_overlap", "offload"),
                                     ("offload_overlap", "offload_delayed"), ("offload_delayed", "offload"))}
    res["bound"] = {k: med[k] / max(med["memory"], res["io_s_per_step"][k]) for k in res["io_s_per_step"]}
    print(f"host kernel {res['host_kernel']}, ISA {res['isa']}, load {res['load']:.1f}; gpt-bench shape, "
          f"{a.rounds} rounds of {a.steps} steps")
    for k in runs:
        print(f"{k:>16}: median step {med[k]:.3f} s  (rounds {', '.join(f'{x:.3f}' for x in steps[k])})")
    print(f"delayed / exact step time: in memory {res['delayed_over_exact_memory']:.3f}, offloaded "
          f"{res['delayed_over_exact_offload']:.3f}; offloaded / in memory {res['offload_over_memory']:.3f}")
    print(f"overlapped / exact step time: in memory {res['overlap_over_exact_memory']:.3f}, offloaded "
          f"{res['overlap_over_exact_offload']:.3f}; overlapped / serial delayed offloaded "
          f"{res['overlap_over_delayed_offload']:.3f}")
    for k, v in res["per_round"].items():
        print(f"per round {k}: {', '.join(f'{x:.3f}' for x in v)}")
    print("step / max(compute, I/O): " + ", ".join(f"{k} {v:.2f} (I/O {res['io_s_per_step'][k]:.3f} s/step)"
                                                    for k, v in res["bound"].items()))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
