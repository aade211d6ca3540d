#!/usr/bin/python3
"""A/B of the shm ranks' core binding (src/comm/shm/bind.h) on training: a 2-rank data-parallel GPT run (ZeRO 1,
--threads 1) with the default (ranks bound to CPUs of their own when ranks x threads fit the allowed CPUs) and with
MESHTRAIN_SHM_BIND=0 (and any --variant), alternating in one job, PAIRS rounds. Prints per run the median step time (steps after the
first two), then per variant the median over runs and the ratio bound / unbound (< 1: binding is faster).

Usage: /usr/bin/python3 bench/bind_train_ab.py [--meshtrain build/meshtrain] [--pairs 4] [--steps 12]
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

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPE = dict(n_layer=4, n_head=4, n_embd=256, vocab_size=4096, n_positions=128)
T, PER_RANK = 128, 4


def run(args, work, tag, env_extra):
    metrics = os.path.join(work, f"metrics_{tag}.jsonl")
    cmd = [args.meshtrain, "train", "--data", os.path.join(work, "data.bin"), "--seq-len", str(T),
           "--batch-size", str(PER_RANK * 2), "--steps", str(args.steps), "--nproc", "2", "--zero", "1",
           "--threads", "1", "--quiet", "--metrics", metrics]
    for k, v in SHAPE.items():
        cmd += ["--" + k.replace("_", "-"), str(v)]
    env = dict(os.environ)
    env.pop("MESHTRAIN_SHM_BIND", None)
    env.update(env_extra)
    subprocess.run(cmd, check=True, env=env)
    rows = [json.loads(l) for l in open(metrics)]
    times = [r["step_time_s"] for r in rows if "step_time_s" in r][2:]
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", default=os.path.join(HERE, "..", "build", "meshtrain"))
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME:VAR=VALUE,... a third (fourth, ...) variant in each round, e.g. "
                         "bound_staged:MESHTRAIN_SHM_CMA_GATHER_KB=16384")
    args = ap.parse_args()
    with open("/proc/loadavg") as f:
        load0 = " ".join(f.read().split()[:3])
    print(f"# host kernel {platform.release()}, {os.cpu_count()} CPUs; load before {load0}")
    variants = [("bound", {}), ("unbound", {"MESHTRAIN_SHM_BIND": "0"})]
    for v in args.variant:
        name, _, envs = v.partition(":")
        variants.append((name, dict(e.split("=", 1) for e in envs.split(",") if e)))
    res = {v: [] for v, _ in variants}
    with tempfile.TemporaryDirectory() as work:
        write_shard(os.path.join(work, "data.bin"), PER_RANK * 2 * T * (args.steps + 1) + 1, SHAPE["vocab_size"])
        for i in range(args.pairs):
            order = variants if i % 2 == 0 else variants[::-1]
            for v, env in order:  # alternating direction each round
                t = run(args, work, f"{v}{i}", env)
                res[v].append(t)
                print(f"round {i} {v:14s} median step {t * 1e3:8.2f} ms", flush=True)
    with open("/proc/loadavg") as f:
        load1 = " ".join(f.read().split()[:3])
    u = statistics.median(res["unbound"])
    for v, _ in variants:
        if v == "unbound":
            continue
        m = statistics.median(res[v])
        per_pair = [x / y for x, y in zip(res[v], res["unbound"])]
        print(f"# median step: {v} {m * 1e3:.2f} ms, unbound {u * 1e3:.2f} ms, ratio {v}/unbound {m / u:.3f} "
              f"(per pair {', '.join(f'{r:.3f}' for r in per_pair)})")
    print(f"# load after {load1}")


if __name__ == "__main__":
    sys.exit(main())
