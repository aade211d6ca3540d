#!/usr/bin/python3
"""Repeated runs of `meshtrain bench comm --bound` (all-gather, all-to-all, all-to-all-v at 2 ranks) and their
summary per operation and size, over the runs:

  ratio      our busbw / OpenMPI's in the same run: min / median / max
  ours/bnd   the single-copy bound's time / our time (1.00 = at the bound): min / median
  mpi/bnd    the same for OpenMPI (its run follows ours within seconds; the bound is measured beside our row)
  slow       runs whose time is above SLOW x that side's best time at that size (ours, OpenMPI's, the bound's):
             how often the host's slow regime shows, per side

Usage: bench/comm_repeat.py --meshtrain build/meshtrain --runs 5 --out bench/results/comm/FILE.txt
       [--min-bytes 32K] [--max-bytes 256M] [--extra "--seconds-per-size 0.25"]
       bench/comm_repeat.py --summarize FILE.txt     (summary of a file written before)
The output file holds every run's raw output (with host kernel, ISA, load before and after) and the summary.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time

SLOW = 2.0
OPS = "all_gather,all_to_all,all_to_all_v"


def isa() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return "?"
    for name in ("avx512f", "avx2", "avx", "sse4_2"):
        if name in flags:
            return name
    return "?"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        return "?"


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def parse_runs(text: str):
    """[(run, op, size, ours_us, mpi_us or None, bound_us or None)] from raw outputs split by '# ===== LABEL N'
    (run = (LABEL, N); this script writes LABEL 'run', an A/B script other labels)."""
    rows = []
    run = None
    op = None
    for line in text.splitlines():
        m = re.match(r"# ===== (\S+) (\d+)", line)
        if m:
            run = (m.group(1), int(m.group(2)))
            continue
        m = re.match(r"# (all_gather|all_to_all|all_to_all_v)$", line)
        if m:
            op = m.group(1)
            continue
        if run is None or op is None or line.startswith("#") or not line.strip():
            continue
        f = line.split()
        if len(f) < 14 or not f[0].isdigit():
            continue
        size, ours = int(f[0]), float(f[4])
        mpi = float(f[8]) if f[8] != "-" else None
        bound = float(f[14]) if len(f) >= 15 and f[14] != "-" else None
        rows.append((run, op, size, ours, mpi, bound))
    return rows


def summarize(text: str, label: str | None = None) -> str:
    rows = [r for r in parse_runs(text) if label is None or r[0][0] == label]
    runs = sorted({r[0] for r in rows})
    out = [f"# {len(runs)} runs{f' labelled {label}' if label else ''}; ratio = our busbw / OpenMPI's (same run); x/bnd = bound time / x's time (1.00 = at "
           f"the single-copy bound); slow = runs with time above {SLOW}x that side's best at that size",
           f"{'op':<14}{'size':>11} {'ratio min/med/max':>20} {'ours/bnd min/med':>17} {'mpi/bnd min/med':>16} "
           f"{'slow ours/mpi/bnd':>18} {'best us ours/mpi/bnd':>26}"]
    keys = sorted({(r[1], r[2]) for r in rows}, key=lambda k: (OPS.split(",").index(k[0]), k[1]))
    totals = {}
    for op, size in keys:
        sel = [r for r in rows if r[1] == op and r[2] == size]
        ours = [r[3] for r in sel]
        mpi = [r[4] for r in sel if r[4] is not None]
        bnd = [r[5] for r in sel if r[5] is not None]
        ratios = [r[4] / r[3] for r in sel if r[4] is not None]  # busbw ratio = time ratio inverted
        ob = [r[5] / r[3] for r in sel if r[5] is not None]
        mb = [r[5] / r[4] for r in sel if r[5] is not None and r[4] is not None]

        def slow(v):
            return sum(1 for x in v if x > SLOW * min(v)) if v else 0

        def mm(v, three=False):
            if not v:
                return "-"
            s = f"{min(v):.2f}/{statistics.median(v):.2f}"
            return s + (f"/{max(v):.2f}" if three else "")

        so, sm, sb = slow(ours), slow(mpi), slow(bnd)
        t = totals.setdefault(op, [0, 0, 0, 0])
        t[0] += so
        t[1] += sm
        t[2] += sb
        t[3] += len(sel)
        best = f"{min(ours):.1f}/{min(mpi) if mpi else float('nan'):.1f}/{min(bnd) if bnd else float('nan'):.1f}"
        out.append(f"{op:<14}{size:>11} {mm(ratios, True):>20} {mm(ob):>17} {mm(mb):>16} "
                   f"{f'{so}/{sm}/{sb} of {len(sel)}':>18} {best:>26}")
    for op, (so, sm, sb, n) in totals.items():
        out.append(f"# {op}: slow rows ours {so}/{n}, OpenMPI {sm}/{n}, bound {sb}/{n}")
    return "\n".join(out) + "\n"


def band_summary(text: str) -> str:
    """Per run label and size band (32 KB-512 KB, 1 MB-16 MB), over all ops' rows: ours/bnd median and rows below
    0.2, OpenMPI/bnd median and rows below 0.2, the ratio to OpenMPI (OpenMPI time / ours) median and rows below 1."""
    rows = parse_runs(text)
    out = []
    for lo, hi, band in [(32768, 524288, "32K-512K"), (1048576, 16777216, "1M-16M")]:
        for label in sorted({r[0][0] for r in rows}):
            sel = [r for r in rows if r[0][0] == label and lo <= r[2] <= hi]
            ob = [r[5] / r[3] for r in sel if r[5] is not None]
            mb = [r[5] / r[4] for r in sel if r[5] is not None and r[4] is not None]
            ra = [r[4] / r[3] for r in sel if r[4] is not None]
            if not ob:
                continue
            med = lambda v: f"{statistics.median(v):.2f}" if v else "-"  # noqa: E731
            out.append(f"{band:9} {label:10} rows {len(ob)}: ours/bnd median {med(ob)}, below 0.2: "
                       f"{sum(x < 0.2 for x in ob)}; mpi/bnd median {med(mb)}, below 0.2: {sum(x < 0.2 for x in mb)}; "
                       f"ratio median {med(ra)}, below 1: {sum(x < 1 for x in ra)}")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meshtrain")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out")
    ap.add_argument("--min-bytes", default="32K")
    ap.add_argument("--max-bytes", default="256M")
    ap.add_argument("--extra", default="", help="more bench comm flags")
    ap.add_argument("--env", default="", help="VAR=VALUE ... for the runs (e.g. MESHTRAIN_SHM_CMA_GATHER_KB=8192)")
    ap.add_argument("--summarize", help="only summarize this file")
    ap.add_argument("--by-label", action="store_true", help="with --summarize: one summary per run label (A/B files)")
    ap.add_argument("--bands", action="store_true", help="with --summarize: per label and size band (A/B files)")
    a = ap.parse_args()
    if a.summarize:
        with open(a.summarize) as f:
            text = f.read()
        if a.bands:
            sys.stdout.write(band_summary(text))
        elif a.by_label:
            for label in sorted({r[0][0] for r in parse_runs(text)}):
                sys.stdout.write(summarize(text, label))
        else:
            sys.stdout.write(summarize(text))
        return
    if not a.meshtrain or not a.out:
        ap.error("--meshtrain and --out are needed (or --summarize FILE)")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    for kv in a.env.split():
        k, v = kv.split("=", 1)
        env[k] = v
    cmd = [a.meshtrain, "bench", "comm", "--nproc", "2", "--ops", OPS, "--min-bytes", a.min_bytes, "--max-bytes",
           a.max_bytes, "--bound", "--rounds", "1"] + shlex.split(a.extra)
    head = [f"# {' '.join(cmd)}" + (f"   (env {a.env})" if a.env else ""),
            f"# host: kernel {platform.release()}, ISA {isa()}, CPU {cpu_model()}, {os.cpu_count()} cores "
            f"(shared with other engineers' builds and tests; load average per run below)"]
    raw = []
    for i in range(1, a.runs + 1):
        l0, t0 = load(), time.strftime("%H:%M:%S", time.gmtime())
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=1800)
        raw.append(f"# ===== run {i}\n# start {t0} UTC load {l0}\n{p.stdout}# exit {p.returncode} end load {load()}\n")
        print(f"run {i}: exit {p.returncode}", flush=True)
    text = "\n".join(head) + "\n" + "".join(raw)
    summary = summarize(text)
    with open(a.out, "w") as f:
        f.write("\n".join(head) + "\n# Summary\n" + "".join("# " + s + "\n" if not s.startswith("#") else s + "\n"
                                                            for s in summary.splitlines()) + "#\n" + "".join(raw))
    sys.stdout.write(summary)


if __name__ == "__main__":
    main()
