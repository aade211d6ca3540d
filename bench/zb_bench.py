#!/usr/bin/env python3
"""Every synchronous schedule on the real GPT at P = 2 (gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, chimera):
tokens/s beside 1F1B's, measured and simulated bubble, the activation peak and the weight bytes per rank, from
`meshtrain train --pp 2 --summary`.

Shape as bench/pp_bench.py: L=8, H=8, C=256, V=2048, T=128, a global batch of 16 sequences, M micro-batches,
1 thread per rank on the 2 cores of this machine. The schedules run in turn, `--rounds` times, so a busy
spell of the shared machine falls on all of them; the table gives each schedule's median tokens/s and its ratio
to 1F1B's median. The simulated bubble replays the schedule with what each rank measured for each of its chunks
(`rank_chunk_*_ms`; "sim stage" is the same with one mean per stage for both of chimera's holders, the earlier
figure): forward, and for a split backward its input and weight halves each as measured, with the measured message
latency and each send and receive post taking its rank the measured mean time of one (`message_send_ms`,
`message_post_ms`; "sim free s/p" is the same with sends and posts free, the figure before they were
measured); beside it the simulation that splits each measured backward in halves by assumption (the earlier
figure), and the replay of the run's own steps with every computation's traced duration (bench/pp_replay.py:
what the variation of single durations on a loaded machine adds to the means). "within 5" counts the schedules
whose measured bubble is within 5 points of the simulated one, and of the replayed one.
Usage: /usr/bin/python3 bench/zb_bench.py [--meshtrain build/meshtrain] [--steps 6] [--rounds 3] [--m 8]
       [--schedules 1f1b,chimera]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

from bench_util import write_shard

SHAPE = dict(n_layer=8, n_head=8, n_embd=256, vocab_size=2048, n_positions=128)
T, B = 128, 16
SCHEDULES = ("1f1b", "gpipe", "interleaved", "zb-h1", "zb-h2", "zb-v", "chimera")


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
    if sched in ("zb-v", "interleaved", "chimera"):
        cmd += ["--virtual-stages", "2"]  # zb-v: rank j holds stages j and 3 - j; chimera: j and 1 - j (of 2)
    for k, v in SHAPE.items():
        cmd += ["--" + k.replace("_", "-"), str(v)]
    trace = os.path.join(work, f"trace_{sched}.json")
    cmd += ["--trace", trace]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    subprocess.run(cmd, check=True, env=env)
    with open(summary) as f:
        s = json.load(f)
    # The run's own steps replayed with each computation's traced duration (bench/pp_replay.py).
    out = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "pp_replay.py"),
                          "--meshtrain", args.meshtrain, "--summary", summary, "--trace", trace],
                         check=True, capture_output=True, text=True).stdout
    s["pipeline"].update(json.loads(out))
    return s


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
    print(f"{'schedule':<12} {'tokens/s':>9} {'/1f1b':>6} {'bubble meas':>12} {'simulated':>10} {'diff pp':>8} "
          f"{'send ms':>8} {'post ms':>8} {'sim stage':>10} {'sim free s/p':>13} {'sim 1/2 split':>14} {'replayed':>9} {'diff pp':>8} {'in flight':>10} {'bound':>8} {'act peak MiB':>14} "
          f"{'weights MiB':>12}")
    within = within_rep = 0
    for sched in schedules:
        med = statistics.median(got[sched])
        p = last[sched]["pipeline"]
        act = "/".join(f"{r['activation_peak_bytes'] / 1048576:.1f}" for r in last[sched]["ranks"])
        wts = "/".join(f"{r['param_bytes'] / 1048576:.2f}" for r in last[sched]["ranks"])
        fl = p.get("activation_in_flight", [])
        half = p.get("bubble_simulated_half_split", -1)
        d = 100 * (p["bubble_measured"] - p["bubble_simulated"])
        within += abs(d) <= 5
        rep = p["bubble_replayed"]
        within_rep += abs(p["bubble_measured"] - rep) <= 0.05
        print(f"{sched:<12} {med:>9.0f} {med / base:>6.3f} {100 * p['bubble_measured']:>11.1f}% "
              f"{100 * p['bubble_simulated']:>9.1f}% {d:>+8.1f} {p.get('message_send_ms', 0):>8.2f} "
              f"{p.get('message_post_ms', 0):>8.2f} {100 * p.get('bubble_simulated_per_stage_means', -1):>9.1f}% "
              f"{100 * p.get('bubble_simulated_with_free_sends_and_posts', -1):>12.1f}% "
              f"{'-' if half < 0 else f'{100 * half:.1f}%':>14} "
              f"{100 * rep:>8.1f}% {100 * (p['bubble_measured'] - rep):>+8.1f} "
              f"{'/'.join(str(r['peak_micro_batches']) for r in fl):>10} {'/'.join(str(r['bound']) for r in fl):>8} "
              f"{act:>14} {wts:>12}")
    print(f"measured within 5 points of simulated (per-(rank, chunk) means, message latency, send and post times): {within} of "
          f"{len(schedules)}; of the replay of the "
          f"run's own durations: {within_rep} of {len(schedules)}")
    print("\nwith a wait for a message that has already arrived costing the measured mean (ready wait):")
    print(f"{'schedule':<12} {'ready ms':>9} {'measured':>9} {'sim+ready':>10} {'diff pp':>8} {'replay+ready':>13} "
          f"{'diff pp':>8}")
    for sched in schedules:
        p = last[sched]["pipeline"]
        a, b = p["bubble_simulated_with_ready_wait"], p["bubble_replayed_with_ready_wait"]
        print(f"{sched:<12} {p['ready_wait_ms']:>9.1f} {100 * p['bubble_measured']:>8.1f}% {100 * a:>9.1f}% "
              f"{100 * (p['bubble_measured'] - a):>+8.1f} {100 * b:>12.1f}% {100 * (p['bubble_measured'] - b):>+8.1f}")
    print("\nwith each send and post costing the rank the time it spent in it (the trace's \"executor\" events:"
          " copy, transport call, losing the core there), replayed with the run's own compute durations:")
    print(f"{'schedule':<12} {'exec ms':>9} {'measured':>9} {'replay+exec':>12} {'diff pp':>8}")
    for sched in schedules:
        p = last[sched]["pipeline"]
        x = p.get("bubble_replayed_with_executor_time")
        if x is None:
            print(f"{sched:<12} (no executor events in the trace)")
            continue
        print(f"{sched:<12} {p['executor_ms_per_rank_step']:>9.1f} {100 * p['bubble_measured']:>8.1f}% "
              f"{100 * x:>11.1f}% {100 * (p['bubble_measured'] - x):>+8.1f}")
    for sched in schedules:
        p = last[sched]["pipeline"]
        print(f"  {sched}: stage forward ms {[round(x, 2) for x in p['stage_forward_ms']]}, backward "
              f"{[round(x, 2) for x in p['stage_backward_ms']]}, weight half "
              f"{[round(x, 2) for x in p.get('stage_weight_ms', [])]}, message {p['message_latency_ms']:.2f} ms; "
              f"per (rank, chunk) forward {[round(x, 2) for x in p.get('rank_chunk_forward_ms', [])]}, backward "
              f"{[round(x, 2) for x in p.get('rank_chunk_backward_ms', [])]}")


if __name__ == "__main__":
    main()
