"""Measured activations in flight per pipeline rank against each schedule's stated bound.

A real GPT run (`meshtrain train --pp P --summary`, 2 steps) reports, per pipeline rank, the most micro-batch
keys (one per micro-batch and chunk) the activation store held buffers for at once -- counted by the store, not
derived from the action list -- beside the schedule's stated bound (parallel/pipeline/in_flight_bound.h:
gpipe m, 1F1B and PipeDream-2BW min(p - j, m), interleaved Megatron's warm-up plus one, zb-h1 p, zb-h2 2p - 1,
zb-v 2p chunk pairs). Every schedule at P = 2 (m = 4) and P = 4 (m = 8, enough for every bound to be reached):
the measured count equals the bound on every rank, and the measured byte peak of the rank is no more than
(bound + 1) times the most one micro-batch held (the + 1 leaves room for the shared scratch slot; measured here
0.1 to 0.6 of a micro-batch).
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"))
from parity_harness import parse_args, single_thread_env  # noqa: E402
from run_files import write_random_shard  # noqa: E402

SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1), ("zb-h2", 1), ("zb-v", 2),
             ("pipedream-2bw", 1))
B, T = 8, 16


def main():
    args = parse_args(__doc__)
    data = os.path.join(args.workdir, "data.bin")
    write_random_shard(data, 20000, 64)
    fails = checks = 0
    for P, m in ((2, 4), (4, 8)):
        for sched, V in SCHEDULES:
            summary = os.path.join(args.workdir, f"summary_{sched}_{P}.json")
            cmd = [args.meshtrain, "train", "--data", data, "--seq-len", str(T), "--batch-size", str(B),
                   "--steps", "2", "--threads", "1", "--quiet", "--summary", summary, "--n-layer", "8",
                   "--n-head", "2", "--n-embd", "32", "--vocab-size", "64", "--n-positions", "32",
                   "--nproc", str(P), "--pp", str(P), "--schedule", sched, "--virtual-stages", str(V),
                   "--micro-batch-size", str(B // m)]
            subprocess.run(cmd, check=True, env=single_thread_env(), timeout=300)
            with open(summary) as f:
                s = json.load(f)
            rows = s["pipeline"]["activation_in_flight"]
            got = [r["peak_micro_batches"] for r in rows]
            bound = [r["bound"] for r in rows]
            checks += 1
            ok = got == bound and all(b > 0 for b in bound)
            # Bytes: the store's peak on the rank (world rank of pipeline rank j is j under dp = tp = 1).
            for j, r in enumerate(rows):
                peak = s["ranks"][j]["activation_peak_bytes"]
                per = r["peak_micro_batch_bytes"]
                checks += 1
                if not (per > 0 and peak <= (r["bound"] + 1) * per):
                    print(f"FAIL P={P} {sched} rank {j}: byte peak {peak} > (bound {r['bound']} + 1) x {per}")
                    fails += 1
            ratio = [round(s["ranks"][j]["activation_peak_bytes"] / r["peak_micro_batch_bytes"], 2)
                     for j, r in enumerate(rows)]
            print(f"{'ok  ' if ok else 'FAIL'} P={P} m={m} {sched:<14} measured in flight per rank {got}, "
                  f"stated bound {bound}, byte peak / one micro-batch {ratio}")
            fails += not ok
    print(f"test_activation_peak: {checks - fails} passed, {fails} failed")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
