#!/usr/bin/env python3
"""The offload files' disk bandwidth against fio on the same directory, same block size, queue depth, engine
and direct flag, back to back in one run.

The offload path: `meshtrain bench offload` (offload::ShardFile, the file behind --offload params / grads /
activations) writes a file of --bytes in jobs of --range bytes, 4 jobs queued at once, then reads it back
and checks it; each job starts 4 bytes past a 4096-byte boundary by default (--skew), as a bucket's slice of
a shard does, so direct I/O goes through the engine's aligned staging blocks. fio: the same file size in the
same directory, --bs=BLOCK --iodepth=DEPTH --ioengine=io_uring (or psync at depth 1) --direct=1 (0 for
--buffered), sequential write then read. Each configuration runs --rounds times alternating (offload, fio),
and the median of each is compared. Prints uname -r and the CPU's vector ISA with the figures. The machine may
be shared: prefer the ratios of one run to absolute figures.
Usage: /usr/bin/python3 bench/offload_fio_bench.py [--meshtrain build/meshtrain] [--dir DIR] [--bytes 256M]
       [--rounds 3] [--out results.json]
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


def isa():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":")[1].split())
                return "+".join(x for x in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if x in flags)
    return "baseline"


def size_arg(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def offload(a, engine, depth, block, skew, buffered):
    cmd = [a.meshtrain, "bench", "offload", "--dir", a.dir, "--bytes", str(a.bytes), "--range", str(a.range),
           "--skew", str(skew), "--block", str(block), "--depth", str(depth), "--engine", engine]
    if buffered:
        cmd.append("--buffered")
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def fio(a, rw, engine, depth, block, direct):
    r = subprocess.run(["fio", "--name=offload", f"--directory={a.dir}", f"--rw={rw}", f"--bs={block}",
                        f"--size={a.bytes}", f"--direct={1 if direct else 0}", f"--ioengine={engine}",
                        f"--iodepth={depth}", "--output-format=json", "--unlink=1"],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["jobs"][0][rw]["bw_bytes"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", default="build/meshtrain")
    ap.add_argument("--dir", default="", help="directory (default: a new one under /var/tmp)")
    ap.add_argument("--bytes", type=size_arg, default=256 << 20)
    ap.add_argument("--range", type=size_arg, default=4 << 20, help="bytes per queued job of the offload file")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if shutil.which("fio") is None:
        sys.exit("fio is not installed (bash scripts/setup.sh bench, or apt-get install fio)")
    own = not a.dir
    if own:
        a.dir = tempfile.mkdtemp(prefix="offload_fio_", dir="/var/tmp")
    # (name, engine, depth, block, skew, buffered): DeepSpeed's aio settings (1 MiB blocks, depth 8) with the
    # offload file's unaligned jobs, the same with aligned jobs, and one I/O at a time.
    configs = [("io_uring depth 8, jobs 4 bytes off 4096", "io_uring", 8, 1 << 20, 4, False),
               ("io_uring depth 8, aligned jobs", "io_uring", 8, 1 << 20, 0, False),
               ("psync depth 1, jobs 4 bytes off 4096", "psync", 1, 1 << 20, 4, False)]
    res = {"host_kernel": platform.release(), "isa": isa(), "dir": a.dir, "bytes": a.bytes, "range": a.range,
           "rounds": a.rounds, "configs": []}
    print(f"host kernel {res['host_kernel']}, ISA {res['isa']}; {a.bytes >> 20} MiB file in {a.dir}, "
          f"offload jobs of {a.range >> 10} KiB, 4 queued; medians of {a.rounds} alternating rounds")
    for name, engine, depth, block, skew, buffered in configs:
        ow, orr, fw, fr, mode = [], [], [], [], None
        for _ in range(a.rounds):
            o = offload(a, engine, depth, block, skew, buffered)
            mode = (o["engine"], o["direct_io"], o["io_depth"])
            ow.append(o["write_bytes_per_s"])
            orr.append(o["read_bytes_per_s"])
            fw.append(fio(a, "write", engine, depth, block, o["direct_io"]))
            fr.append(fio(a, "read", engine, depth, block, o["direct_io"]))
        row = {"name": name, "engine": mode[0], "direct_io": mode[1], "io_depth": mode[2], "block": block,
               "skew": skew, "offload_write": statistics.median(ow), "offload_read": statistics.median(orr),
               "fio_write": statistics.median(fw), "fio_read": statistics.median(fr),
               "rounds": {"offload_write": ow, "offload_read": orr, "fio_write": fw, "fio_read": fr}}
        row["write_ratio"] = row["offload_write"] / row["fio_write"]
        row["read_ratio"] = row["offload_read"] / row["fio_read"]
        res["configs"].append(row)
        print(f"{name} (offload used {mode[0]}, {'direct' if mode[1] else 'page cache'}, depth {mode[2]}): "
              f"write {row['offload_write'] / 1e6:.0f} vs fio {row['fio_write'] / 1e6:.0f} MB/s = "
              f"{row['write_ratio']:.2f}x; read {row['offload_read'] / 1e6:.0f} vs fio {row['fio_read'] / 1e6:.0f} "
              f"MB/s = {row['read_ratio']:.2f}x")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)
    if own:
        shutil.rmtree(a.dir)


if __name__ == "__main__":
    sys.exit(main())
