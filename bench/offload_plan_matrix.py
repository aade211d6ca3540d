#!/usr/bin/env python3
"""The --memory-limit plan against the measured peak RSS over a matrix of layouts (docs/offload.md, "Memory
budget"; issue 28: the plan must not undercount). GPT, 4 layers, 3 steps, one thread; each row varies one thing
from the issue's case (width 384, batch 4, V 8192, T 256, ZeRO 3, --offload optimizer,params, one rank). Each
run has --memory-limit 8G (so glibc's thresholds are fixed as under any limit) and prints the plan's total and
parts, the peak RSS of the worst rank, peak - plan (negative: the plan covers it), the measured ZeRO pool
(transient_bytes) against the plan's zero_transient, and the activation store's peak against activations +
backward_scratch. Exits 1 if any run's peak exceeds its plan. Not a timing: the figures are bytes.
Usage: /usr/bin/python3 bench/offload_plan_matrix.py [--meshtrain build/meshtrain] [--out FILE]
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile

from bench_util import write_shard

M = 1 << 20
# name: width, batch, vocabulary, T, ZeRO, offload kinds ("" none), processes
ROWS = [
    ("issue case", 384, 4, 8192, 256, 3, "optimizer,params", 1),
    ("zero0 in memory", 384, 4, 8192, 256, 0, "", 1),
    ("zero3 in memory", 384, 4, 8192, 256, 3, "", 1),
    ("zero2 opt+params", 384, 4, 8192, 256, 2, "optimizer,params", 1),
    ("zero1 optimizer", 384, 4, 8192, 256, 1, "optimizer", 1),
    ("batch 1", 384, 1, 8192, 256, 3, "optimizer,params", 1),
    ("batch 8", 384, 8, 8192, 256, 3, "optimizer,params", 1),
    ("V 256", 384, 4, 256, 256, 3, "optimizer,params", 1),
    ("width 128", 128, 4, 8192, 256, 3, "optimizer,params", 1),
    ("T 64", 384, 4, 8192, 64, 3, "optimizer,params", 1),
    ("zero3 opt+params+grads", 384, 4, 8192, 256, 3, "optimizer,params,grads", 1),
    ("zero2 opt+params+grads w256", 256, 4, 8192, 128, 2, "optimizer,params,grads", 1),
    ("zero0 opt+params+grads w256", 256, 4, 4096, 128, 0, "optimizer,params,grads", 1),
    ("zero3 opt+params dp2", 384, 4, 8192, 256, 3, "optimizer,params", 2),
    ("zero2 in memory dp2", 384, 4, 8192, 256, 2, "", 2),
    ("zero0 in memory dp2 w256", 256, 2, 4096, 128, 0, "", 2),
    ("zero1 opt+params+grads dp2 w256", 256, 4, 8192, 128, 1, "optimizer,params,grads", 2),
    ("zero3 optimizer dp2 w128", 128, 8, 256, 64, 3, "optimizer", 2),
    ("zero3 opt+params+grads dp2 w256", 256, 2, 8192, 256, 3, "optimizer,params,grads", 2),
    ("bf16 zero3 opt+params", 384, 4, 8192, 256, 3, "optimizer,params", 1, ["--precision", "bf16"]),
    ("bf16 emulated zero3 opt+params", 384, 4, 8192, 256, 3, "optimizer,params", 1, ["--precision", "bf16"],
     {"MESHTRAIN_BF16_EMULATE": "1"}),
    ("bf16 zero0 in memory w256", 256, 4, 8192, 128, 0, "", 1, ["--precision", "bf16"]),
    ("bf16 zero3 opt+params dp2 w256", 256, 4, 8192, 128, 3, "optimizer,params", 2, ["--precision", "bf16"]),
    ("bf16 tp2 optimizer", 384, 4, 8192, 256, 0, "optimizer", 2, ["--precision", "bf16", "--tp", "2"]),
    ("recompute zero3 opt+params", 384, 4, 8192, 256, 3, "optimizer,params", 1, ["--recompute"]),
    ("activations offloaded zero3", 384, 4, 8192, 256, 3, "optimizer,params", 1, ["--offload-activations"]),
    ("tp2 optimizer", 384, 4, 8192, 256, 0, "optimizer", 2, ["--tp", "2"]),
    ("tp2 sp optimizer", 384, 4, 8192, 256, 0, "optimizer", 2, ["--tp", "2", "--sequence-parallel"]),
    ("pp2 optimizer", 384, 4, 8192, 256, 0, "optimizer", 2, ["--pp", "2"]),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", default="build/meshtrain")
    ap.add_argument("--out")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="plan_matrix_")
    odir = os.path.join(work, "offload")
    os.makedirs(odir)
    lines = [f"host kernel {platform.release()}, {platform.machine()}; bytes, not times"]
    bad = 0
    try:
        for name, C, B, V, T, Z, kinds, n, *more in ROWS:
            extra = more[0] if more else []
            env = dict(os.environ, **(more[1] if len(more) > 1 else {}))
            data = os.path.join(work, f"data_{V}.bin")
            if not os.path.exists(data):
                write_shard(data, 200000, V)
            s = os.path.join(work, "summary.json")
            cmd = [a.meshtrain, "train", "--data", data, "--seq-len", str(T), "--batch-size", str(B), "--steps", "3",
                   "--threads", "1", "--quiet", "--summary", s, "--n-layer", "4", "--n-head", str(C // 64),
                   "--n-embd", str(C), "--vocab-size", str(V), "--n-positions", str(T), "--zero", str(Z),
                   "--memory-limit", "8G"]
            if kinds:
                cmd += ["--offload", kinds, "--offload-dir", odir]
            if n > 1:
                cmd += ["--nproc", str(n)]
            subprocess.run(cmd + extra, check=True, env=env)
            j = json.load(open(s))
            p, R = j["memory_plan"], j["ranks"]
            peak = max(r["peak_rss_bytes"] for r in R)
            pool = max(r["transient_bytes"] for r in R)
            act = max(r["activation_peak_bytes"] for r in R)
            bad += peak > p["total"]
            lines.append(
                f"{name:34s} {' '.join(extra)} C{C} B{B} V{V} T{T} zero{Z} {kinds or 'none':22s} np{n}: plan {p['total'] / M:6.1f} "
                f"peak {peak / M:6.1f} peak-plan {(peak - p['total']) / M:6.1f} | now {p['now'] / M:.1f} opt "
                f"{p['optimizer'] / M:.1f} io {(p['io_buffers'] - p['io_buffers_in_now']) / M:.1f} act "
                f"{p['activations'] / M:.1f} scratch {p['backward_scratch'] / M:.1f} products {p['product_scratch'] / M:.1f} transient "
                f"{p['zero_transient'] / M:.1f} (pool {pool / M:.1f}) allowance {p['allowance'] / M:.1f} | activation "
                f"store peak {act / M:.1f} vs {(p['activations'] + p['backward_scratch']) / M:.1f}")
            print(lines[-1], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines.append(f"{len(ROWS) - bad} of {len(ROWS)} runs with peak RSS <= plan")
    print(lines[-1])
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
