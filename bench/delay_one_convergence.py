#!/usr/bin/env python3
"""The delay-1 rule against the exact run on a character GPT: PipeDream-2BW against 1F1B at pp 2 (same steps,
seed, data and hyperparameters; only --schedule differs), and --delayed-update against the exact run at one
process. Reports the final validation loss of each, the gap in %, wall time per step (training only), and the
weight memory per stage from --summary (param_bytes: 2BW keeps two versions of each stage's weights).

Model: 4 layers, 4 heads, width 128, context 64, byte vocabulary, on tinyshakespeare (first 90% train, last 10%
validation, made with `meshtrain prepare`); AdamW lr 1e-3 (--lr), 20 warm-up steps then cosine to lr / 10, clip 1.0,
batch 16 x 64 tokens in micro-batches of 4 (m = 4 at pp 2), --steps (default 300), evaluation every 50 steps on
8 validation batches. Goal (issue 26): 2BW within 3% of 1F1B's final validation loss at equal steps; issue 28:
--delayed-update within 2% of the exact run.

The pipeline's 2BW here still flushes between steps (no overlap of step t+1's forwards with step t's last
backwards), so its step time is 1F1B's plus the version swap: the time column is not 2BW's throughput claim.
Timings come from a shared 2-core machine; the kernel and ISA are printed with them.

Usage: /usr/bin/python3 bench/delay_one_convergence.py [--meshtrain build/meshtrain] [--steps 300]
       [--out bench/results/delay_one] [--pairs pp,single] [--lr 1e-3] [--delayed-flags FLAGS] [--from-results]
"""
import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_util import char_gpt_train_cmd, isa_flags as isa, prepare_text, run_train, save_table  # noqa: E402

RUNS = [  # label, extra flags
    ("1f1b pp2", ["--nproc", "2", "--pp", "2", "--schedule", "1f1b"]),
    ("pipedream-2bw pp2", ["--nproc", "2", "--pp", "2", "--schedule", "pipedream-2bw"]),
    ("exact 1 process", []),
    ("delayed-update 1 process", ["--delayed-update"]),
]


def write_outputs(out, host, steps, results):
    """table.md, results.json and val_loss.svg in out, from the runs' results (also --from-results)."""
    by = {r["label"]: r for r in results}
    lines = [f"# The delay-1 rule against the exact run ({steps} steps, character GPT on tinyshakespeare)", "",
             f"Host: {host}. Step times are means over steps 2.. of one run each, back to back, on a noisy shared "
             "machine: the delay-1 runs do the exact runs' work plus one swap and one copy of the weights per step "
             "(pipedream-2bw still flushes between steps), so a time ratio away from 1 is the machine's load, not "
             "a speed-up. Weight bytes per rank: --summary's param_bytes (both versions under the rule).", "",
             "| run | final val loss | gap to its exact peer | ms/step | ratio to peer | weight bytes per rank |",
             "|---|---|---|---|---|---|"]
    for label, peer in (("1f1b pp2", None), ("pipedream-2bw pp2", "1f1b pp2"), ("exact 1 process", None),
                        ("delayed-update 1 process", "exact 1 process")):
        if label not in by or (peer and peer not in by):
            continue
        r = by[label]
        gap = f"{100 * (r['final_val'] / by[peer]['final_val'] - 1):+.2f}%" if peer else "-"
        ratio = f"{r['step_s'] / by[peer]['step_s']:.3f}" if peer else "-"
        lines.append(f"| {label} | {r['final_val']:.4f} | {gap} | {r['step_s'] * 1e3:.1f} | {ratio} | "
                     f"{', '.join(str(int(b)) for b in r['param_bytes'])} |")
    save_table(out, "\n".join(lines) + "\n", host, steps, results)
    svg = [sys.executable, os.path.join(HERE, "convergence_svg.py"), "--out", os.path.join(out, "val_loss.svg"),
           "--title", f"validation loss, delay-1 rule vs exact ({steps} steps)"]
    svg += [f"{r['label']}={os.path.join(out, r['label'].replace(' ', '_') + '.jsonl')}" for r in results]
    subprocess.run(svg, check=True, capture_output=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meshtrain", default=os.path.join(ROOT, "build", "meshtrain"))
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "..", "shared", "data"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (cosine to lr / 10)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "delay_one"))
    ap.add_argument("--pairs", default="pp,single", help="which pairs run: pp (1f1b vs pipedream-2bw at pp 2), "
                    "single (exact vs --delayed-update at one process)")
    ap.add_argument("--delayed-flags", default="", help="more flags for the --delayed-update run, e.g. "
                    "'--offload optimizer --offload-dir DIR' (offloading changes no bit: tests/cli/test_offload.py)")
    ap.add_argument("--from-results", action="store_true",
                    help="rewrite table.md and the SVG from --out's results.json")
    a = ap.parse_args()
    a.meshtrain, a.out = os.path.abspath(a.meshtrain), os.path.abspath(a.out)
    if a.from_results:
        with open(os.path.join(a.out, "results.json")) as f:
            r = json.load(f)
        write_outputs(a.out, r["host"], r["steps"], r["runs"])
        return
    if not os.path.isfile(os.path.join(a.data, "tinyshakespeare.txt")):
        a.data = "/work/shared/data"
    os.makedirs(a.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="delay_one_")
    prepare_text(a.meshtrain, work, a.data)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    host = f"Linux {platform.release()}, ISA {' '.join(isa())}, {os.cpu_count()} cores (shared with other builds)"
    print(host, flush=True)
    results = []
    want = set(a.pairs.split(","))
    for label, extra in RUNS:
        if ("pp" if "pp2" in label else "single") not in want:
            continue
        if "--delayed-update" in extra:
            extra = extra + shlex.split(a.delayed_flags)
        tag = label.replace(" ", "_")
        metrics, summary = os.path.join(a.out, f"{tag}.jsonl"), os.path.join(work, f"{tag}.summary.json")
        for p in (metrics,):
            if os.path.exists(p):
                os.remove(p)
        cmd = char_gpt_train_cmd(a.meshtrain, work, a.steps, a.lr, metrics, summary) + extra
        val, step_s, wall, summ = run_train(cmd, metrics, summary, env, 3600, label)
        ranks = summ["ranks"]
        results.append(dict(label=label, flags=extra, final_val=val[-1][1], val=val, step_s=step_s, wall_s=wall,
                            param_bytes=[rk["param_bytes"] for rk in ranks]))
        print(f"{label:<26} final val {val[-1][1]:.4f}  {step_s * 1e3:7.1f} ms/step  "
              f"param_bytes per rank {[rk['param_bytes'] for rk in ranks]}", flush=True)
    write_outputs(a.out, host + f"; lr {a.lr:g}", a.steps, results)

if __name__ == "__main__":
    main()
