"""Offloading never changes the math (issue 28's matrix; docs/offload.md), on a small GPT (L=2, C=32, V=64, B=8,
T=16; 4 KiB offload tiles, so segments are cut at tile boundaries; small buckets, so a rank's shards are several):
  1. Each kind alone and all combined -- --offload optimizer, params, grads, --offload-activations, and every
     one of them at once -- for each layout: nproc 1 with ZeRO 0, 1, 2 and 3; dp 2 with ZeRO 0, 1, 2, 3; dp 2 with 2
     micro-batches at ZeRO 0, 1, 2 (gradients accumulate through the file); dp 2 ZeRO 1 with bf16 products;
     tp 2 and pp 2 at ZeRO 0 and at ZeRO 2; an MoE model with 4 experts over ep 2 at ZeRO 0 and 1. Each run gives the same losses, gradient norms and learning rates
     (every metrics row) and the same final weights (--save bytes) as the same layout in memory.
  2. Resume across the tiers: a run with optimizer,params,grads offloaded to step 2, resumed in memory to step
     4, resumed offloaded to step 6, ends byte-equal to the uninterrupted in-memory run (dp 2 at ZeRO 0, 1, 2).
  3. --summary at the new stages: params alone at ZeRO 1 (dp 2) offloads the full parameters (4 bytes per
     parameter), keeps no float32 parameter buffer and keeps the optimizer state resident (nothing of it
     offloaded); grads at ZeRO 2 offloads the rank's gradient shard, at ZeRO 0 the full gradient, and keeps no
     resident gradient, and at ZeRO 2 the gradient file is read once per step (the norm does not read it back);
     the summary's offload section lists the files; nothing is left in --offload-dir.
  4. Refused with both flags named: --offload grads with --delayed-update (two resident versions).
  5. The budget at ZeRO 0 (nproc 1, L=8, C=384: 54.6 MiB of float32 parameters): the --memory-limit plan (read
     from the refusal a 1K limit gives) of optimizer,params counts no resident parameters and is at least 10 MiB
     below optimizer alone's (the 54.6 MiB of parameters less the parameter file's staging, its 3 group slots of
     a block's 6.8 MiB and its 4 update tiles, all in the plan); with the limit 1 MiB below optimizer alone's plan, that run is refused at start
     and the optimizer,params run trains with its measured peak RSS under the limit.
"""
from __future__ import annotations

import argparse
import filecmp
import json
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_offload import Env, check, rows, FAILS  # noqa: E402

SMALL_BUCKETS = ["--bucket-mb", 0.004]


def layouts():
    z = lambda k: ["--zero", k] + SMALL_BUCKETS  # noqa: E731
    return {
        "dp1_z0": ["--nproc", 1] + z(0),
        "dp1_z1": ["--nproc", 1] + z(1),
        "dp1_z2": ["--nproc", 1] + z(2),
        "dp1_z3": ["--nproc", 1] + z(3),
        "dp2_z0": ["--nproc", 2] + z(0),
        "dp2_z1": ["--nproc", 2] + z(1),
        "dp2_z2": ["--nproc", 2] + z(2),
        "dp2_z3": ["--nproc", 2] + z(3),
        "dp2_z2_mb2": ["--nproc", 2, "--micro-batch-size", 2] + z(2),
        "dp2_z0_mb2": ["--nproc", 2, "--micro-batch-size", 2] + z(0),
        "dp2_z1_mb2": ["--nproc", 2, "--micro-batch-size", 2] + z(1),
        "dp2_z1_bf16": ["--nproc", 2, "--precision", "bf16"] + z(1),
        "tp2_z0": ["--nproc", 2, "--tp", 2] + z(0),
        "tp2_z2": ["--nproc", 2, "--tp", 2] + z(2),
        "pp2_z0": ["--nproc", 2, "--pp", 2, "--micro-batch-size", 2] + z(0),
        "pp2_z2": ["--nproc", 2, "--pp", 2, "--micro-batch-size", 2] + z(2),
        # Experts over ep 2 (their buckets reduced over the expert-replica group, here the rank alone).
        "moe_ep2_z0": ["--nproc", 2, "--moe-every", 1, "--experts", 4, "--ep", 2] + z(0),
        "moe_ep2_z1": ["--nproc", 2, "--moe-every", 1, "--experts", 4, "--ep", 2] + z(1),
    }


def zero_of(flags) -> int:
    return int(flags[flags.index("--zero") + 1])


def kinds_for(flags):
    """name -> (--offload kinds or None, --offload-activations)"""
    return {"optimizer": ("optimizer", False), "params": ("params", False), "grads": ("grads", False),
            "activations": (None, True), "all": ("optimizer,params,grads", True)}


def off(e: Env, kinds, acts: bool):
    f = ["--offload", kinds] if kinds else []
    if acts:
        f.append("--offload-activations")
    return f + ["--offload-dir", e.odir, "--offload-tile", "4096"]


