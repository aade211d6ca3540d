#!/usr/bin/env python3
"""PipeDream-2BW against 1F1B at equal wall time, P = 2: the character GPT of bench/pp_convergence.py (same
model, data, seed and hyperparameters; only --schedule differs), run in back-to-back pairs in alternating order
(1f1b first, then 2bw first, ...) so that a load change on the shared host hits both runs of a pair alike.

Per pair: each run's final validation loss (equal steps), its training seconds (the metrics' step_time_s summed:
evaluation excluded), the ratio 2BW / 1F1B of those seconds, and "at equal wall time": 2BW's validation loss
interpolated (linearly in training seconds) at each of 1F1B's evaluation times, against 1F1B's loss there (the
gap in percent, negative: 2BW lower = ahead). The goal of issue 26: 2BW within 3% of 1F1B's final validation loss
at equal steps, and ahead at equal wall time. Writes table.md, results.json and, per pair, an SVG of
validation loss against training seconds (bench/convergence_svg.py) to --out.

Usage: /usr/bin/python3 bench/pp_2bw_wall.py [--meshtrain build/meshtrain] [--steps 200] [--pairs 3]
       [--eval-every 25] [--out bench/results/pp_2bw_wall]
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_util import isa_flags as isa, prepare_text  # noqa: E402


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def curve(path):
    """[(training seconds so far, val_loss)] at each evaluation, and the total training seconds."""
    pts, t = [], 0.0
    for line in open(path):
        if not line.strip():
            continue
        row = json.loads(line)
        t += float(row.get("step_time_s", 0.0))
        if "val_loss" in row:
            pts.append((t, float(row["val_loss"])))
    return pts, t


def interp(pts, t):
    """Loss at training seconds t, linear between evaluations (None past the last one)."""
    if t > pts[-1][0]:
        return None
    prev = (0.0, None)
    for x, y in pts:
        if x >= t:
            if prev[1] is None:
                return None  # before the first evaluation
            return prev[1] + (y - prev[1]) * (t - prev[0]) / (x - prev[0])
        prev = (x, y)
    return None


def step_at(pts, y):
    """The (interpolated) step at which a (step, loss) curve first comes down to y; None: not within the run."""
    for (s0, y0), (s1, y1) in zip(pts, pts[1:]):
        if y0 >= y >= y1:
            return s0 + (s1 - s0) * (y0 - y) / (y0 - y1)
    return None


def step_curve(path):
    return [(json.loads(l)["step"] + 1, json.loads(l)["val_loss"]) for l in open(path)
            if l.strip() and "val_loss" in json.loads(l)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meshtrain", default=os.path.join(ROOT, "build", "meshtrain"))
    ap.add_argument("--data", default="/work/shared/data")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--micro-batch-size", type=int, default=4, help="of the batch of 16: m = 16 / this")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "pp_2bw_wall"))
    ap.add_argument("--from-results", action="store_true", help="rewrite table.md from results.json")
    ap.add_argument("--blocking-meshtrain", default="",
                    help="a third run per round: pipedream-2bw by this binary (a build whose updates run the "
                         "blocking exchange inside the window), labelled 2bw-blocking")
    a = ap.parse_args()
    a.meshtrain, a.out = os.path.abspath(a.meshtrain), os.path.abspath(a.out)
    if a.from_results:
        with open(os.path.join(a.out, "results.json")) as f:
            r = json.load(f)
        return write(a, r["host"], r["pairs"])
    os.makedirs(a.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="pp_2bw_wall_")
    prepare_text(a.meshtrain, work, a.data)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    host = f"Linux {platform.release()}, ISA {' '.join(isa())}, {os.cpu_count()} cores (shared with other builds)"
    print(host, flush=True)
    pairs = []
    for k in range(a.pairs):
        labels = ["1f1b", "pipedream-2bw"] + (["2bw-blocking"] if a.blocking_meshtrain else [])
        order = labels[k % len(labels):] + labels[:k % len(labels)] if k % 2 == 0 else \
            list(reversed(labels[k % len(labels):] + labels[:k % len(labels)]))
        pair = dict(pair=k, order=order, runs={})
        for label in order:
            sched = "1f1b" if label == "1f1b" else "pipedream-2bw"
            binary = a.blocking_meshtrain if label == "2bw-blocking" else a.meshtrain
            tag = f"pair{k}_{'2bw' if label == 'pipedream-2bw' else label}"
            metrics = os.path.join(a.out, tag + ".jsonl")
            if os.path.exists(metrics):
                os.remove(metrics)
            cmd = [binary, "train", "--data", os.path.join(work, "train.bin"), "--val-data",
                   os.path.join(work, "val.bin"), "--n-layer", "4", "--n-head", "4", "--n-embd", "128",
                   "--vocab-size", "256", "--seq-len", "64", "--batch-size", "16", "--micro-batch-size", str(a.micro_batch_size),
                   "--steps", str(a.steps), "--lr", repr(a.lr), "--min-lr", repr(a.lr / 10), "--warmup-steps",
                   "20", "--grad-clip", "1.0", "--eval-every", str(a.eval_every), "--eval-batches", "8",
                   "--seed", "1337", "--threads", "1", "--quiet", "--metrics", metrics,
                   "--nproc", "2", "--pp", "2", "--schedule", sched]
            load0 = loadavg()
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
            if r.returncode != 0:
                sys.exit(f"{tag}: exit {r.returncode}\n{r.stderr[-2000:]}")
            pts, secs = curve(metrics)
            pair["runs"][label] = dict(tag=tag, val=pts, train_s=secs, final_val=pts[-1][1],
                                       load=[load0, loadavg()])
            print(f"pair {k} {label:<14} final val {pts[-1][1]:.4f}  training {secs:.1f} s  load "
                  f"{load0:.1f} -> {loadavg():.1f}", flush=True)
        a1, a2 = pair["runs"]["1f1b"], pair["runs"]["pipedream-2bw"]
        pair["time_ratio"] = a2["train_s"] / a1["train_s"]
        pair["final_gap"] = a2["final_val"] / a1["final_val"] - 1
        pair["equal_time"] = [(t, y, interp(a2["val"], t)) for t, y in a1["val"]]
        if "2bw-blocking" in pair["runs"]:
            pair["blocking_ratio"] = pair["runs"]["2bw-blocking"]["train_s"] / a1["train_s"]
        pairs.append(pair)
        subprocess.run([sys.executable, os.path.join(HERE, "convergence_svg.py"), "--x", "time", "--out",
                        os.path.join(a.out, f"val_loss_time_pair{k}.svg"), "--title",
                        f"P = 2, pair {k} ({' then '.join(order)}): validation loss against training seconds",
                        f"1f1b={os.path.join(a.out, a1['tag'] + '.jsonl')}",
                        f"pipedream-2bw={os.path.join(a.out, a2['tag'] + '.jsonl')}"], check=True,
                       capture_output=True)
        write(a, host, pairs)


def break_even(a, pair):
    """2BW is ahead at 1F1B's evaluation after N steps iff its step-time ratio is below N / N', N' the step at
    which 2BW's loss comes down to 1F1B's there (from the step curves: the same in every pair)."""
    c1 = step_curve(os.path.join(a.out, pair["runs"]["1f1b"]["tag"] + ".jsonl"))
    c2 = step_curve(os.path.join(a.out, pair["runs"]["pipedream-2bw"]["tag"] + ".jsonl"))
    return [(n, None if step_at(c2, y) is None else n / step_at(c2, y)) for n, y in c1]


def write(a, host, pairs):
    lines = [f"# PipeDream-2BW against 1F1B at P = 2: equal steps and equal wall time ({a.steps} steps)", "",
             f"Host: {host}. Character GPT of bench/pp_convergence.py (4 layers, width 128, m = "
             f"{16 // a.micro_batch_size}, AdamW, clip 1.0); "
             f"evaluation every {a.eval_every} steps (2BW's windows end there). Pairs run back to back in "
             "alternating order; training seconds = the metrics' step_time_s summed (evaluation excluded); load = "
             "the 1-minute load average before and after each run (the host is shared with other builds).", "",
             "| pair | order | 1F1B final val | 2BW final val | gap at equal steps | 1F1B s | 2BW s | 2BW / 1F1B "
             "time | blocking 2BW / 1F1B time | 2BW gap at 1F1B's eval times (from the 2nd; -: 2BW had finished) | "
             "1F1B's val loss when 2BW finished (2BW's final) | load 1F1B / 2BW |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in pairs:
        a1, a2 = p["runs"]["1f1b"], p["runs"]["pipedream-2bw"]
        gaps = [f"{100 * (y2 / y1 - 1):+.1f}%" if y2 is not None else "-" for _, y1, y2 in p["equal_time"][1:]]
        blocking = f"{p['blocking_ratio']:.3f}" if "blocking_ratio" in p else "-"
        # At 2BW's last evaluation time: 1F1B's loss then (interpolated; "-": 1F1B had finished first).
        y1 = interp([tuple(x) for x in a1["val"]], a2["val"][-1][0])
        at_end = "-" if y1 is None else f"{y1:.4f} ({a2['val'][-1][1]:.4f}: {100 * (a2['val'][-1][1] / y1 - 1):+.1f}%)"
        order = " then ".join("2bw" if x == "pipedream-2bw" else x for x in p["order"])
        lines.append(f"| {p['pair']} | {order} | {a1['final_val']:.4f} | {a2['final_val']:.4f} | "
                     f"{100 * p['final_gap']:+.2f}% | {a1['train_s']:.1f} | {a2['train_s']:.1f} | "
                     f"{p['time_ratio']:.3f} | {blocking} | {' '.join(gaps)} | {at_end} | "
                     f"{a1['load'][0]:.1f}-{a1['load'][1]:.1f} / {a2['load'][0]:.1f}-{a2['load'][1]:.1f} |")
    m = 16 // a.micro_batch_size
    be = break_even(a, pairs[0])
    lines += ["", f"Break-even step-time ratio (2BW / 1F1B) at 1F1B's evaluations, from the step curves (the same "
              f"in every pair; 2BW is ahead at equal wall time there iff its ratio is below): " +
              ", ".join(f"step {n}: {'-' if r is None else f'{r:.3f}'}" for n, r in be) +
              f". The best 2BW can reach at P = 2, m = {m} (no bubble against 1F1B's (p - 1) of m + p - 1 slots): "
              f"m / (m + p - 1) = {m / (m + 1):.3f}."]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(dict(host=host, steps=a.steps, eval_every=a.eval_every, pairs=pairs), f, indent=1)


if __name__ == "__main__":
    main()
