#!/usr/bin/env python3
"""A/B of two meshtrain binaries on `meshtrain bench pipeline` (issue 26's throughput check): the same flags, the two
binaries alternating (A, B, A, B, ...) in one job so that a slower spell of a shared machine falls on both.

Each run prints, per schedule, the step time's ratio to 1F1B's in the same run (1F1B's steps alternate with the
schedule's inside the run), the back-to-back ratio, and the executor's message columns (msg ms: a message's latency
from the sender's stamp to the waiting receiver running again; send ms: the sender's own time in a send, its copy
into the message buffer included). The summary gives each arm's mean, min and max over the pairs.

  /usr/bin/python3 bench/pp_p2p_ab.py --a /tmp/meshtrain-old --b build/meshtrain --pairs 3 \
      --activation-kb 1024,256 --schedules zb-h2,zb-v

The host line (kernel, ISA flags, load average before and after) goes with the table: `bench pipeline` emulates
compute by sleeping, so the ISA matters only to the copies of the messages.
"""
import argparse
import os
import platform
import re
import subprocess
import sys


def isa():
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    best = [x for x in ("avx512_bf16", "avx512f", "avx2", "sse4_2") if x in flags]
    return best[0] if best else platform.machine()


def load():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def run(binary, args, kb):
    cmd = [binary, "bench", "pipeline", "--stages", str(args.stages), "--micro-batches", str(args.micro_batches),
           "--schedules", args.schedules, "--activation-kb", str(kb), "--steps", str(args.steps)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        a = line.split()
        if len(a) >= 16 and a[0] in args.schedules.split(",") and a[1] == str(args.micro_batches):
            rows[a[0]] = dict(msg=float(a[8]), send=float(a[9]), step=float(a[11]), ratio=float(a[12]),
                              b2b=float(a[15]))
    missing = [s for s in args.schedules.split(",") if s not in rows]
    if missing:
        sys.exit(f"{binary}: no row for {missing} in its output:\n{out}")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="binary A (e.g. the tree before the change)")
    ap.add_argument("--b", required=True, help="binary B")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--schedules", default="zb-h2,zb-v")
    ap.add_argument("--activation-kb", default="1024,256")
    args = ap.parse_args()
    for b in (args.a, args.b):
        if not os.access(b, os.X_OK):
            sys.exit(f"not an executable: {b}")
    scheds = args.schedules.split(",")
    print(f"host: kernel {platform.release()} {platform.machine()}, ISA {isa()}, {os.cpu_count()} cpus; "
          f"`bench pipeline --stages {args.stages} --micro-batches {args.micro_batches} --steps {args.steps}`")
    print(f"A = {args.a}\nB = {args.b}")
    for kb in [int(x) for x in args.activation_kb.split(",")]:
        print(f"\n## {kb} KB activations")
        hdr = "| pair | arm | load | " + " | ".join(f"{s} step/1F1B | {s} b2b/1F1B | {s} msg ms | {s} send ms"
                                                   for s in scheds) + " |"
        print(hdr)
        print("|" + "---|" * (3 + 4 * len(scheds)))
        res = {"A": [], "B": []}
        for i in range(args.pairs):
            for arm, binary in (("A", args.a), ("B", args.b)):
                l0 = load()
                r = run(binary, args, kb)
                res[arm].append(r)
                cells = " | ".join(f"{r[s]['ratio']:.3f} | {r[s]['b2b']:.3f} | {r[s]['msg']:.2f} | {r[s]['send']:.2f}"
                                   for s in scheds)
                print(f"| {i + 1} | {arm} | {l0}->{load()} | {cells} |", flush=True)
        for s in scheds:
            for arm in ("A", "B"):
                v = [r[s]["ratio"] for r in res[arm]]
                m = [r[s]["msg"] for r in res[arm]]
                sd = [r[s]["send"] for r in res[arm]]
                print(f"{kb} KB {s} {arm}: step/1F1B mean {sum(v) / len(v):.3f} (min {min(v):.3f}, max {max(v):.3f});"
                      f" msg ms mean {sum(m) / len(m):.2f}; send ms mean {sum(sd) / len(sd):.2f}")


if __name__ == "__main__":
    main()