def equality(e: Env, only) -> None:
    for name, flags in layouts().items():
        if only and name not in only:
            continue
        m = os.path.join(e.wd, f"{name}.memory.jsonl")
        w = os.path.join(e.wd, f"{name}.memory.safetensors")
        r = e.run(flags + ["--metrics", m, "--save", w])
        check(r.returncode == 0, f"{name} in memory: exit 0 {r.stderr.strip()[-300:] if r.returncode else ''}")
        if r.returncode != 0:
            continue
        a = rows(m)
        for kind, (kinds, acts) in kinds_for(flags).items():
            m2 = os.path.join(e.wd, f"{name}.{kind}.jsonl")
            w2 = os.path.join(e.wd, f"{name}.{kind}.safetensors")
            r = e.run(flags + off(e, kinds, acts) + ["--metrics", m2, "--save", w2])
            check(r.returncode == 0, f"{name} {kind}: exit 0 {r.stderr.strip()[-300:] if r.returncode else ''}")
            check(os.listdir(e.odir) == [], f"{name} {kind}: nothing left in --offload-dir")
            if r.returncode != 0:
                continue
            b = rows(m2)
            check(len(a) == 6 and a == b, f"{name} {kind}: every row's loss, grad norm and lr equal bit for bit "
                                          f"({len(a)} steps)")
            check(filecmp.cmp(w, w2, shallow=False), f"{name} {kind}: final weights byte-equal")


def resume(e: Env) -> None:
    for zero in (0, 1, 2):
        flags = ["--nproc", 2, "--zero", zero] + SMALL_BUCKETS
        every = "optimizer,params,grads"
        full = os.path.join(e.wd, f"chain_z{zero}.full.safetensors")
        check(e.run(flags + ["--save", full]).returncode == 0, f"z{zero}: uninterrupted in-memory run")
        ck = os.path.join(e.wd, f"ck_chain_z{zero}")
        shutil.rmtree(ck, ignore_errors=True)
        o = off(e, every, False)
        legs = ((o, [], 2, "offloaded to step 2"), ([], ["--resume", ck], 4, "in memory to step 4"),
                (o, ["--resume", ck], None, "offloaded to the end"))
        w = os.path.join(e.wd, f"chain_z{zero}.safetensors")
        ok = True
        for tier, res, stop, tag in legs:
            extra = flags + tier + res + ["--checkpoint-dir", ck, "--save-every", 2]
            extra += ["--stop-at-step", stop] if stop else ["--save", w]
            r = e.run(extra)
            ok = ok and r.returncode == 0
            check(r.returncode == 0, f"z{zero} chain, {tag}: exit 0 {r.stderr.strip()[-300:] if r.returncode else ''}")
            check(os.listdir(e.odir) == [], f"z{zero} chain, {tag}: nothing left in --offload-dir")
        check(ok and os.path.exists(w) and filecmp.cmp(full, w, shallow=False),
              f"z{zero}: offloaded -> in memory -> offloaded ends byte-equal to the uninterrupted run")


def summaries(e: Env) -> None:
    s = os.path.join(e.wd, "params_z1.summary.json")
    r = e.run(["--nproc", 2, "--zero", 1] + SMALL_BUCKETS + off(e, "params", False) + ["--summary", s])
    check(r.returncode == 0, f"params at ZeRO 1: exit 0 {r.stderr.strip()[-300:] if r.returncode else ''}")
    if r.returncode == 0:
        j = json.load(open(s))
        for rank in j["ranks"]:
            check(rank["params_offloaded_bytes"] == 4 * j["params"] and rank["param_bytes"] == 0,
                  f"params at ZeRO 1, rank {rank['rank']}: {rank['params_offloaded_bytes']} bytes of parameters "
                  f"offloaded (= 4 x {j['params']}), {rank['param_bytes']} resident")
            check(rank.get("optimizer_offloaded_bytes", 0) == 0 and rank.get("grads_offloaded_bytes", 0) == 0,
                  f"params at ZeRO 1, rank {rank['rank']}: optimizer state and gradients resident")
        kinds = [x["kind"] for x in j["offload"]["shards"]]
        check(kinds == ["parameters"], f"params at ZeRO 1: summary offload section lists {kinds}")
    s = os.path.join(e.wd, "grads_z2.summary.json")
    r = e.run(["--nproc", 2, "--zero", 2] + SMALL_BUCKETS + off(e, "grads", False) + ["--summary", s])
    check(r.returncode == 0, f"grads at ZeRO 2: exit 0 {r.stderr.strip()[-300:] if r.returncode else ''}")
    if r.returncode == 0:
        j = json.load(open(s))
        total = sum(rank["grads_offloaded_bytes"] for rank in j["ranks"])
        for rank in j["ranks"]:
            check(rank["grad_bytes"] == 0 and rank["grads_offloaded_bytes"] > 0,
                  f"grads at ZeRO 2, rank {rank['rank']}: {rank['grads_offloaded_bytes']} bytes of its gradient shard "
                  f"offloaded, {rank['grad_bytes']} resident")
            check(rank.get("params_offloaded_bytes", 0) == 0 and rank["param_bytes"] == 4 * j["params"],
                  f"grads at ZeRO 2, rank {rank['rank']}: parameters resident ({rank['param_bytes']} bytes)")
        check(total == 4 * j["params"], f"grads at ZeRO 2: the ranks' shards add up to every parameter ({total} bytes)")
        # The gradient file is read once per step, by the update: the global norm uses the segments' norms taken
        # as each bucket's shard was written (parallel/data/segment_norms.h), not a second read of the shard.
        for x in j["offload"]["shards"]:
            if x["kind"] == "gradients":
                check(x["read_bytes"] == 6 * x["file_bytes"],
                      f"grads at ZeRO 2: gradient file read {x['read_bytes']} bytes in 6 steps = 6 x its "
                      f"{x['file_bytes']} bytes")
    s = os.path.join(e.wd, "grads_z0.summary.json")
    r = e.run(["--nproc", 2, "--zero", 0] + SMALL_BUCKETS + off(e, "grads", False) + ["--summary", s])
    check(r.returncode == 0, f"grads at ZeRO 0: exit 0 {r.stderr.strip()[-300:] if r.returncode else ''}")
    if r.returncode == 0:
        j = json.load(open(s))
        for rank in j["ranks"]:
            check(rank["grad_bytes"] == 0 and rank["grads_offloaded_bytes"] == 4 * j["params"],
                  f"grads at ZeRO 0, rank {rank['rank']}: the full gradient offloaded "
                  f"({rank['grads_offloaded_bytes']} bytes), {rank['grad_bytes']} resident")
    check(os.listdir(e.odir) == [], "summaries: nothing left in --offload-dir")


