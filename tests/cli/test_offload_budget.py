"""The --memory-limit plan does not undercount (docs/offload.md, "Memory budget"): for a handful of layouts of a GPT
(2 layers; widths 128-256, vocabulary 256-8192, T 64-128, batch 4-8; ZeRO 0-3; offload none, optimizer,
optimizer+params, optimizer+params+grads; one rank and dp 2; float32 and bf16 products), a first run's --summary gives the plan's total
(memory_plan.total, the lead rank's); the same run again with --memory-limit set to that figure (plus 1 MiB, as
the process's size at plan time moves by a fraction of a MiB between runs and a plan above the limit is
refused) trains, and every rank's measured peak RSS is at most the first run's plan total.
The shapes make each of the plan's newer terms count: the backward's scratch (10 N C floats: 10 MiB at N 1024,
C 256) and ZeRO 2/3's transient bucket buffers (at ZeRO 3 with params offloaded on one rank, 7 buffers of a
block or more). Mutations (checked when the test was written): the transient term left out of the total fails
the three ZeRO 3 cases (one rank in memory and offloaded, dp 2 offloaded: peak 142.4 > 119.9 MiB, 107.1 > 103.3,
144.8 > 132.3); the backward scratch left out fails the two ZeRO 3 cases on one rank (142.5 > 137.3, 144.8 > 139.6);
the bf16 products' operand copies left out fail the bf16 case (V 8192 there: 186.6 > 179.2).
The allowance is what the other cases' margins come from: 16 MiB on one rank, 32 MiB at dp 2 (what no term names).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_offload import Env, check, FAILS  # noqa: E402

MiB = 1 << 20


def shape(C: int, V: int, T: int, B: int):
    return ["--n-embd", C, "--n-head", C // 64, "--vocab-size", V, "--seq-len", T, "--n-positions", T,
            "--batch-size", B]


CASES = {
    "zero3 optimizer,params dp1": ["--nproc", 1, "--zero", 3, "--offload", "optimizer,params"] + shape(256, 4096, 128, 8),
    "zero3 optimizer,params,grads dp2": ["--nproc", 2, "--zero", 3, "--offload", "optimizer,params,grads"]
    + shape(256, 4096, 128, 8),
    "zero2 in memory dp2": ["--nproc", 2, "--zero", 2] + shape(256, 4096, 128, 8),
    "zero0 optimizer dp1": ["--nproc", 1, "--zero", 0, "--offload", "optimizer"] + shape(128, 256, 64, 4),
    "zero1 optimizer,params,grads dp1": ["--nproc", 1, "--zero", 1, "--offload", "optimizer,params,grads"]
    + shape(256, 4096, 128, 8),
    "zero3 in memory dp1": ["--nproc", 1, "--zero", 3] + shape(256, 4096, 128, 8),
    "zero3 optimizer,params bf16 dp1": ["--nproc", 1, "--zero", 3, "--offload", "optimizer,params", "--precision",
                                        "bf16"] + shape(256, 8192, 128, 8),
}


def case(e: Env, name: str, flags) -> None:
    tag = name.replace(" ", "_").replace(",", "+")
    if "--offload" in flags:
        flags = flags + ["--offload-dir", e.odir]
    s1 = os.path.join(e.wd, f"{tag}.plan.json")
    r = e.run(flags + ["--summary", s1, "--memory-limit", "8G"], steps=3)
    check(r.returncode == 0, f"{name}: first run exits 0 {r.stderr.strip()[-300:] if r.returncode else ''}")
    if r.returncode != 0:
        return
    plan = json.load(open(s1))["memory_plan"]
    figure = plan["total"]
    limit = int(figure) + MiB
    s2 = os.path.join(e.wd, f"{tag}.limit.json")
    r = e.run(flags + ["--summary", s2, "--memory-limit", limit], steps=3)
    check(r.returncode == 0, f"{name}: --memory-limit {limit} (the plan {figure / MiB:.1f} MiB + 1 MiB) trains "
          f"(exit {r.returncode} {r.stderr.strip()[-400:] if r.returncode else ''})")
    if r.returncode != 0:
        return
    j = json.load(open(s2))
    for m in j["ranks"]:
        peak = m["peak_rss_bytes"]
        check(peak <= figure and m["within_memory_limit"],
              f"{name}: rank {m['rank']} peak RSS {peak / MiB:.1f} MiB <= the plan {figure / MiB:.1f} MiB (scratch "
              f"{plan['backward_scratch'] / MiB:.1f}, bf16 products {plan['product_scratch'] / MiB:.1f}, ZeRO transient {plan['zero_transient'] / MiB:.1f}, allowance "
              f"{plan['allowance'] / MiB:.1f})")
    check(os.listdir(e.odir) == [], f"{name}: nothing left in --offload-dir")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    e = Env(a.meshtrain, a.workdir)
    for name, flags in CASES.items():
        case(e, name, flags)
    print(f"{len(FAILS)} failed")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
