#!/usr/bin/env python3
"""ZeRO-Infinity-style offload (--offload optimizer,params and optimizer,params,grads under --zero 3) against the
same run in memory, in one run, for a few model widths.

For each width C (GPT, L layers, V=8192, T=256, batch 4, one rank, ZeRO 3) trains three runs back to back: in
memory, --offload optimizer,params, --offload optimizer,params,grads (--offload-dir DIR), and prints tokens/s
(median step time over the steps after the first two), the ratio to memory, the bytes read and written per
step, and the I/O time per step (the files' and tier's seconds in reads and writes, summed over threads, from
--summary) against the in-memory step time: offload approaches memory once a step's compute exceeds its I/O.
The bound column is the issue's "step time <= 1.15x max(compute time, I/O time)": the offloaded step (median)
over the larger of the in-memory step (compute) and that I/O time per step (the threads' seconds summed: the
I/O time if no two files' reads and writes overlapped, so an upper estimate); one column per offload kind.
The shard files use direct I/O where the directory's filesystem takes it; the last column repeats
optimizer,params,grads with MESHTRAIN_OFFLOAD_DIRECT=0 (the shard files through the page cache, as before
direct I/O: a warm cache then serves their reads from memory).
Prints uname -r and the CPU's vector ISA. The machine may be shared: prefer the ratios of one run.
Usage: /usr/bin/python3 bench/offload_shards_bench.py [--meshtrain build/meshtrain] [--dir DIR] [--widths 256,512]
       [--rounds 3]
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile

from bench_util import write_shard
from offload_bench import isa

T, BATCH, VOCAB = 256, 4, 8192


def train(a, work, tag, width, extra, env=None):
    summary, metrics = os.path.join(work, f"summary_{tag}.json"), os.path.join(work, f"metrics_{tag}.jsonl")
    cmd = [a.meshtrain, "train", "--data", os.path.join(work, "data.bin"), "--seq-len", str(T), "--batch-size",
           str(BATCH), "--steps", str(a.steps), "--threads", str(a.threads), "--quiet", "--summary", summary,
           "--metrics", metrics, "--zero", "3", "--n-layer", str(a.layers), "--n-head", str(width // 64),
           "--n-embd", str(width), "--vocab-size", str(VOCAB), "--n-positions", str(T)] + extra
    subprocess.run(cmd, check=True, env=dict(os.environ, **(env or {})))
    rows = [json.loads(l) for l in open(metrics)]
    times = sorted(r["step_time_s"] for r in rows[2:])
    s = json.load(open(summary))
    s["step_s"] = times[len(times) // 2]
    s["tok_s"] = BATCH * T / s["step_s"]
    return s


def io_s(s, steps):
    o = s.get("offload") or {}
    secs = o.get("read_s", 0) + o.get("write_s", 0)
    for f in o.get("shards", []):
        secs += f["read_s"] + f["write_s"]
    return secs / steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", default="build/meshtrain")
    ap.add_argument("--dir", default="")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--widths", default="256,512,768")
    ap.add_argument("--tile", default="8M")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the runs, alternating; medians reported")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="offload_shards_bench_")
    odir = a.dir or tempfile.mkdtemp(prefix="offload_dir_", dir="/var/tmp")
    write_shard(os.path.join(work, "data.bin"), 200000, VOCAB)
    print(f"host: kernel {platform.release()}, ISA {isa()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
          f"offload dir {odir}; {a.layers} layers, T={T}, batch {BATCH}, {a.threads} thread(s), tile {a.tile}")
    print(f"{'width':>6} {'params':>9} {'memory tok/s':>13} {'opt+params':>16} {'opt+params+grads':>18} "
          f"{'MB r/w per step':>16} {'I/O s/step':>11} {'mem step s':>11} {'bound p':>8} {'bound pg':>9} {'p+g page cache':>15}")
    try:
        for w in [int(x) for x in a.widths.split(",")]:
            off = ["--offload-dir", odir, "--offload-tile", a.tile]
            runs = {"m": ([], None), "p": (["--offload", "optimizer,params"] + off, None),
                    "g": (["--offload", "optimizer,params,grads"] + off, None),
                    "c": (["--offload", "optimizer,params,grads"] + off, {"MESHTRAIN_OFFLOAD_DIRECT": "0"})}
            got = {k: [] for k in runs}
            for _ in range(a.rounds):
                for k, (extra, env) in runs.items():
                    got[k].append(train(a, work, f"{k}{w}", w, extra, env))
            # Per kind, the round with the median step time.
            mem, op, opg, opc = (sorted(got[k], key=lambda s: s["step_s"])[len(got[k]) // 2] for k in "mpgc")
            r = opg["ranks"][0]
            print(f"{w:>6} {mem['params'] / 1e6:>8.1f}M {mem['tok_s']:>13.0f} {op['tok_s']:>8.0f} ({op['tok_s'] / mem['tok_s']:.2f}x)"
                  f" {opg['tok_s']:>9.0f} ({opg['tok_s'] / mem['tok_s']:.2f}x) "
                  f"{r['offload_read_bytes_per_step'] / 1e6:>7.0f}/{r['offload_written_bytes_per_step'] / 1e6:<7.0f} "
                  f"{io_s(opg, a.steps):>11.3f} {mem['step_s']:>11.3f} "
                  f"{op['step_s'] / max(mem['step_s'], io_s(op, a.steps)):>8.2f} "
                  f"{opg['step_s'] / max(mem['step_s'], io_s(opg, a.steps)):>9.2f} "
                  f"{opc['tok_s']:>8.0f} ({opc['tok_s'] / mem['tok_s']:.2f}x)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not a.dir:
            shutil.rmtree(odir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
