#!/usr/bin/env python3
"""Optimizer-state offload (--offload optimizer) against the same run in memory, and the tier's disk bandwidth
against fio on the same directory, in one run.

Trains the gpt-bench shape (V=8192, T=256, L=6, H=6, C=384; AdamW: 8 bytes of state per parameter) on one rank
three times, back to back: in memory, then with --offload optimizer --offload-dir DIR with one I/O thread
(MESHTRAIN_OFFLOAD_IO_THREADS=1) and with two (the default), and prints tokens/s of each (median step time over
the steps after the first two) and the ratios to memory. Then fio (Debian's fio) reads and
writes a file of the same size in DIR with the block size of one tile (all state buffers' slices of a tile:
one read and one write per tile, as the tier does), one I/O at a time (psync) per thread,
direct I/O when the tier used it; the tier's bandwidth (one I/O thread) is its bytes over the seconds it spent
in reads and writes, and (its two threads overlap) reads and writes together over the time at least one was
running, against fio's two threads mixing reads and writes (--summary's "offload" section). Prints uname -r and the CPU's vector ISA with the figures.
The machine may be shared: prefer the ratios of one run to absolute figures.
Usage: /usr/bin/python3 bench/offload_bench.py [--meshtrain build/meshtrain] [--dir DIR] [--steps 8] [--tile 1M]
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

SHAPE = dict(n_layer=6, n_head=6, n_embd=384, vocab_size=8192, n_positions=256)
T, BATCH = 256, 4


def isa():
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":")[1].split())
                break
    return "+".join(x for x in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if x in flags) or "baseline"


def train(a, work, tag, extra, env=None):
    summary, metrics = os.path.join(work, f"summary_{tag}.json"), os.path.join(work, f"metrics_{tag}.jsonl")
    cmd = [a.meshtrain, "train", "--data", os.path.join(work, "data.bin"), "--seq-len", str(T), "--batch-size",
           str(BATCH), "--steps", str(a.steps), "--threads", str(a.threads), "--quiet", "--summary", summary,
           "--metrics", metrics] + extra
    for k, v in SHAPE.items():
        cmd += ["--" + k.replace("_", "-"), str(v)]
    subprocess.run(cmd, check=True, env=dict(os.environ, **(env or {})))
    rows = [json.loads(l) for l in open(metrics)]
    times = sorted(r["step_time_s"] for r in rows[2:])
    s = json.load(open(summary))
    s["step_s"] = times[len(times) // 2]
    s["tokens_per_s_median"] = BATCH * T / s["step_s"]
    return s


def fio(directory, rw, bs, size, direct, jobs=1):
    """fio's bandwidth in bytes/s: read, write, or (rw) reads and writes mixed, summed over `jobs` threads."""
    r = subprocess.run(["fio", "--name=offload", f"--directory={directory}", f"--rw={rw}", f"--bs={bs}",
                        f"--size={size}", f"--direct={1 if direct else 0}", "--ioengine=psync", "--iodepth=1",
                        f"--numjobs={jobs}", "--group_reporting", "--output-format=json", "--unlink=1"],
                       capture_output=True, text=True, check=True)
    job = json.loads(r.stdout)["jobs"][0]
    return sum(job[k]["bw_bytes"] for k in (("read", "write") if rw == "rw" else (rw,)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", default="build/meshtrain")
    ap.add_argument("--dir", default="", help="--offload-dir (default: a new directory under /var/tmp)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tile", default="1M", help="--offload-tile (bytes per state buffer per tile)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="offload_bench_")
    odir = a.dir or tempfile.mkdtemp(prefix="offload_dir_", dir="/var/tmp")
    write_shard(os.path.join(work, "data.bin"), 400000, SHAPE["vocab_size"])
    mem = train(a, work, "memory", [])
    flags = ["--offload", "optimizer", "--offload-dir", odir, "--offload-tile", a.tile]
    off1 = train(a, work, "offload1", flags, {"MESHTRAIN_OFFLOAD_IO_THREADS": "1"})
    off = train(a, work, "offload", flags, {"MESHTRAIN_OFFLOAD_IO_THREADS": "2"})
    o, o1 = off["offload"], off1["offload"]
    block = o["file_bytes"] // o["tiles"]
    have_fio = shutil.which("fio") is not None
    fr = fio(odir, "read", block, o["file_bytes"], o["direct_io"]) if have_fio else 0
    fw = fio(odir, "write", block, o["file_bytes"], o["direct_io"]) if have_fio else 0
    # The tier's two I/O threads read ahead and write behind at once: against fio's two threads mixing both.
    fm = fio(odir, "rw", block, o["file_bytes"] // 2, o["direct_io"], jobs=2) if have_fio else 0
    res = {
        "host_kernel": platform.release(), "isa": isa(), "shape": SHAPE, "batch": BATCH, "seq_len": T,
        "params": mem["params"], "steps": a.steps, "offload_dir": odir, "offload_tile": a.tile,
        "memory_tokens_per_s": mem["tokens_per_s_median"], "offload_tokens_per_s": off["tokens_per_s_median"],
        "offload_over_memory": off["tokens_per_s_median"] / mem["tokens_per_s_median"],
        "state_bytes": off["ranks"][0]["optimizer_offloaded_bytes"], "tier": o, "block_bytes": block,
        "fio_read_bytes_per_s": fr, "fio_write_bytes_per_s": fw,
        "offload_1thread_tokens_per_s": off1["tokens_per_s_median"],
        "offload_1thread_over_memory": off1["tokens_per_s_median"] / mem["tokens_per_s_median"], "tier_1thread": o1,
        "read_over_fio": o1["read_bytes_per_s"] / fr if fr else None,
        "write_over_fio": o1["write_bytes_per_s"] / fw if fw else None,
        "fio_mixed_2jobs_bytes_per_s": fm, "busy_over_fio_mixed": o["bytes_per_busy_s"] / fm if fm else None,
        "memory_peak_rss": mem["ranks"][0]["peak_rss_bytes"], "offload_peak_rss": off["ranks"][0]["peak_rss_bytes"],
    }
    print(f"host kernel {res['host_kernel']}, ISA {res['isa']}; GPT {mem['params']} parameters, "
          f"AdamW state {res['state_bytes'] / 2**20:.1f} MiB")
    print(f"tokens/s: memory {res['memory_tokens_per_s']:.0f}, offload {res['offload_tokens_per_s']:.0f}: "
          f"{res['offload_over_memory']:.3f}x (step {mem['step_s']:.3f} s vs {off['step_s']:.3f} s); with one I/O "
          f"thread {res['offload_1thread_tokens_per_s']:.0f}: {res['offload_1thread_over_memory']:.3f}x "
          f"(step {off1['step_s']:.3f} s)")
    print(f"peak RSS: memory {res['memory_peak_rss'] / 2**20:.1f} MiB, offload {res['offload_peak_rss'] / 2**20:.1f} MiB")
    print(f"tier ({'direct' if o['direct_io'] else 'buffered'} I/O, block {block} bytes), one I/O thread: read "
          f"{o1['read_bytes_per_s'] / 1e6:.0f} MB/s, write {o1['write_bytes_per_s'] / 1e6:.0f} MB/s; "
          f"demand reads {o1['demand_reads']} (two threads: {o['demand_reads']})")
    if have_fio:
        print(f"fio (psync, same block, same dir): read {fr / 1e6:.0f} MB/s, write {fw / 1e6:.0f} MB/s; "
              f"tier/fio read {res['read_over_fio']:.2f}x, write {res['write_over_fio']:.2f}x")
        print(f"reads and writes together: tier {o['bytes_per_busy_s'] / 1e6:.0f} MB/s of busy time, fio (2 psync "
              f"jobs, mixed) {fm / 1e6:.0f} MB/s: {res['busy_over_fio_mixed']:.2f}x")
    else:
        print("fio not installed (apt-get install fio): no bandwidth ratio")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)
    shutil.rmtree(work)
    if not a.dir:
        shutil.rmtree(odir)


if __name__ == "__main__":
    sys.exit(main())
