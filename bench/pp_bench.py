#!/usr/bin/env python3
"""Pipeline and tensor parallelism on this machine: measured bubble against the simulator, activation memory
of 1F1B against GPipe, and tokens/s of tp=2 and pp=2 against one process, in one run.

Shape: L=8, H=8, C=256, V=2048, T=128, a global batch of 16 sequences, 1 thread per rank (the last stage's
logits make it about 1.2 blocks heavier; the default split balances that by estimated cost).
  1. bubble: for P in (2, 4) and each schedule (gpipe, 1f1b at M = P and 2P... and interleaved V=2 where
     M % P == 0), `meshtrain train --pp P --summary` reports the measured bubble (1 - summed compute / (P x
     the longest rank's span)) beside the simulated one (plan::simulate of the same schedule with each rank's
     measured forward and backward times and the measured message latency: send to the waiting receiver
     running again) and the ideal (p - 1) / (V m + p - 1); also the simulation with free messages. P = 4 runs
     4 ranks on the 2 cores of this machine, oversubscribed: the ranks share cores, so compute stretches while
     others run and a woken receiver may wait for a core (the message latency grows to milliseconds).
  1b. the executor alone at P = 2 and 4 with emulated compute (`meshtrain bench pipeline`: stage work is a
     sleep, so 4 ranks do not contend for 2 cores; real messages of 1 MB): measured vs simulated.
  2. memory: P = 2, M = 8: measured activation peak per rank, 1F1B vs GPipe (--summary activation_peak_bytes).
  3. throughput: dp=1 (one process), tp=2 (with and without sequence parallelism), pp=2 (1f1b, M=8), dp=2,
     each on 2 ranks of 1 thread, with the measured activation peak per rank.
Usage: /usr/bin/python3 bench/pp_bench.py [--meshtrain build/meshtrain] [--steps 6] [--quick]
"""
import argparse
import json
import os
import subprocess
import tempfile

from bench_util import write_shard

SHAPE = dict(n_layer=8, n_head=8, n_embd=256, vocab_size=2048, n_positions=128)
T, B = 128, 16


def run(args, work, tag, extra):
    summary = os.path.join(work, f"summary_{tag}.json")
    cmd = [args.meshtrain, "train", "--data", os.path.join(work, "data.bin"), "--seq-len", str(T),
           "--batch-size", str(B), "--steps", str(args.steps), "--threads", "1", "--quiet", "--summary", summary]
    for k, v in SHAPE.items():
        cmd += ["--" + k.replace("_", "-"), str(v)]
    cmd += [str(x) for x in extra]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    subprocess.run(cmd, check=True, env=env)
    with open(summary) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meshtrain", default=os.path.join(os.path.dirname(__file__), "..", "build", "meshtrain"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--quick", action="store_true", help="P = 2 only, fewer layouts")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="pp_bench_")
    write_shard(os.path.join(work, "data.bin"), 200000, SHAPE["vocab_size"])

    print("1. Pipeline bubble: measured vs simulated (same schedule, each stage's measured times)")
    print(f"{'P':>3} {'schedule':<12} {'M':>3} {'V':>2} {'measured':>9} {'simulated':>10} {'ideal':>7} {'diff pp':>8}"
          f" {'msg ms':>7} {'sim, msgs free':>15}")
    rows = []
    for P in ((2,) if args.quick else (2, 4)):
        for sched, V in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
            for M in (P, 2 * P):
                if M > B or B % M:
                    continue
                s = run(args, work, f"bubble_{P}_{sched}_{M}",
                        ["--nproc", P, "--pp", P, "--schedule", sched, "--virtual-stages", V,
                         "--micro-batch-size", B // M])
                p = s["pipeline"]
                d = 100 * (p["bubble_measured"] - p["bubble_simulated"])
                rows.append((P, sched, M, V, p["bubble_measured"], p["bubble_simulated"], p["bubble_ideal"], d))
                print(f"{P:>3} {sched:<12} {M:>3} {V:>2} {100 * p['bubble_measured']:>8.1f}% "
                      f"{100 * p['bubble_simulated']:>9.1f}% {100 * p['bubble_ideal']:>6.1f}% {d:>+8.1f}"
                      f" {p['message_latency_ms']:>7.2f} {100 * p['bubble_simulated_without_message_latency']:>14.1f}%",
                      flush=True)
    within = [r for r in rows if abs(r[7]) <= 5]
    print(f"within 5 percentage points: {len(within)} of {len(rows)}")

    print("\n1b. The executor with emulated compute (sleeping stages: no core contention at P = 4)")
    for P in ((2,) if args.quick else (2, 4)):
        subprocess.run([args.meshtrain, "bench", "pipeline", "--stages", str(P), "--forward-ms", "20",
                        "--steps", "4"], check=True)

    print("\n2. Activation memory, P = 2, M = 8 (measured peak per rank, MiB)")
    mem = {}
    for sched in ("gpipe", "1f1b"):
        s = run(args, work, f"mem_{sched}", ["--nproc", 2, "--pp", 2, "--schedule", sched, "--micro-batch-size", B // 8])
        mem[sched] = [r["activation_peak_bytes"] / 1048576 for r in s["ranks"]]
        print(f"  {sched:<6} " + "  ".join(f"rank {i}: {v:7.1f}" for i, v in enumerate(mem[sched])))
    print("  GPipe / 1F1B: " + "  ".join(f"rank {i}: {g / f:.2f}x" for i, (g, f) in
                                          enumerate(zip(mem["gpipe"], mem["1f1b"]))))

    print("\n3. Throughput on 2 cores (tokens/s; report, no target)")
    base = run(args, work, "dp1", [])["tokens_per_s"]
    print(f"  dp=1 (1 process, 1 thread): {base:8.0f}")
    for tag, extra in (("tp=2", ["--nproc", 2, "--tp", 2]),
                       ("tp=2 sequence-parallel", ["--nproc", 2, "--tp", 2, "--sequence-parallel"]),
                       ("pp=2 1f1b M=8", ["--nproc", 2, "--pp", 2,
                                                                               "--micro-batch-size", B // 8]),
                       ("dp=2", ["--nproc", 2])):
        if args.quick and tag == "dp=2":
            continue
        s = run(args, work, tag.replace(" ", "_").replace("=", ""), extra)
        tps = s["tokens_per_s"]
        act = max(r["activation_peak_bytes"] for r in s["ranks"]) / 1048576
        print(f"  {tag:<26}: {tps:8.0f}  ({tps / base:.2f}x dp=1)  activation peak per rank {act:.1f} MiB")


if __name__ == "__main__":
    main()
