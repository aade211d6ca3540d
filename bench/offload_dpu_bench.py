#!/usr/bin/env python3
"""--delayed-update (ZeRO-Offload's delayed parameter update) with and without --offload optimizer, in one run.

Trains the gpt-bench shape (offload_bench.py's: 13.9M parameters, AdamW, batch 4 x 256, one rank, one thread)
four times back to back, --rounds times over: in memory, in memory with --delayed-update, offloaded
(--offload optimizer --offload-dir DIR), offloaded with --delayed-update; prints the median step time of each
(steps after the first two, median over rounds) and the delayed runs' step time over their exact peers'.
A ratio below 1 would be the speed-up the delayed update buys; here --delayed-update applies the delay-1 rule
(the math) with the update still inside the step (no overlap of step t's update with step t + 1's forward and
backward is built), so the ratio shows its cost, not a speed-up. Prints uname -r and the CPU's vector ISA.
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
    runs = {"memory": [], "memory_delayed": ["--delayed-update"], "offload": off,
            "offload_delayed": off + ["--delayed-update"]}
    steps = {k: [] for k in runs}
    try:
        for _ in range(a.rounds):
            for k, extra in runs.items():
                steps[k].append(train(a, work, k, extra)["step_s"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not a.dir:
            shutil.rmtree(odir, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in steps.items()}
    res = {"host_kernel": platform.release(), "isa": isa(), "load": os.getloadavg()[0], "steps": a.steps,
           "rounds": a.rounds, "step_s": steps, "median_step_s": med,
           "delayed_over_exact_memory": med["memory_delayed"] / med["memory"],
           "delayed_over_exact_offload": med["offload_delayed"] / med["offload"],
           "offload_over_memory": med["offload"] / med["memory"]}
    print(f"host kernel {res['host_kernel']}, ISA {res['isa']}, load {res['load']:.1f}; gpt-bench shape, "
          f"{a.rounds} rounds of {a.steps} steps")
    for k in runs:
        print(f"{k:>16}: median step {med[k]:.3f} s  (rounds {', '.join(f'{x:.3f}' for x in steps[k])})")
    print(f"delayed / exact step time: in memory {res['delayed_over_exact_memory']:.3f}, offloaded "
          f"{res['delayed_over_exact_offload']:.3f}; offloaded / in memory {res['offload_over_memory']:.3f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
