#!/usr/bin/env python3
"""Pipeline schedules against each other on a character GPT: 1F1B and zb-h1 (exact: the single-process math),
PipeDream-2BW (the delay-1 rule), PipeDream (an update per micro-batch, weight stashing) and PipeMare (an
update per micro-batch, no stash; Pipelined Backpropagation without PipeMare's corrections), at P = 2 and
P = 4 stages, same steps, seed, data and hyperparameters; only --schedule (and --pp) differ.

Reports per run: the final validation loss, its gap to 1F1B's at the same P, the training time per step (mean
of steps 2..), the weight bytes per rank from --summary (param_bytes: 2BW keeps two versions; pipedream counts
its stash's most saved copies), for pipedream/pipemare the most weight versions each rank held, and the
measured and simulated bubble (the simulator's replay of the run's list at its measured stage times: for
pipedream/pipemare without a flush the window with its updates as blocking collectives) and whether the steps
flushed (--summary's pipeline section; "-" in runs recorded before). Writes
table.md, results.json and, per P, SVGs of validation loss against steps and against training seconds.

Model: 4 layers, 4 heads, width 128, context 64, byte vocabulary, on tinyshakespeare (first 90% train, last 10%
validation, made with `meshtrain prepare`); AdamW (--lr, default 3e-4), 20 warm-up steps then cosine to
lr / 10, clip 1.0, batch 16 x 64 tokens in micro-batches of 4 (m = 4), --steps (default 300), evaluation every
50 steps on 8 validation batches. PipeDream and PipeMare make m = 4 updates per step (each with the gradient of
one micro-batch's mean loss, lr of the step), so at equal steps they take 4x the updates of the others.

pipedream-2bw runs without a flush between steps (train/no_flush_steps.h: windows of steps between the
evaluations; at ZeRO 0 each step's reductions start after a rank's last backward and finish at its update,
train/split_exchange.h; bench/pp_2bw_wall.py times it against 1F1B in alternating pairs), and so do pipedream
and pipemare (train/micro_window_steps.h: the same windows, m >= P here); 1f1b and zb-h1 flush (no overlap of
step t+1's forwards with step t's backwards), and pipedream/pipemare's per-micro-batch update is a
synchronization point (the global norm over the stages). Results recorded before the no-flush executors (their
table says so) timed a flushed 2BW, and results recorded before session 15 a flushed pipedream/pipemare (a
different update rule: docs/parallelism.md "PipeDream and PipeMare"). Timings come from a shared
2-core machine (P = 4 runs 4 processes on 2 cores); kernel and ISA are printed with them.

Usage: /usr/bin/python3 bench/pp_convergence.py [--meshtrain build/meshtrain] [--steps 300] [--lr 3e-4]
       [--stages 2,4] [--out bench/results/pp_convergence] [--from-results]
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
from bench_util import char_gpt_train_cmd, isa_flags as isa, prepare_text, run_train, save_table  # noqa: E402

SCHEDULES = ["1f1b", "zb-h1", "pipedream-2bw", "pipedream", "pipemare", "pipemare+lr", "pipemare+corr",
             "pipemare+both"]
# PipeMare with its corrections (docs/parallelism.md, "PipeMare's corrections"): the learning-rate rescheduling
# annealed over K = 400 updates (half the run's 800 at 200 steps, m = 4) and the discrepancy correction with
# GAMMA = 0.5; both values chosen here, not tuned.
VARIANTS = {"pipemare+lr": ["--pipemare-lr-anneal", "400"],
            "pipemare+corr": ["--pipemare-correction", "0.5"],
            "pipemare+both": ["--pipemare-lr-anneal", "400", "--pipemare-correction", "0.5"]}


def write_outputs(out, host, steps, results):
    lines = [f"# Pipeline schedules: convergence at equal steps ({steps} steps, character GPT on tinyshakespeare)",
             "", f"Host: {host}. Step times are means over steps 2.. of one run each, back to back, on a noisy "
             "shared machine; pipedream-2bw, pipedream and pipemare run without a flush between steps (their "
             "updates still blocking collectives), 1f1b and zb-h1 flush. "
             "pipedream/pipemare make 4 updates per step "
             "(one per micro-batch). Weight bytes per rank: --summary's param_bytes.", "",
             "| P | schedule | final val loss | gap to 1F1B | ms/step | ratio to 1F1B | weight bytes per rank | "
             "weight versions held per rank | measured bubble | simulated bubble | flush between steps |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for P in sorted({r["P"] for r in results}):
        by = {r["schedule"]: r for r in results if r["P"] == P}
        base = by.get("1f1b")
        for sched in SCHEDULES:
            if sched not in by:
                continue
            r = by[sched]
            gap = f"{100 * (r['final_val'] / base['final_val'] - 1):+.2f}%" if base and sched != "1f1b" else "-"
            ratio = f"{r['step_s'] / base['step_s']:.3f}" if base and sched != "1f1b" else "-"
            versions = r.get("stash_versions") or ([2] * P if sched == "pipedream-2bw" else [1] * P)
            bubble = f"{100 * r['bubble']:.1f}%" if r.get("bubble") is not None else "-"
            bubble_sim = f"{100 * r['bubble_sim']:.1f}%" if r.get("bubble_sim") is not None else "-"
            flush = {True: "yes", False: "no"}.get(r.get("flush"), "-")
            lines.append(f"| {P} | {sched} | {r['final_val']:.4f} | {gap} | {r['step_s'] * 1e3:.1f} | {ratio} | "
                         f"{', '.join(str(int(b)) for b in r['param_bytes'])} | {versions} | {bubble} | {bubble_sim} | {flush} |")
    save_table(out, "\n".join(lines) + "\n", host, steps, results)
    for P in sorted({r["P"] for r in results}):
        runs = [r for r in results if r["P"] == P]
        runs.sort(key=lambda r: SCHEDULES.index(r["schedule"]))
        for x in ("step", "time"):
            cmd = [sys.executable, os.path.join(HERE, "convergence_svg.py"), "--x", x,
                   "--out", os.path.join(out, f"val_loss_{x}_P{P}.svg"),
                   "--title", f"validation loss against {'steps' if x == 'step' else 'training seconds'}, "
                   f"P = {P} ({steps} steps)"]
            cmd += [f"{r['schedule']}={os.path.join(out, r['tag'] + '.jsonl')}" for r in runs]
            subprocess.run(cmd, check=True, capture_output=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meshtrain", default=os.path.join(ROOT, "build", "meshtrain"))
    ap.add_argument("--data", default="/work/shared/data")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=3e-4, help="peak learning rate (cosine to lr / 10)")
    ap.add_argument("--stages", default="2,4")
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    ap.add_argument("--out", default=os.path.join(HERE, "results", "pp_convergence"))
    ap.add_argument("--from-results", action="store_true", help="rewrite table.md and the SVGs from results.json")
    ap.add_argument("--keep", action="store_true",
                    help="keep results.json's runs of other schedules (rerun only --schedules, same host line)")
    a = ap.parse_args()
    a.meshtrain, a.out = os.path.abspath(a.meshtrain), os.path.abspath(a.out)
    if a.from_results:
        with open(os.path.join(a.out, "results.json")) as f:
            r = json.load(f)
        write_outputs(a.out, r["host"], r["steps"], r["runs"])
        return
    os.makedirs(a.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="pp_convergence_")
    prepare_text(a.meshtrain, work, a.data)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    host = (f"Linux {platform.release()}, ISA {' '.join(isa())}, {os.cpu_count()} cores (shared with other "
            f"builds); lr {a.lr:g}")
    print(host, flush=True)
    results = []
    if a.keep and os.path.exists(os.path.join(a.out, "results.json")):
        with open(os.path.join(a.out, "results.json")) as f:
            old = json.load(f)
        assert old["steps"] == a.steps, f"--keep: results.json has {old['steps']} steps, not {a.steps}"
        mine = set(a.schedules.split(","))
        results = [r for r in old["runs"] if r["schedule"] not in mine]
        host = f"{old['host']}; the {', '.join(sorted(mine))} runs later: {host}"
    for P in (int(x) for x in a.stages.split(",")):
        for sched in a.schedules.split(","):
            tag = f"P{P}_{sched}"
            metrics, summary = os.path.join(a.out, f"{tag}.jsonl"), os.path.join(work, f"{tag}.summary.json")
            if os.path.exists(metrics):
                os.remove(metrics)
            cmd = char_gpt_train_cmd(a.meshtrain, work, a.steps, a.lr, metrics, summary)
            cmd += ["--nproc", str(P), "--pp", str(P), "--schedule", sched.split("+")[0]] + VARIANTS.get(sched, [])
            val, step_s, wall, s = run_train(cmd, metrics, summary, env, 5400, tag)
            res = dict(P=P, schedule=sched, tag=tag, final_val=val[-1][1], val=val, step_s=step_s, wall_s=wall,
                       param_bytes=[rk["param_bytes"] for rk in s["ranks"]],
                       stash_versions=s.get("pipeline", {}).get("stash_versions"),
                       bubble=s.get("pipeline", {}).get("bubble_measured"),
                       # what the simulator gives the run's list at its measured costs: the window's (updates as
                       # blocking collectives) without a flush, else the one-step list's
                       bubble_sim=s.get("pipeline", {}).get("bubble_simulated_window",
                                                           s.get("pipeline", {}).get("bubble_simulated")),
                       flush=s.get("pipeline", {}).get("flush_between_steps"))
            results.append(res)
            results.sort(key=lambda r: (r["P"], SCHEDULES.index(r["schedule"])))
            print(f"P={P} {sched:<14} final val {val[-1][1]:.4f}  {step_s * 1e3:7.1f} ms/step  param_bytes "
                  f"{res['param_bytes']}  versions {res['stash_versions']}", flush=True)
            write_outputs(a.out, host, a.steps, results)  # after every run: a partial record survives


if __name__ == "__main__":
    main()
