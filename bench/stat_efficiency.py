#!/usr/bin/env python3
"""The statistical-efficiency curve on the character GPT: steps, tokens and wall time to reach a target
validation loss at global batch 8, 16, 32 and 64 (windows of 64 tokens), the gradient noise scale measured in
each run beside it, and the --adaptive-batch run (starting at batch 8) on the same plot.

Model and data as bench/comm_efficiency.py's gpt (2 layers, 4 heads, width 256, context 64, byte vocabulary,
tinyshakespeare: first 90% train, last 10% validation), one process, one thread, AdamW. Learning rate by the
square-root rule from 1e-3 at batch 16 (lr(B) = 1e-3 sqrt(B / 16)), 20 warm-up steps, then constant (--min-lr
= lr: a cosine's length would differ per run); --grad-clip 0 (all runs
alike; the adaptive batch refused clipping when the table was recorded). --micro-batch-size 4 in every run, so the noise scale (B_simple, in tokens; moving average, logged per
step for exact data parallelism) has at least 2 small batches at batch 8. Evaluation every 10 steps on 8
validation batches (the adaptive run: every 10 data steps of 8 windows).

Per run: the first evaluated step whose validation loss is <= --target, its tokens (step x B x 64) and its wall
time (the sum of the metrics' step_time_s up to that step: evaluation excluded), the median noise scale over
the run's second half, and the final validation loss. The adaptive run's x is also tokens (data steps x 8 x 64).

--only adaptive_dp2 runs one more adaptive run, at dp 2 (--nproc 2, one thread per rank: the same global batch
of 8 windows, 4 per rank, and the same data order), and appends its row to an existing table.md and results.json
(the plot is left as it is). Below the table, each adaptive run's decisions: the median measured times of an
optimizer step (t_compute: one batch's forward and backward; t_exchange: the exchange's part not hidden by the
backward; t_update: the optimizer step) and the range of goodput gains G(2k) / G(k).

Writes --out (default bench/results/stat_efficiency): table.md, results.json, loss_vs_tokens.svg, metrics/.
Timings come from a shared, loaded 2-core machine: compare the step and token columns first.
Usage: /usr/bin/python3 bench/stat_efficiency.py [--meshtrain build/meshtrain] [--data DIR] [--target 2.5]
       [--quick]
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_util import prepare_text  # noqa: E402
from convergence_svg import svg  # noqa: E402

T = 64
STEPS = {8: 600, 16: 400, 32: 250, 64: 160}


def lr_of(b):
    return 1e-3 * (b / 16) ** 0.5


def run(meshtrain, work, out, tag, batch, steps, extra, quick):
    metrics = os.path.join(out, "metrics", tag + ".jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    lr = lr_of(batch)
    cmd = [meshtrain, "train", "--model", "gpt", "--data", os.path.join(work, "train.bin"),
           "--val-data", os.path.join(work, "val.bin"), "--eval-batches", "8", "--eval-every", "10",
           "--n-layer", "2", "--n-head", "4", "--n-embd", "256", "--vocab-size", "256", "--n-positions", "64",
           "--seq-len", str(T), "--batch-size", str(batch), "--micro-batch-size", "4", "--steps", str(steps),
           "--optimizer", "adamw", "--lr", repr(lr), "--min-lr", repr(lr), "--warmup-steps", "20",
           "--grad-clip", "0", "--threads", "1", "--seed", "1337", "--quiet", "--metrics", metrics] + extra
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        print(f"{tag}: exit {r.returncode}: {r.stderr[-500:]}")
    rows = [json.loads(line) for line in open(metrics)] if os.path.exists(metrics) else []
    return dict(tag=tag, batch=batch, steps=steps, lr=lr, cmd=cmd, exit=r.returncode, wall_s=wall, rows=rows,
                metrics=metrics)


def summarize(res, target):
    rows = res["rows"]
    t = np.cumsum([r.get("step_time_s", 0.0) for r in rows]) if rows else []
    curve, hit = [], None
    for i, r in enumerate(rows):
        if r.get("val_loss") is None:
            continue
        tokens = (r["step"] + 1) * res["batch"] * T
        curve.append((tokens / 1000.0, r["val_loss"]))
        if hit is None and r["val_loss"] <= target:
            hit = dict(step=r["step"] + 1, tokens=tokens, time_s=float(t[i]))
    half = [r["noise_scale"] for r in rows[len(rows) // 2:] if r.get("noise_scale") is not None]
    ks = [r["batches_per_update"] for r in rows if "batches_per_update" in r]
    return dict(hit=hit, curve=curve, final_val=curve[-1][1] if curve else None,
                noise_median=float(np.median(half)) if half else None,
                k_last=ks[-1] if ks else None,
                k_changes=[(r["step"], r["batches_per_update"]) for a, r in zip(rows, rows[1:])
                           if "batches_per_update" in r and r["batches_per_update"] != a.get("batches_per_update")])


ADAPTIVE = ["--adaptive-batch", "--adaptive-batch-max", "8", "--adaptive-batch-every", "10"]


def host():
    kernel, isa = platform.release(), ""
    try:
        flags = open("/proc/cpuinfo").read().split("flags", 1)[1].split("\n", 1)[0]
        isa = " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in flags)
    except (OSError, IndexError):
        pass
    return kernel, isa


def row_line(res, s):
    hit = s["hit"]
    batch = str(res["batch"]) if "adaptive" not in res["tag"] else \
        f"8 x k (k: {' '.join(f'{k} from step {st}' for st, k in s['k_changes']) or 'stayed 1'})"
    if "dp2" in res["tag"]:
        batch += ", dp 2"
    hit_time = f"{hit['time_s']:.1f}" if hit else "—"
    if s["noise_median"] is None or s["final_val"] is None:
        return f"| {res['tag']} | {batch} | failed (exit {res['exit']}) | | | | | |"
    return (f"| {res['tag']} | {batch} | {hit['step'] if hit else 'not reached'} | {hit['tokens'] if hit else '—'} | "
            f"{hit_time} | {s['noise_median']:.0f} | {s['final_val']:.4f} | {res['wall_s']:.0f} |")


def decisions_line(res):
    """The adaptive run's decisions: median times and the gains' range."""
    d = [r for r in res["rows"] if "goodput_gain" in r]
    if not d:
        return f"{res['tag']}: no decision logged"
    med = {k: float(np.median([r[k] for r in d])) for k in ("t_compute_s", "t_exchange_s", "t_update_s")}
    noise = [r["goodput_noise"] for r in d if r.get("goodput_noise") is not None]
    gains = [r["goodput_gain"] for r in d]
    return (f"{res['tag']}: {len(d)} decisions; median t_compute {med['t_compute_s'] * 1e3:.1f} ms, t_exchange "
            f"{med['t_exchange_s'] * 1e3:.1f} ms, t_update {med['t_update_s'] * 1e3:.1f} ms; B_noise median "
            f"{np.median(noise) if noise else float('nan'):.0f} tokens; goodput gains {min(gains):.3f}-{max(gains):.3f}"
            f" ({sum(g > 1 for g in gains)} above 1)")


def append_dp2(a, work):
    res = run(a.meshtrain, work, a.out, "adaptive_dp2_from8", 8, 20 if a.quick else STEPS[8],
              ["--nproc", "2", *ADAPTIVE], a.quick)
    s = summarize(res, a.target)
    res.update(summary=s)
    kernel, isa = host()
    load = os.getloadavg()
    line, dec = row_line(res, s), decisions_line(res)
    print(line)
    print(dec)
    table = os.path.join(a.out, "table.md")
    text = open(table).read().rstrip("\n").split("\n") if os.path.exists(table) else []
    text = [t for t in text if not t.startswith(f"| {res['tag']} |") and not t.startswith(res["tag"] + ":")]
    end = max(i for i, t in enumerate(text) if t.startswith("|")) + 1 if any(t.startswith("|") for t in text) else 0
    text[end:end] = [line]
    text += ["", f"{dec} (host kernel {kernel}, ISA {isa}, load average {load[0]:.1f} at its end: shared machine)"]
    with open(table, "w") as f:
        f.write("\n".join(text) + "\n")
    path = os.path.join(a.out, "results.json")
    rec = json.load(open(path)) if os.path.exists(path) else dict(target=a.target, runs=[])
    rec["runs"] = [r for r in rec["runs"] if r.get("tag") != res["tag"]]
    rec["runs"].append({**{k: v for k, v in res.items() if k != "rows"}, "kernel": kernel, "isa": isa,
                        "load": load[0]})
    with open(path, "w") as f:
        json.dump(rec, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meshtrain", default=os.path.join(ROOT, "build", "meshtrain"))
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "..", "shared", "data"))
    ap.add_argument("--out", default=os.path.join(HERE, "results", "stat_efficiency"))
    ap.add_argument("--target", type=float, default=2.5)
    ap.add_argument("--quick", action="store_true", help="a few steps per run (a smoke test, not a measurement)")
    ap.add_argument("--only", choices=["adaptive_dp2"], help="run this one and append it to the recorded table")
    a = ap.parse_args()
    if not os.path.isdir(a.data):
        a.data = "/work/shared/data"
    os.makedirs(os.path.join(a.out, "metrics"), exist_ok=True)
    work = tempfile.mkdtemp(prefix="stat_eff_")
    prepare_text(a.meshtrain, work, a.data)
    if a.only:
        return append_dp2(a, work)
    results = []
    for b, steps in STEPS.items():
        results.append(run(a.meshtrain, work, a.out, f"batch{b}", b, 20 if a.quick else steps, [], a.quick))
    results.append(run(a.meshtrain, work, a.out, "adaptive_from8", 8, 20 if a.quick else STEPS[8], ADAPTIVE,
                       a.quick))
    kernel, isa = host()
    lines = [f"Character GPT (2 layers, width 256, context 64) on tinyshakespeare, AdamW lr 1e-3 x sqrt(B / 16), "
             f"target validation loss {a.target}. Host kernel {kernel}, ISA {isa}; shared, loaded 2-core machine "
             f"(other engineers building): wall times are noisy, steps and tokens are not.", "",
             "| run | batch (windows) | steps to target | tokens to target | train time to target (s) | "
             "noise scale B_simple (tokens, median 2nd half) | final val loss | run wall (s) |",
             "|---|---|---|---|---|---|---|---|"]
    groups = {}
    for res in results:
        s = summarize(res, a.target)
        res.update(summary=s)
        lines.append(row_line(res, s))
        if s["curve"]:
            groups[res["tag"]] = [(res["metrics"], s["curve"])]
    lines += [""] + [decisions_line(r) for r in results if "adaptive" in r["tag"]]
    table = "\n".join(lines) + "\n"
    print(table)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(table)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(dict(target=a.target, kernel=kernel, isa=isa, quick=a.quick,
                       runs=[{k: v for k, v in r.items() if k != "rows"} for r in results]), f, indent=1)
    if groups:
        text = svg(groups, title=f"validation loss against tokens seen (thousands); target {a.target}")
        with open(os.path.join(a.out, "loss_vs_tokens.svg"), "w") as f:
            f.write(text.replace(">step</text>", ">tokens (thousands)</text>"))


if __name__ == "__main__":
    main()
