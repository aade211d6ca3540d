#!/usr/bin/env python3
"""Where an offloaded ZeRO 3 step's wall time goes on a shared host: the compute thread's time on a CPU, runnable
but waiting for one (the host's other load), and blocked (waiting for the offload files' reads and writes).

For each binary and kind (GPT, 4 layers, V 8192, T 256, --threads 1, one rank, ZeRO 3; in memory, --offload
optimizer,params and optimizer,params,grads with 8M tiles, each also with --overlap-update: kinds po, pgo) trains --steps steps, alternating, --rounds times, and
samples every 50 ms the main thread's /proc/PID/task/PID/schedstat (ns on a CPU, ns runnable waiting for a CPU)
and the --metrics file's line count. The steady steps are those after the first two: between the samples at
which line 2 and the last line appeared, per step,
    run       time on a CPU (the compute and whatever the main thread does itself),
    runqueue  time runnable but not running (the host's other processes; it moves with the load, not with us),
    blocked   wall - run - runqueue (waits: a shard read not yet done, a gradient write, the update's tiles),
and the CPU seconds of the other threads (I/O threads) from /proc/PID/task/*/stat. "run + blocked" is the step
with the host's contention taken out (an upper estimate: the I/O threads' own runqueue waits can stretch blocked).
Reported per kind: the medians over rounds, and (run + blocked) / the in-memory run of the same round.

Prints uname -r, the CPU's vector ISA and the load. Usage:
  /usr/bin/python3 bench/offload_sched_bench.py [--bins new=build/meshtrain,base=/path/to/old] [--kinds
  new:memory,new:p,new:pg] [--width 384] [--batch 16] [--steps 6] [--rounds 2] [--out results.json]
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench_util import write_shard
from offload_bench import isa

T, VOCAB = 256, 8192


def sample(pid, metrics):
    try:
        ss = [int(x) for x in open(f"/proc/{pid}/task/{pid}/schedstat").read().split()]
    except OSError:
        return None
    try:
        lines = sum(1 for _ in open(metrics))
    except OSError:
        lines = 0
    return time.time(), ss[0] / 1e9, ss[1] / 1e9, lines


def run(a, work, odir, mt, kind):
    off = ["--offload-dir", odir, "--offload-tile", "8M"]
    extra = {"memory": ["--zero", "3"], "p": ["--zero", "3", "--offload", "optimizer,params"] + off,
             "pg": ["--zero", "3", "--offload", "optimizer,params,grads"] + off,
             # the same with the exact update on its own thread (--overlap-update at ZeRO 3)
             "po": ["--zero", "3", "--offload", "optimizer,params", "--overlap-update"] + off,
             "pgo": ["--zero", "3", "--offload", "optimizer,params,grads", "--overlap-update"] + off}[kind]
    metrics, summary = os.path.join(work, "metrics.jsonl"), os.path.join(work, "summary.json")
    for f in (metrics, summary):
        if os.path.exists(f):
            os.remove(f)
    cmd = [mt, "train", "--data", os.path.join(work, "data.bin"), "--seq-len", str(T), "--batch-size", str(a.batch),
           "--steps", str(a.steps), "--threads", "1", "--quiet", "--summary", summary, "--metrics", metrics,
           "--n-layer", "4", "--n-head", str(a.width // 64), "--n-embd", str(a.width), "--vocab-size", str(VOCAB),
           "--n-positions", str(T)] + extra
    load = os.getloadavg()[0]
    p = subprocess.Popen(cmd)
    tck = os.sysconf("SC_CLK_TCK")
    samples, cpu = [], {}
    while p.poll() is None:
        s = sample(p.pid, metrics)
        if s:
            samples.append(s)
        try:
            for t in os.listdir(f"/proc/{p.pid}/task"):
                try:
                    f = open(f"/proc/{p.pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()
                    cpu[int(t)] = (int(f[11]) + int(f[12])) / tck
                except OSError:
                    pass
        except OSError:
            pass
        time.sleep(0.05)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))}: exit {p.returncode}")
    steps = [json.loads(x)["step_time_s"] for x in open(metrics)]
    # First samples at which line 2 and line `steps` were present: the steady steps lie between.
    first = lambda n: next((s for s in samples if s[3] >= n), None)
    s0, s1 = first(2), first(a.steps)
    out = {"load": load, "step_s": statistics.median(steps[2:]), "other_threads_cpu_s": sum(v for t, v in cpu.items() if t != p.pid)}
    if s0 and s1 and s1[3] > s0[3]:
        n = s1[3] - s0[3]
        wall, runs, rq = s1[0] - s0[0], s1[1] - s0[1], s1[2] - s0[2]
        out.update(steady_steps=n, wall=wall / n, run=runs / n, runqueue=rq / n, blocked=(wall - runs - rq) / n)
    o = (json.load(open(summary)).get("offload") or {})
    out["shards"] = [{k: x.get(k) for k in ("kind", "read_bytes", "written_bytes", "staged_bytes")} for x in o.get("shards", [])]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bins", default="new=build/meshtrain")
    ap.add_argument("--kinds", default="new:memory,new:p,new:pg")
    ap.add_argument("--width", type=int, default=384)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    bins = dict(x.split("=") for x in a.bins.split(","))
    kinds = a.kinds.split(",")
    work = tempfile.mkdtemp(prefix="offload_sched_bench_")
    odir = tempfile.mkdtemp(prefix="offload_dir_", dir="/var/tmp")
    write_shard(os.path.join(work, "data.bin"), 200000, VOCAB)
    host = {"host_kernel": platform.release(), "isa": isa(), "cpus": os.cpu_count(), "width": a.width, "batch": a.batch,
            "steps": a.steps, "rounds": a.rounds, "bins": bins}
    print(f"host: kernel {host['host_kernel']}, ISA {host['isa']}, {host['cpus']} CPUs, load {os.getloadavg()[0]:.1f}; "
          f"width {a.width}, batch {a.batch}, {a.steps} steps (steady: after the first two)", flush=True)
    got = {k: [] for k in kinds}
    try:
        for r in range(a.rounds):
            for k in kinds:
                b, kind = k.split(":")
                x = run(a, work, odir, bins[b], kind)
                got[k].append(x)
                print(f"round {r} {k:<12} load {x['load']:.1f}: step {x['step_s']:.3f} s; per steady step run "
                      f"{x.get('run', float('nan')):.3f} + runqueue {x.get('runqueue', float('nan')):.3f} + blocked "
                      f"{x.get('blocked', float('nan')):.3f} s; other threads' CPU {x['other_threads_cpu_s']:.2f} s in the "
                      f"run; shards {x['shards']}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(odir, ignore_errors=True)
    mem = [k for k in kinds if k.endswith(":memory")]
    rows = {}
    for k in kinds:
        v = [x for x in got[k] if "run" in x]
        if not v:
            continue
        row = {f: statistics.median(x[f] for x in v) for f in ("step_s", "wall", "run", "runqueue", "blocked")}
        if mem:
            ratios = [(x["run"] + x["blocked"]) / m["run"] for x, m in zip(got[k], got[mem[0]]) if "run" in x and "run" in m]
            row["run_plus_blocked_over_memory_run"] = ratios
            row["wall_over_memory_wall"] = [x["wall"] / m["wall"] for x, m in zip(got[k], got[mem[0]]) if "run" in x and "run" in m]
        rows[k] = row
        print(f"{k:<12} medians: step {row['step_s']:.3f}, run {row['run']:.3f}, runqueue {row['runqueue']:.3f}, blocked "
              f"{row['blocked']:.3f} s; (run + blocked) / memory run per round "
              f"{', '.join(f'{r:.3f}' for r in row.get('run_plus_blocked_over_memory_run', []))}; wall / memory wall "
              f"{', '.join(f'{r:.3f}' for r in row.get('wall_over_memory_wall', []))}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(host, runs=got, medians=rows), f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
