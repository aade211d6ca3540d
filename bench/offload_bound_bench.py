#!/usr/bin/env python3
"""Where an offloaded ZeRO 3 step's time goes, and the bound an exact step cannot beat (docs/offload.md, "The
exact step's bound"); with the delayed update's speed-up against the exact offloaded run at the same sizes.

For each width C (GPT, L layers, V=8192, T=256, --batch 4, one rank, one thread) trains, alternating, --rounds
times: in memory (ZeRO 3), --offload optimizer,params and optimizer,params,grads (ZeRO 3), each also with
--overlap-update (the exact update on its own thread, each group's next forward waiting for its own shard's
update; kinds "... overlapped"), all traced; and
--offload optimizer exact and with --delayed-update --overlap-update (ZeRO 0: the overlapped update is built
for ZeRO 0/1 only). From each traced run, per steady step (the steps after the first two): forward F and
backward B (from the first to the last of the compute track's spans of each), the optimizer step U; from --summary each file's bytes read and written
per step and the rates its reads and writes reached.

The bound of an exact step: the update needs the global gradient norm, so nothing of the update can start
before the backward ends; what must move after it is the optimizer state's write-back, its reads beyond what
the tier's slots hold ahead (4 slots of one tile of each buffer), and, offloaded, the parameter shard's read and
write-back and the gradient shard's read. So
    step >= max(F + B + rest, I/O before the norm) + max(U, I/O after the norm)
with the in-memory run's F, B, U and rest (the step's remainder: loss, norm, clipping) as the compute, and I/O
seconds = bytes / the fastest rate any of the run's files reached (reads, writes, or the optimizer tier's reads
and writes together over its busy time): the disk is taken to move everything at its best single-file rate,
which makes this a lower bound only as far as the files running at once do not together exceed that rate (the
measured update phases show they sometimes do: U below the I/O after the norm). Reported: step / max(compute, I/O) (the issue's figure; I/O the files' read and write seconds summed
per step, as offload_shards_bench.py) and step / bound.

Prints uname -r, the CPU's vector ISA and the load. The machine may be shared: the rounds alternate, and the
medians over rounds are reported.
Usage: /usr/bin/python3 bench/offload_bound_bench.py [--meshtrain build/meshtrain] [--widths 256,384,512]
       [--rounds 2] [--steps 8] [--batch 4] [--kinds opt+params,opt+params+grads] [--out results.json]
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

from bench_util import write_shard
from offload_bench import isa

T, VOCAB = 256, 8192
SLOTS = 4  # offload::StateSwapper's default slots


def train(a, work, tag, width, extra, mt=None):
    summary, metrics, trace = (os.path.join(work, f"{x}_{tag}.json") for x in ("summary", "metrics", "trace"))
    cmd = [mt or a.meshtrain, "train", "--data", os.path.join(work, "data.bin"), "--seq-len", str(T), "--batch-size",
           str(a.batch), "--steps", str(a.steps), "--threads", str(a.threads), "--quiet", "--summary", summary,
           "--metrics", metrics, "--trace", trace, "--n-layer", str(a.layers), "--n-head", str(width // 64),
           "--n-embd", str(width), "--vocab-size", str(VOCAB), "--n-positions", str(T)] + extra
    load = os.getloadavg()[0]
    subprocess.run(cmd, check=True)
    rows = [json.loads(l) for l in open(metrics)]
    s = json.load(open(summary))
    s["load"] = load
    s["step_s"] = statistics.median(r["step_time_s"] for r in rows[2:])
    ev = json.load(open(trace))["traceEvents"]
    comp = sorted((e for e in ev if e.get("ph") == "X" and e["tid"] == 0), key=lambda e: e["ts"])
    ends = [e["ts"] + e["dur"] for e in comp if e["name"].startswith("optimizer step")]
    per = []  # (F, B, U) per step, in seconds
    for k in range(2, len(ends)):
        lo, hi = ends[k - 1], ends[k]
        win = [e for e in comp if lo <= e["ts"] < hi]
        # Extents: the group spans nest (GPT's tied embedding group stays open over the whole backward).
        def extent(prefix):
            x = [e for e in win if e["name"].startswith(prefix)]
            return (max(e["ts"] + e["dur"] for e in x) - min(e["ts"] for e in x)) / 1e6 if x else 0.0
        f, b, u = extent("forward"), extent("backward"), extent("optimizer step")
        per.append((f, b, u))
    # The overlapped update runs on a worker thread that traces nothing: no "optimizer step" spans to cut steps at.
    s["F"], s["B"], s["U"] = (statistics.median(p[i] for p in per) if per else float("nan") for i in range(3))
    os.remove(trace)
    return s


def files(s):
    o = s.get("offload") or {}
    out = []
    if o:
        out.append(dict(o, kind="optimizer"))
        out += o.get("shards", [])
    return out


def io_sum_s(s, steps):  # the files' read and write seconds per step, summed (offload_shards_bench.py's I/O time)
    return sum(f["read_s"] + f["write_s"] for f in files(s)) / steps


def bound(mem, off, steps, tile_bytes):
    fs = files(off)
    rate = max([f["read_bytes_per_s"] for f in fs] + [f["write_bytes_per_s"] for f in fs] +
               [f.get("bytes_per_busy_s", 0) for f in fs])
    by = {f["kind"]: f for f in fs}
    r = off["ranks"][0]
    shard = r["params_offloaded_bytes"] or r["grads_offloaded_bytes"]
    opt = by["optimizer"]
    state_read, state_written = opt["read_bytes"] / steps, opt["written_bytes"] / steps
    buffers = max(1, round(r["optimizer_offloaded_bytes"] / shard)) if shard else 2
    after = state_written + max(0.0, state_read - SLOTS * buffers * tile_bytes)
    if "parameters" in by:
        after += 2 * shard  # the update reads the parameter shard and writes it back
    if "gradients" in by:
        after += shard  # and reads the gradient shard
    total = sum(f["read_bytes"] + f["written_bytes"] for f in fs) / steps
    rest = mem["step_s"] - mem["F"] - mem["B"] - mem["U"]
    before_s = max(mem["F"] + mem["B"] + rest, (total - after) / rate)
    after_s = max(mem["U"], after / rate)
    return {"rate_MBps": rate / 1e6, "bytes_after_norm_MB": after / 1e6, "bytes_total_MB": total / 1e6,
            "io_after_norm_s": after / rate, "before_s": before_s, "after_s": after_s, "bound_s": before_s + after_s}


def parse_bytes(v):
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(v[:-1]) * m[v[-1]]) if v[-1] in m else int(v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", default="build/meshtrain")
    ap.add_argument("--dir", default="")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--kinds", default="", help="comma-separated subset of the runs (default: all)")
    ap.add_argument("--widths", default="256,384,512")
    ap.add_argument("--tile", default="8M")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="")
    ap.add_argument("--base", default="", help="a second binary: adds the kind 'opt+params overlapped base' (A/B)")
    ap.add_argument("--base2", default="", help="a third binary: adds 'opt+params overlapped base2' (A/B/C)")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="offload_bound_bench_")
    odir = a.dir or tempfile.mkdtemp(prefix="offload_dir_", dir="/var/tmp")
    write_shard(os.path.join(work, "data.bin"), 200000, VOCAB)
    host = {"host_kernel": platform.release(), "isa": isa(), "cpus": os.cpu_count(), "layers": a.layers,
            "tile": a.tile, "batch": a.batch, "steps": a.steps, "rounds": a.rounds, "threads": a.threads}
    print(f"host: kernel {host['host_kernel']}, ISA {host['isa']}, {host['cpus']} CPUs, load "
          f"{os.getloadavg()[0]:.1f}; offload dir {odir}; {a.layers} layers, T={T}, batch {a.batch}, tile {a.tile}")
    off = ["--offload-dir", odir, "--offload-tile", a.tile]
    kinds = {"memory": ["--zero", "3"],
             "opt+params": ["--zero", "3", "--offload", "optimizer,params"] + off,
             "opt+params+grads": ["--zero", "3", "--offload", "optimizer,params,grads"] + off,
             # The exact update on its own thread, each group's next forward waiting for its own shard's update
             # (--overlap-update at ZeRO 3; parallel/data/zero_stage.cpp): the same bits as the two above.
             "opt+params overlapped": ["--zero", "3", "--offload", "optimizer,params", "--overlap-update"] + off,
             "opt+params+grads overlapped": ["--zero", "3", "--offload", "optimizer,params,grads",
                                             "--overlap-update"] + off,
             "opt exact": ["--zero", "0", "--offload", "optimizer"] + off,
             "opt delayed overlapped": ["--zero", "0", "--offload", "optimizer", "--delayed-update",
                                        "--overlap-update"] + off}
    bases = {"opt+params overlapped base": a.base, "opt+params overlapped base2": a.base2}
    for k, b in bases.items():  # the same run with another binary, alternating with this one's in every round
        if b:
            kinds[k] = kinds["opt+params overlapped"]
    if a.kinds:
        kinds = {k: v for k, v in kinds.items() if k in a.kinds.split(",") or k == "memory" or bases.get(k)}
    results = []
    try:
        for w in [int(x) for x in a.widths.split(",")]:
            got = {k: [] for k in kinds}
            for _ in range(a.rounds):
                for k, extra in kinds.items():
                    got[k].append(train(a, work, k.replace(" ", "_").replace("+", "_"), w, extra, bases.get(k)))
            med = {k: sorted(v, key=lambda s: s["step_s"])[len(v) // 2] for k, v in got.items()}
            mem = med["memory"]
            row = {"width": w, "params": mem["params"], "loads": [s["load"] for v in got.values() for s in v],
                   "step_s": {k: [s["step_s"] for s in v] for k, v in got.items()},
                   "phases_s": {k: {"F": s["F"], "B": s["B"], "U": s["U"], "step": s["step_s"]} for k, s in med.items()}}
            print(f"width {w} ({mem['params'] / 1e6:.1f}M params), loads {min(row['loads']):.1f}-{max(row['loads']):.1f}; "
                  f"memory: step {mem['step_s']:.3f} s (F {mem['F']:.3f}, B {mem['B']:.3f}, U {mem['U']:.3f})")
            for k in [k for k in ("opt+params", "opt+params overlapped", "opt+params overlapped base",
                                  "opt+params overlapped base2", "opt+params+grads", "opt+params+grads overlapped")
                      if k in med]:
                s = med[k]
                b = bound(mem, s, a.steps, parse_bytes(a.tile))
                io = io_sum_s(s, a.steps)
                row[k] = dict(b, io_sum_s=io, step_over_max_compute_io=s["step_s"] / max(mem["step_s"], io),
                              step_over_bound=s["step_s"] / b["bound_s"], step_over_memory=s["step_s"] / mem["step_s"],
                              overlap_update=s.get("overlap_update"),
                              per_round_over_memory=[x["step_s"] / m["step_s"] for x, m in zip(got[k], got["memory"])],
                              per_round_over_max_compute_io=[x["step_s"] / max(m["step_s"], io_sum_s(x, a.steps))
                                                             for x, m in zip(got[k], got["memory"])],
                              per_round_load=[x["load"] for x in got[k]],
                              per_round_waited_s=[(x.get("overlap_update") or {}).get("waited_s") for x in got[k]],
                              per_round_waited_first_s=[(x.get("overlap_update") or {}).get("waited_first_s")
                                                        for x in got[k]])
                print(f"  {k:<27} step {s['step_s']:.3f} s (F {s['F']:.3f}, B {s['B']:.3f}, U {s['U']:.3f}); I/O "
                      f"{b['bytes_total_MB']:.0f} MB/step, {b['bytes_after_norm_MB']:.0f} MB after the norm, best rate "
                      f"{b['rate_MBps']:.0f} MB/s; bound {b['before_s']:.3f} + {b['after_s']:.3f} = {b['bound_s']:.3f} s; "
                      f"step / max(compute, I/O {io:.3f}) = {row[k]['step_over_max_compute_io']:.2f}, "
                      f"step / bound = {row[k]['step_over_bound']:.2f}, step / in memory = "
                      f"{row[k]['step_over_memory']:.2f}" + (f"; waited {s['overlap_update']['waited_s']:.2f} s"
                                                             if s.get("overlap_update") else ""))
                print("    per round: " + "; ".join(
                    f"{r:.2f} (load {l:.1f}" + (f", waited {wt:.2f} s" if wt is not None else "") +
                    (f", first group {wf:.3f} s)" if wf is not None else ")")
                    for r, l, wt, wf in zip(row[k]["per_round_over_max_compute_io"], row[k]["per_round_load"],
                                            row[k]["per_round_waited_s"], row[k]["per_round_waited_first_s"])),
                      flush=True)
            if "opt exact" not in med or "opt delayed overlapped" not in med:
                results.append(row)
                continue
            ex, dl = med["opt exact"], med["opt delayed overlapped"]
            pairs = [d["step_s"] / e["step_s"] for e, d in zip(got["opt exact"], got["opt delayed overlapped"])]
            row["dpu"] = {"exact_step_s": ex["step_s"], "overlapped_step_s": dl["step_s"],
                          "overlapped_over_exact_median": dl["step_s"] / ex["step_s"], "per_round": pairs,
                          "exact_phases": {"F": ex["F"], "B": ex["B"], "U": ex["U"]},
                          "overlapped_phases": {"F": dl["F"], "B": dl["B"], "U": dl["U"]},
                          "overlap_update": dl.get("overlap_update"),
                          "io_sum_s_exact": io_sum_s(ex, a.steps)}
            print(f"  DPU (ZeRO 0, --offload optimizer): exact {ex['step_s']:.3f} s (F {ex['F']:.3f}, B {ex['B']:.3f}, "
                  f"U {ex['U']:.3f}), delayed+overlapped {dl['step_s']:.3f} s (F {dl['F']:.3f}, B {dl['B']:.3f}, "
                  f"U {dl['U']:.3f}); overlapped / exact {dl['step_s'] / ex['step_s']:.3f} (rounds "
                  f"{', '.join(f'{x:.3f}' for x in pairs)}); {dl.get('overlap_update')}", flush=True)
            results.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not a.dir:
            shutil.rmtree(odir, ignore_errors=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(host, rows=results), f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
