"""The --memory-limit plan counts the offload engine's own buffers (docs/offload.md, "Memory budget"), on the small
GPT of test_offload.py at nproc 1 with ZeRO 3 (one rank: its shards are the whole model):
  1. With optimizer,params offloaded and 64 KiB tiles, --summary's memory_plan.io_buffers is, byte for byte, the
     parameter file's staging (8 blocks of the 64 KiB I/O block and two 4096-byte edge blocks, with direct I/O;
     none through the page cache) plus the update's two tile buffers of parameters (64 KiB each, or the shard's
     bytes rounded up to 4096 when smaller, each with 4096 bytes of slack to place the tile congruent with the file), computed here from the flags and the model's size; the staging the
     initial write already used is reported as held (io_buffers_in_now), and the plan's total is the process
     now + the optimizer's resident part + the buffers not held yet + one micro-batch's activations + the
     backward's scratch + ZeRO's transient bucket buffers + the allowance (test_offload_budget.py checks those).
  2. With optimizer,params,grads and activations offloaded (default 1 MiB tiles): a --memory-limit half way
     between the plan's other parts (the process now, the optimizer's resident part, the activations, the
     backward scratch, the transient buckets, the allowance; summed here) and those plus the buffers not held yet is refused at start, the message naming the offload I/O
     buffers; a limit 8 MiB above the plan trains. (Mutations: leaving the buffers out of the plan's total makes
     the first run start; leaving the tile buffers out of io_buffers fails part 1.)
  3. ZeRO 0, --offload params,grads (the optimizer state in memory, walked in tiles of --offload-tile), on the
     GPT widened to C=128 with one bucket: io_buffers is, byte for byte, each file's staging plus the buffers of
     the two files computed here from the flags and the model's shape: 3 parameter slots and 2 gradient slots of
     the largest group (a block: 12 C^2 + 13 C floats), the update's 4 tiles (parameters and gradients, two
     each, of the 1 MiB tile), and the norm's one buffer of the bucket (every parameter); a --memory-limit half
     way between the plan without those buffers and with them is refused, one 8 MiB above the plan trains.
     (Mutation: ParamsInFile's term left out fails both.) With grads alone, io_buffers at ZeRO 0 (2 slots, the
     bucket's buffer, 2 gradient tiles) and at ZeRO 2 (the norm's 2 read-ahead buffers of a block, 2 gradient tiles) too.
The figures the refusal compares come from a first run's --summary (the process's size before the first step
moves by well under a MiB between runs of one binary with the same flags; the margin either side is 4 MiB or
more).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_offload import Env, check, FAILS  # noqa: E402

MiB = 1 << 20
Z3 = ["--nproc", 1, "--zero", 3, "--bucket-mb", 0.004]


def summary(e: Env, name: str, extra):
    s = os.path.join(e.wd, f"{name}.summary.json")
    r = e.run(Z3 + extra + ["--summary", s, "--memory-limit", "4G"], steps=2)
    check(r.returncode == 0, f"{name}: exit 0 {r.stderr.strip()[-300:] if r.returncode else ''}")
    return json.load(open(s)) if r.returncode == 0 else None


def exact_figure(e: Env) -> None:
    tile = 64 * 1024
    j = summary(e, "params", ["--offload", "optimizer,params", "--offload-dir", e.odir, "--offload-tile", tile])
    if j is None:
        return
    plan = j["memory_plan"]
    files = j["offload"]["shards"]
    check([f["kind"] for f in files] == ["parameters"], f"one shard file, the parameters: {[f['kind'] for f in files]}")
    f = files[0]
    block = min(tile, MiB)
    # io_uring keeps 8 blocks in flight; the psync fallback one (block_io.h).
    depth = 8 if f["engine"] == "io_uring" else 1
    staging = depth * block + 2 * 4096 if f["direct_io"] else 0
    shard_bytes = 4 * j["params"]  # one rank: the whole model
    T_bytes = min(tile, (shard_bytes + 4095) // 4096 * 4096)
    # Each tile buffer has 4096 bytes of slack to place the tile at its file offset modulo 4096 (congruent_pad).
    want = staging + 2 * (T_bytes + 4096)
    check(plan["io_buffers"] == want,
          f"io_buffers {plan['io_buffers']} = staging {staging} (direct {f['direct_io']}, {f['engine']}) + 2 tiles of "
          f"{T_bytes} + 4096 = {want}")
    check(plan["io_buffers_in_now"] == staging,
          f"the staging used by the initial write is held at plan time: {plan['io_buffers_in_now']} = {staging}")
    total = (plan["now"] + plan["optimizer"] + plan["io_buffers"] - plan["io_buffers_in_now"] + plan["activations"]
             + plan["backward_scratch"] + plan["zero_transient"] + plan["allowance"])
    check(abs(plan["total"] - total) < 1, f"total {plan['total']} = now + optimizer + buffers not held + activations "
          f"+ backward scratch + ZeRO transient buckets + allowance {total}")
    check(os.listdir(e.odir) == [], "nothing left in --offload-dir")


def refusal(e: Env) -> None:
    extra = ["--offload", "optimizer,params,grads", "--offload-activations", "--offload-dir", e.odir]
    j = summary(e, "all", extra)
    if j is None:
        return
    plan = j["memory_plan"]
    pending = plan["io_buffers"] - plan["io_buffers_in_now"]
    direct = all(f["direct_io"] for f in j["offload"]["shards"])
    # Direct I/O: the gradient and activation files' staging (8 MiB + 8 KiB each) is not used before the first step.
    check(not direct or pending >= 16 * MiB, f"buffers not held at plan time {pending / MiB:.2f} MiB >= 16 MiB")
    if pending < 8 * MiB:
        return
    # The plan's other parts, summed here (not the plan's own total, which is what is checked).
    base = (plan["now"] + plan["optimizer"] + plan["activations"] + plan["backward_scratch"] + plan["zero_transient"]
            + plan["allowance"])
    limit = int(base + pending / 2)
    r = e.run(Z3 + extra + ["--memory-limit", limit], steps=2, expect_ok=False)
    check(r.returncode != 0 and "too small" in r.stderr and "offload I/O buffers" in r.stderr,
          f"a limit of the other parts + {pending / 2 / MiB:.1f} MiB is refused naming the offload I/O buffers "
          f"(exit {r.returncode}: {r.stderr.strip()[-400:]})")
    r = e.run(Z3 + extra + ["--memory-limit", int(base + pending + 8 * MiB)], steps=2)
    check(r.returncode == 0, f"a limit of the plan + 8 MiB trains (exit {r.returncode})")
    check(os.listdir(e.odir) == [], "nothing left in --offload-dir")


def zero0(e: Env) -> None:
    C, L, V, T = 128, 2, 64, 16  # --n-embd here; the other sizes test_offload.Env's
    P = max(256, T)  # wpe's rows: --n-positions' default
    tile = MiB  # --offload-tile's default
    flags = ["--nproc", 1, "--zero", 0, "--bucket-mb", 64, "--n-embd", C]
    extra = ["--offload", "params,grads", "--offload-dir", e.odir]
    s = os.path.join(e.wd, "zero0.summary.json")
    r = e.run(flags + extra + ["--summary", s, "--memory-limit", "4G"], steps=2)
    check(r.returncode == 0, f"zero0: exit 0 {r.stderr.strip()[-300:] if r.returncode else ''}")
    if r.returncode != 0:
        return
    j = json.load(open(s))
    plan = j["memory_plan"]
    block = 12 * C * C + 13 * C  # ln1, qkv, attention projection, ln2, fc, fc projection (weights and biases)
    n = V * C + P * C + L * block + 2 * C  # wte (tied head), wpe, the blocks, ln_f
    check(j["params"] == n, f"the model has {j['params']} parameters = {n} (the shape the figure is computed from)")
    files = j["offload"]["shards"]
    check(sorted(f["kind"] for f in files) == ["gradients", "parameters"], f"two files: {[f['kind'] for f in files]}")
    staging = 0
    for f in files:
        depth = 8 if f["engine"] == "io_uring" else 1
        staging += depth * min(tile, MiB) + 2 * 4096 if f["direct_io"] else 0
    buffers = 4 * (3 * block + 2 * block + 4 * (tile // 4) + n)
    want = staging + buffers
    check(plan["io_buffers"] == want,
          f"io_buffers {plan['io_buffers']} = staging {staging} + slots, tiles and the bucket's buffer {buffers} = {want}")
    # The limit from the figure computed here (not the plan's io_buffers): a plan without the buffers lets it start.
    base = (plan["now"] + plan["optimizer"] + plan["activations"] + staging - plan["io_buffers_in_now"]
            + plan["backward_scratch"] + plan["zero_transient"] + plan["allowance"])
    limit = int(base + buffers / 2)
    r = e.run(flags + extra + ["--memory-limit", limit], steps=2, expect_ok=False)
    check(r.returncode != 0 and "too small" in r.stderr and "offload I/O buffers" in r.stderr,
          f"a limit {buffers / 2 / MiB:.1f} MiB above the plan without the files' buffers, "
          f"{buffers / 2 / MiB:.1f} MiB below it with them, is refused (exit {r.returncode}: {r.stderr.strip()[-400:]})")
    r = e.run(flags + extra + ["--memory-limit", int(base + buffers + 8 * MiB)], steps=2)
    check(r.returncode == 0, f"a limit of the plan + 8 MiB trains (exit {r.returncode})")
    check(os.listdir(e.odir) == [], "nothing left in --offload-dir")
    # grads alone: ZeRO 0 (2 slots, the bucket's buffer, the update's 2 gradient tiles) and ZeRO 2 (the norm's
    # two read-ahead buffers of the largest bucket shard and the 2 gradient tiles; ZeRO 2's buckets never span
    # two groups, so at nproc 1 the largest is a block, at a multiple of 16 floats: 40960 + k block).
    # At ZeRO 2 each of those buffers also has 4096 bytes of slack to sit congruent with the file (congruent_pad).
    slack = 4096 // 4
    for zero, floats in ((0, 2 * block + n + 2 * (tile // 4)), (2, 2 * (block + slack) + 2 * (tile // 4 + slack))):
        s = os.path.join(e.wd, f"grads{zero}.summary.json")
        g = ["--nproc", 1, "--zero", zero, "--bucket-mb", 64, "--n-embd", C]
        r = e.run(g + ["--offload", "grads", "--offload-dir", e.odir, "--summary", s, "--memory-limit", "4G"], steps=2)
        check(r.returncode == 0, f"grads at ZeRO {zero}: exit 0 {r.stderr.strip()[-300:] if r.returncode else ''}")
        if r.returncode != 0:
            continue
        j = json.load(open(s))
        (f,) = j["offload"]["shards"]
        staging = (8 if f["engine"] == "io_uring" else 1) * min(tile, MiB) + 2 * 4096 if f["direct_io"] else 0
        want = staging + 4 * floats
        check(j["memory_plan"]["io_buffers"] == want,
              f"grads at ZeRO {zero}: io_buffers {j['memory_plan']['io_buffers']} = staging {staging} + {4 * floats} = {want}")
    check(os.listdir(e.odir) == [], "nothing left in --offload-dir")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    e = Env(a.meshtrain, a.workdir)
    exact_figure(e)
    refusal(e)
    zero0(e)
    print(f"{len(FAILS)} failed")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
