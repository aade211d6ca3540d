#!/usr/bin/env python3
"""AdamW vs LAMB vs Adafactor on the character GPT: validation loss over the same steps, seeds and data, and
the time per step of each against AdamW's in the same run.

Model and data as bench/comm_efficiency.py's gpt (2 layers, 4 heads, width 256, context 64, byte vocabulary;
tinyshakespeare, first 90% train, last 10% validation, made with `meshtrain prepare` in a scratch directory),
batch 16 x 64 tokens, one process, --threads 1, warm-up 5% of the steps then cosine to lr/10, weight decay 0.1,
clipping 1.0. Each optimizer at its own learning rate (LAMB's step is |w|-relative, Adafactor's U is
RMS-normalized; none of the three was tuned beyond the short sweep --lrs allows). Evaluation every --every
steps on 16 validation batches (the same batches for every run).

Per run: final validation loss, its gap to AdamW's in %, the mean step time (metrics' step_time_s, first step
left out) and its ratio to AdamW's, the optimizer state bytes from --summary. Runs go back to back (AdamW,
LAMB, Adafactor, per seed), so the ratios share the machine's load; the machine is shared and noisy: read
the ratios, not the seconds. Prints host kernel and ISA.

Usage: /usr/bin/python3 bench/optimizer_convergence.py [--meshtrain build/meshtrain] [--data ../shared/data]
         [--out bench/results/optimizers] [--steps 400] [--every 50] [--seeds 1337]
         [--lrs adamw=1e-3,lamb=1e-2,adafactor=3e-3]   (optimizer=lr pairs, run in this order; an optimizer may
                                                        appear several times: a small learning-rate sweep)
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import prepare_text  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def host():
    flags = set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return dict(kernel=platform.release(), isa=isa, cores=os.cpu_count(), loadavg=os.getloadavg())


def read_rows(path):
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--meshtrain", default=os.path.join(ROOT, "build", "meshtrain"))
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "..", "shared", "data"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "optimizers"))
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--seeds", default="1337")
    ap.add_argument("--lrs", default="adamw=1e-3,lamb=1e-2,adafactor=3e-3")
    args = ap.parse_args()
    runs = [tuple(kv.split("=")) for kv in args.lrs.split(",")]  # (optimizer, lr), in order; repeats allowed
    seeds = [int(s) for s in args.seeds.split(",")]
    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    h = host()
    print(f"host: kernel {h['kernel']}, ISA {' '.join(h['isa'])}, {h['cores']} cores, load {h['loadavg']}")
    results = []
    with tempfile.TemporaryDirectory() as work:
        prepare_text(args.meshtrain, work, args.data)
        for seed in seeds:
            for opt, lr in runs:
                tag = f"{opt}_lr{lr}_seed{seed}"
                metrics, summary = os.path.join(args.out, tag + ".jsonl"), os.path.join(work, tag + ".json")
                cmd = [args.meshtrain, "train", "--model", "gpt", "--data", os.path.join(work, "train.bin"),
                       "--val-data", os.path.join(work, "val.bin"), "--eval-batches", "16", "--n-layer", "2",
                       "--n-head", "4", "--n-embd", "256", "--vocab-size", "256", "--n-positions", "64",
                       "--seq-len", "64", "--batch-size", "16", "--steps", str(args.steps),
                       "--warmup-steps", str(max(1, args.steps // 20)), "--weight-decay", "0.1", "--grad-clip",
                       "1.0", "--eval-every", str(args.every), "--seed", str(seed), "--threads", "1",
                       "--optimizer", opt, "--lr", lr, "--metrics", metrics, "--summary", summary, "--quiet"]
                t0 = time.monotonic()
                r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
                wall = time.monotonic() - t0
                if r.returncode != 0:
                    print(f"{tag}: failed (exit {r.returncode}): {r.stderr[-400:]}")
                    results.append(dict(opt=opt, lr=lr, seed=seed, status="failed"))
                    continue
                rows = read_rows(metrics)
                with open(summary) as f:
                    s = json.load(f)
                rank0 = s["ranks"][0]
                results.append(dict(opt=opt, lr=float(lr), seed=seed, status="ok", wall_s=wall,
                                    step_s=float(np.mean([x["step_time_s"] for x in rows[1:]])),
                                    final_val_loss=rows[-1].get("val_loss"),
                                    curve=[(x["step"] + 1, x["val_loss"]) for x in rows if "val_loss" in x],
                                    optimizer_bytes=rank0.get("optimizer_bytes"), params=s.get("params")))
                print(f"{tag}: final val loss {results[-1]['final_val_loss']:.4f}, {results[-1]['step_s'] * 1e3:.1f} "
                      f"ms/step, optimizer state {rank0.get('optimizer_bytes')} bytes", flush=True)
    lines = [f"host: kernel {h['kernel']}, ISA {' '.join(h['isa'])}, {h['cores']} cores (shared, noisy: ratios from "
             f"back-to-back runs)", "",
             "| optimizer | lr | seed | final val loss | gap to AdamW | ms/step | step time / AdamW | state bytes / param |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r["status"] != "ok":
            lines.append(f"| {r['opt']} | {r['lr']} | {r['seed']} | failed | | | | |")
            continue
        base = next((b for b in results if b["opt"] == "adamw" and b["seed"] == r["seed"] and b["status"] == "ok"), None)
        gap = f"{100 * (r['final_val_loss'] / base['final_val_loss'] - 1):+.2f}%" if base else ""
        ratio = f"{r['step_s'] / base['step_s']:.2f}" if base else ""
        per = r["optimizer_bytes"] / r["params"] if r.get("params") else float("nan")
        lines.append(f"| {r['opt']} | {r['lr']:g} | {r['seed']} | {r['final_val_loss']:.4f} | {gap} | "
                     f"{r['step_s'] * 1e3:.1f} | {ratio} | {per:.2f} |")
    table = "\n".join(lines)
    print("\n" + table)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(dict(host=h, steps=args.steps, every=args.every, results=results), f, indent=1)


if __name__ == "__main__":
    main()