def refused(e: Env) -> None:
    for zero in (0, 1):
        r = e.run(["--zero", zero] + off(e, "optimizer,grads", False) + ["--delayed-update"], 2, expect_ok=False)
        want = "--offload grads with --delayed-update"
        check(r.returncode != 0 and want in r.stderr, f"grads at ZeRO {zero} with --delayed-update: refused naming "
                                                      f"'{want}' (exit {r.returncode}: {r.stderr.strip()[-200:]})")
    check(os.listdir(e.odir) == [], "refused: nothing left in --offload-dir")


def budget(e: Env) -> None:
    wide = ["--nproc", 1, "--zero", 0, "--n-layer", 8, "--n-embd", 384]
    plans = {}
    for kinds in ("optimizer", "optimizer,params"):
        r = e.run(wide + ["--offload", kinds, "--offload-dir", e.odir, "--memory-limit", "1K"], 2, expect_ok=False)
        m = re.search(r"parameters ([0-9.]+) MiB.* = ([0-9.]+) MiB", r.stderr)
        check(r.returncode != 0 and m is not None, f"budget {kinds}: the 1K limit names the plan ({r.stderr.strip()[-200:]})")
        if m:
            plans[kinds] = (float(m.group(1)), float(m.group(2)))
    check(os.listdir(e.odir) == [], "budget: nothing left in --offload-dir")
    if len(plans) != 2:
        return
    (p_opt, t_opt), (p_par, t_par) = plans["optimizer"], plans["optimizer,params"]
    check(p_opt > 50 and p_par == 0 and t_opt - t_par >= 10,
          f"budget: plan {t_opt} MiB (parameters {p_opt} resident) -> {t_par} MiB with params offloaded (parameters {p_par})")
    limit = f"{int(t_opt - 1)}M"
    r = e.run(wide + ["--offload", "optimizer", "--offload-dir", e.odir, "--memory-limit", limit], 2, expect_ok=False)
    check(r.returncode != 0 and "--memory-limit" in r.stderr, f"budget: optimizer alone refused under {limit}")
    s = os.path.join(e.wd, "budget.summary.json")
    r = e.run(wide + ["--offload", "optimizer,params", "--offload-dir", e.odir, "--memory-limit", limit,
                      "--summary", s], 2)
    check(r.returncode == 0, f"budget: optimizer,params under {limit}: exit 0 {r.stderr.strip()[-300:] if r.returncode else ''}")
    if r.returncode == 0:
        rank = json.load(open(s))["ranks"][0]
        check(rank.get("within_memory_limit") is True,
              f"budget: measured peak RSS {rank['peak_rss_bytes'] / 2**20:.1f} MiB under {limit}")
    check(os.listdir(e.odir) == [], "budget: nothing left in --offload-dir")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--only", default="", help="comma-separated parts: equality,resume,summaries,refused,budget")
    ap.add_argument("--layouts", default="", help="comma-separated layouts of the equality part (default: all)")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    e = Env(a.meshtrain, a.workdir)
    lay = [x for x in a.layouts.split(",") if x]
    parts = {"equality": lambda e: equality(e, lay), "resume": resume, "summaries": summaries, "refused": refused,
             "budget": budget}
    for name, fn in parts.items():
        if not a.only or name in a.only.split(","):
            fn(e)
    print(f"{len(FAILS)} failed")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
