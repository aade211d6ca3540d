#!/usr/bin/env python3
"""Crossbow's synchronous model averaging (--learners) against plain micro-batching on the character GPT.

Model and data as bench/comm_efficiency.py's gpt (2 layers, 4 heads, width 256, context 64, tinyshakespeare:
first 90% train, last 10% validation), one process, one thread, AdamW lr 1e-3 (20 warm-up steps, cosine to
1e-4), --grad-clip 1, global batch 16 windows x 64 tokens, 400 steps, evaluation every 40 steps on 16
validation batches (the same batches in every run; with --learners they see the central model z). Runs:
  plain_mb8      --micro-batch-size 8: 2 micro-batches, one gradient of 16 windows (exact)
  sma_L2         --learners 2 --micro-batch-size 8: 2 learners of 8 windows each (alpha 1/2, mu 0)
  sma_L2_mu0.5   the same with --sma-momentum 0.5 on the central model
  sma_L4         --learners 4 --micro-batch-size 4: 4 learners of 4 windows each (alpha 1/4, mu 0)
Per run: final validation loss, its ratio to plain, and the wall time (also as a ratio to plain, measured back
to back on a shared, loaded machine). Writes --out (default bench/results/sma): table.md, results.json,
loss.svg, metrics/.
Usage: /usr/bin/python3 bench/sma_bench.py [--meshtrain build/meshtrain] [--data DIR] [--quick]
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_util import prepare_text  # noqa: E402
from convergence_svg import svg, val_curve  # noqa: E402

RUNS = [("plain_mb8", ["--micro-batch-size", "8"]),
        ("sma_L2", ["--learners", "2", "--micro-batch-size", "8"]),
        ("sma_L2_mu0.5", ["--learners", "2", "--micro-batch-size", "8", "--sma-momentum", "0.5"]),
        ("sma_L4", ["--learners", "4", "--micro-batch-size", "4"])]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meshtrain", default=os.path.join(ROOT, "build", "meshtrain"))
    ap.add_argument("--data", default="/work/shared/data")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "sma"))
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    os.makedirs(os.path.join(a.out, "metrics"), exist_ok=True)
    work = tempfile.mkdtemp(prefix="sma_bench_")
    prepare_text(a.meshtrain, work, a.data)
    steps, every = (40, 20) if a.quick else (400, 40)
    res = []
    for tag, extra in RUNS:
        metrics = os.path.join(a.out, "metrics", tag + ".jsonl")
        if os.path.exists(metrics):
            os.remove(metrics)
        cmd = [a.meshtrain, "train", "--model", "gpt", "--data", os.path.join(work, "train.bin"),
               "--val-data", os.path.join(work, "val.bin"), "--eval-batches", "16", "--eval-every", str(every),
               "--n-layer", "2", "--n-head", "4", "--n-embd", "256", "--vocab-size", "256", "--n-positions", "64",
               "--seq-len", "64", "--batch-size", "16", "--steps", str(steps), "--optimizer", "adamw", "--lr",
               "1e-3", "--warmup-steps", "20", "--grad-clip", "1", "--threads", "1", "--seed", "1337", "--quiet",
               "--metrics", metrics] + extra
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        wall = time.monotonic() - t0
        if r.returncode != 0:
            print(f"{tag}: exit {r.returncode}: {r.stderr[-400:]}")
        curve = val_curve(metrics) if r.returncode == 0 else []
        res.append(dict(tag=tag, cmd=cmd, exit=r.returncode, wall_s=wall, curve=curve, metrics=metrics,
                        final_val=curve[-1][1] if curve else None))
    base = res[0]
    lines = [f"Character GPT, batch 16 x 64 tokens, AdamW lr 1e-3 cosine to 1e-4, {steps} steps; host kernel "
             f"{platform.release()}; shared, loaded 2-core machine (other engineers building): wall-time ratios "
             "are from back-to-back runs and noisy.", "",
             "| run | final val loss | / plain | wall (s) | / plain |", "|---|---|---|---|---|"]
    for r in res:
        if r["final_val"] is None:
            lines.append(f"| {r['tag']} | failed (exit {r['exit']}) | | | |")
            continue
        lines.append(f"| {r['tag']} | {r['final_val']:.4f} | {r['final_val'] / base['final_val']:.4f} | "
                     f"{r['wall_s']:.0f} | {r['wall_s'] / base['wall_s']:.2f} |")
    table = "\n".join(lines) + "\n"
    print(table)
    open(os.path.join(a.out, "table.md"), "w").write(table)
    json.dump(dict(kernel=platform.release(), quick=a.quick, runs=res), open(os.path.join(a.out, "results.json"), "w"),
              indent=1)
    groups = {r["tag"]: [(r["metrics"], r["curve"])] for r in res if r["curve"]}
    if groups:
        open(os.path.join(a.out, "loss.svg"), "w").write(svg(groups, title="validation loss: SMA vs micro-batching"))


if __name__ == "__main__":
    main()
