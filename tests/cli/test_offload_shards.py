"""--offload params and --offload grads (docs/offload.md), end to end on a small GPT (L=2, C=32, V=64, B=8, T=16,
ZeRO 3 with small buckets, so a rank's shards are several buckets and the update's 4 KiB tiles cut them):
  1. The math does not change: each ZeRO 3 layout (nproc 1; dp 2; dp 2 with 2 micro-batches, so gradient shards
     accumulate through the file; tp 2; pp 2; bf16 products on dp 2; MoE experts over ep 2) trained with
     optimizer,params / optimizer,grads / optimizer,params,grads offloaded gives the same losses, gradient norms
     and final weights (--save bytes) as the same layout in memory.
  2. Checkpoints: an optimizer,params,grads run saved at step 3 of 6 resumes in memory and the other way round,
     each ending byte-equal to the uninterrupted in-memory run.
  3. --summary reports the parameter and gradient bytes offloaded (4 bytes per element of the rank's shard), no
     resident float32 parameter or gradient shard, and bytes read and written per step at least the shards'
     size, and the gradient file read once per step (the norm does not read it back); --trace has parameter
     and gradient reads and writes on the io track; nothing is left in --offload-dir.
  4. The budget: a GPT of 22.2M parameters (28 layers of width 256; 16 bytes per parameter of float32 weights,
     gradients and AdamW state = 338 MiB) trains 3 steps with optimizer,params,grads offloaded (--recompute,
     256 KiB tiles) under --memory-limit 80M, at least 4x below its training state: measured peak RSS under the
     limit (--summary within_memory_limit); the same run in memory, or with the optimizer state alone
     offloaded, is refused at start by the limit's plan.
  5. --offload-activations: each layout (nproc 1, with --recompute, 2 micro-batches, bf16, dp 2 ZeRO 3 with
     everything offloaded, tp 2, pp 2 1F1B, pp 2 zb-h1 (split backward), MoE ep 2) gives the same losses, norms
     and --save bytes as in memory; on a 6-layer model the measured activation peak (--summary
     activation_peak_bytes) falls, activations are read and written on the io track, nothing is left in DIR.
  6. Refused with a message naming both flags: params with --delayed-update; a full directory (a 64 KiB tmpfs) is refused at start naming it, leaving it empty; an
     activation file that fills its directory (a 16 KiB tmpfs) during the run stops it with an error naming the
     directory, leaving it empty.
"""
from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_offload import Env, check, rows, FAILS  # noqa: E402

KINDS = ("optimizer,params", "optimizer,grads", "optimizer,params,grads")
Z3 = ["--zero", 3, "--bucket-mb", 0.004]


def off(e: Env, kinds: str):
    return ["--offload", kinds, "--offload-dir", e.odir, "--offload-tile", "4096"]


def equality(e: Env, quick: bool) -> None:
    layouts = {
        "z3_nproc1": ["--nproc", 1] + Z3,
        "z3_dp2": ["--nproc", 2] + Z3,
        "z3_dp2_mb2": ["--nproc", 2, "--micro-batch-size", 2] + Z3,
        "z3_tp2": ["--nproc", 2, "--tp", 2] + Z3,
        "z3_pp2": ["--nproc", 2, "--pp", 2, "--micro-batch-size", 2] + Z3,
        "z3_dp2_bf16": ["--nproc", 2, "--precision", "bf16"] + Z3,
        "z3_moe_ep2": ["--nproc", 2, "--moe-every", 1, "--experts", 4, "--ep", 2] + Z3,
    }
    for name, flags in layouts.items():
        m = os.path.join(e.wd, f"{name}.memory.jsonl")
        w = os.path.join(e.wd, f"{name}.memory.safetensors")
        r = e.run(flags + ["--metrics", m, "--save", w])
        check(r.returncode == 0, f"{name} in memory: exit 0")
        for kinds in (KINDS[2:] if quick else KINDS):
            tag = kinds.replace(",", "+")
            m2 = os.path.join(e.wd, f"{name}.{tag}.jsonl")
            w2 = os.path.join(e.wd, f"{name}.{tag}.safetensors")
            r = e.run(flags + off(e, kinds) + ["--metrics", m2, "--save", w2])
            check(r.returncode == 0, f"{name} {kinds}: exit 0 {r.stderr.strip()[-300:] if r.returncode else ''}")
            check(os.listdir(e.odir) == [], f"{name} {kinds}: nothing left in --offload-dir")
            if r.returncode != 0 or not os.path.exists(m):
                continue
            a, b = rows(m), rows(m2)
            check(len(a) == 6 and a == b, f"{name} {kinds}: losses, grad norms and lr equal bit for bit ({len(a)} steps)")
            check(filecmp.cmp(w, w2, shallow=False), f"{name} {kinds}: final weights byte-equal")


def resume(e: Env) -> None:
    flags = ["--nproc", 2] + Z3
    full = os.path.join(e.wd, "shards.full.safetensors")
    check(e.run(flags + ["--save", full]).returncode == 0, "uninterrupted in-memory run")
    o = off(e, KINDS[2])
    for first, second, tag in ((o, [], "offloaded -> in memory"), ([], o, "in memory -> offloaded")):
        ck = os.path.join(e.wd, "ck_shards_" + ("a" if first else "b"))
        shutil.rmtree(ck, ignore_errors=True)
        r = e.run(flags + first + ["--checkpoint-dir", ck, "--save-every", 3, "--stop-at-step", 3])
        check(r.returncode == 0, f"{tag}: first half exit 0")
        w = os.path.join(e.wd, f"shards.resume.{'a' if first else 'b'}.safetensors")
        r = e.run(flags + second + ["--resume", ck, "--save", w])
        check(r.returncode == 0, f"{tag}: second half exit 0 {r.stderr.strip()[-300:] if r.returncode else ''}")
        check(os.path.exists(w) and filecmp.cmp(full, w, shallow=False),
              f"{tag}: final weights byte-equal to the uninterrupted run")
        check(os.listdir(e.odir) == [], f"{tag}: nothing left in --offload-dir")


def reports(e: Env) -> None:
    s, t = os.path.join(e.wd, "shards.summary.json"), os.path.join(e.wd, "shards.trace.json")
    r = e.run(["--nproc", 2] + Z3 + off(e, KINDS[2]) + ["--summary", s, "--trace", t, "--memory-limit", "4G"])
    check(r.returncode == 0, f"summary run exit 0 {r.stderr.strip()[-300:] if r.returncode else ''}")
    if r.returncode != 0:
        return
    j = json.load(open(s))
    for rank in j["ranks"]:
        p, g = rank.get("params_offloaded_bytes", 0), rank.get("grads_offloaded_bytes", 0)
        o = rank.get("optimizer_offloaded_bytes", 0)
        # AdamW's state is 2 floats per element of the shard; the shards one float each.
        check(p > 0 and p == g and 2 * p <= o, f"rank {rank['rank']}: params {p} = grads {g} offloaded, state {o}")
        check(rank["param_bytes"] == 0 and rank["grad_bytes"] == 0,
              f"rank {rank['rank']}: no resident float32 shard (params {rank['param_bytes']}, grads {rank['grad_bytes']})")
        check(rank["offload_read_bytes_per_step"] >= o + p + g and rank["offload_written_bytes_per_step"] >= o + p + g,
              f"rank {rank['rank']}: read {rank['offload_read_bytes_per_step']} and written "
              f"{rank['offload_written_bytes_per_step']} per step >= {o + p + g}")
    kinds = {x["kind"] for x in j["offload"]["shards"]}
    check(kinds == {"parameters", "gradients"}, f"summary offload section lists the shard files {sorted(kinds)}")
    # The gradient file is read once per step, by the update: the global norm uses the segments' norms taken as
    # each bucket's gradient shard was written (not a second read of the shard).
    for x in j["offload"]["shards"]:
        if x["kind"] == "gradients":
            check(x["read_bytes"] == 6 * x["file_bytes"],
                  f"gradient file read {x['read_bytes']} bytes in 6 steps = 6 x its {x['file_bytes']} bytes")
    ev = json.load(open(t))["traceEvents"]
    io_tid = [x["tid"] for x in ev if x.get("ph") == "M" and x.get("args", {}).get("name") == "io"]
    io = [x["name"] for x in ev if x.get("ph") == "X" and io_tid and x["tid"] == io_tid[0]]
    for want in ("read parameters", "write parameters", "read gradients", "write gradients"):
        check(any(n.startswith(want) for n in io), f"trace: '{want}' on the io track")
    check(os.listdir(e.odir) == [], "summary run: nothing left in --offload-dir")


def memory_4x(e: Env) -> None:
    big = ["--n-layer", 28, "--n-head", 4, "--n-embd", 256, "--seq-len", 32, "--batch-size", 2, "--zero", 3,
           "--recompute", "--memory-limit", "80M"]
    s = os.path.join(e.wd, "memory_4x.json")
    r = e.run(big + ["--offload", "optimizer,params,grads", "--offload-dir", e.odir, "--offload-tile", "256K",
                     "--summary", s], steps=3)
    check(r.returncode == 0, f"4x: offloaded run exit 0 {r.stderr.strip()[-300:] if r.returncode else ''}")
    check(os.listdir(e.odir) == [], "4x: nothing left in --offload-dir")
    if r.returncode == 0:
        j = json.load(open(s))
        rank, limit = j["ranks"][0], j["memory_limit"]
        state = 16 * j["params"]
        check(state >= 4 * limit, f"4x: training state {state / 2**20:.1f} MiB >= 4 x limit {limit / 2**20:.0f} MiB")
        check(rank["peak_rss_bytes"] < limit and rank.get("within_memory_limit") is True,
              f"4x: measured peak RSS {rank['peak_rss_bytes'] / 2**20:.1f} MiB under the limit")
        check(rank["params_offloaded_bytes"] == 4 * j["params"] and rank["grads_offloaded_bytes"] == 4 * j["params"],
              "4x: every parameter and gradient element offloaded (one rank)")
    for what, extra in (("in memory", []), ("optimizer alone offloaded", ["--offload", "optimizer", "--offload-dir", e.odir])):
        r = e.run(big + extra, steps=3, expect_ok=False)
        check(r.returncode != 0 and "--memory-limit" in r.stderr and "too small" in r.stderr,
              f"4x: {what} refused at start by the plan ({r.stderr.strip()[-160:]})")


def activations(e: Env) -> None:
    acts = ["--offload-activations", "--offload-dir", e.odir]
    layouts = {
        "act_nproc1": ["--nproc", 1, "--n-layer", 3],
        "act_recompute": ["--nproc", 1, "--recompute", "--n-layer", 3],
        "act_mb2": ["--nproc", 1, "--micro-batch-size", 4],
        "act_bf16": ["--nproc", 1, "--precision", "bf16"],
        "act_dp2_z3_all": ["--nproc", 2] + Z3 + ["--offload", "optimizer,params,grads", "--offload-tile", "4096"],
        "act_tp2": ["--nproc", 2, "--tp", 2],
        # 4 layers: 2 blocks per stage (a stage's last block stays in memory).
        "act_pp2": ["--nproc", 2, "--pp", 2, "--micro-batch-size", 2, "--n-layer", 4],
        "act_pp2_zbh1": ["--nproc", 2, "--pp", 2, "--micro-batch-size", 2, "--n-layer", 4, "--schedule", "zb-h1"],
        "act_moe_ep2": ["--nproc", 2, "--moe-every", 1, "--experts", 4, "--ep", 2],
    }
    for name, flags in layouts.items():
        out = {}
        for mode in ("memory", "offload"):
            m = os.path.join(e.wd, f"{name}.{mode}.jsonl")
            w = os.path.join(e.wd, f"{name}.{mode}.safetensors")
            extra = list(flags)
            if mode == "memory" and "--offload" in extra:  # the in-memory peer: nothing offloaded
                i = extra.index("--offload")
                extra = extra[:i] + extra[i + 4:]
            r = e.run(extra + (acts if mode == "offload" else []) + ["--metrics", m, "--save", w])
            check(r.returncode == 0, f"{name} {mode}: exit 0 {r.stderr.strip()[-300:] if r.returncode else ''}")
            out[mode] = (m, w)
        check(os.listdir(e.odir) == [], f"{name}: nothing left in --offload-dir")
        if all(os.path.exists(p) for p in out["memory"] + out["offload"]):
            a, b = rows(out["memory"][0]), rows(out["offload"][0])
            check(len(a) == 6 and a == b, f"{name}: losses, grad norms and lr equal bit for bit ({len(a)} steps)")
            check(filecmp.cmp(out["memory"][1], out["offload"][1], shallow=False), f"{name}: final weights byte-equal")
    deep = ["--n-layer", 6, "--summary"]
    peaks = {}
    for mode, extra in (("memory", []), ("offload", acts + ["--trace", os.path.join(e.wd, "act.trace.json")])):
        s = os.path.join(e.wd, f"act.{mode}.summary.json")
        r = e.run(deep + [s] + extra, steps=3)
        check(r.returncode == 0, f"6 layers {mode}: exit 0")
        if r.returncode == 0:
            peaks[mode] = json.load(open(s))["ranks"][0]["activation_peak_bytes"]
    if len(peaks) == 2:
        check(peaks["offload"] < 0.6 * peaks["memory"], f"6 layers: activation peak {peaks['offload']:.0f} bytes "
              f"offloaded < 0.6 x {peaks['memory']:.0f} in memory")
        ev = json.load(open(os.path.join(e.wd, "act.trace.json")))["traceEvents"]
        names = [x.get("name", "") for x in ev if x.get("ph") == "X"]
        check(any(n.startswith("read activations") for n in names) and any(n.startswith("write activations") for n in names),
              "trace: activation reads and writes on the io track")
    check(os.listdir(e.odir) == [], "activations: nothing left in --offload-dir")


def bad_input(e: Env) -> None:
    def refused(extra, want, what):
        r = e.run(extra, 2, expect_ok=False)
        ok = r.returncode != 0 and all(w in r.stderr for w in want)
        check(ok, f"{what}: refused naming {want} (exit {r.returncode}: {r.stderr.strip()[-300:]})")

    refused(["--zero", 3, "--offload", "optimizer,params", "--offload-dir", e.odir, "--delayed-update"],
            ["--offload params with --delayed-update"], "params with --delayed-update")
    refused(["--offload", "disk", "--offload-dir", e.odir], ["--offload", "'disk'"], "an unknown kind")
    mnt = os.path.join(e.wd, "mnt_shards_full")
    os.makedirs(mnt, exist_ok=True)
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64K", "tmpfs", mnt], capture_output=True, text=True)
    check(m.returncode == 0, f"mount a 64 KiB tmpfs ({m.stderr.strip()})")
    if m.returncode == 0:
        try:
            refused(["--zero", 3, "--n-embd", 128, "--offload", "optimizer,params,grads", "--offload-dir", mnt],
                    [mnt, "no room", "parameters"], "full tmpfs")
            check(os.listdir(mnt) == [], "full tmpfs: nothing left")
        finally:
            subprocess.run(["umount", mnt])
    # The activation file grows during the run: a disk that fills then is an error naming the directory at the
    # spill that needed the room (here the first: 16 KiB hold less than one block), and nothing is left.
    mnt = os.path.join(e.wd, "mnt_acts_full")
    os.makedirs(mnt, exist_ok=True)
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16K", "tmpfs", mnt], capture_output=True, text=True)
    check(m.returncode == 0, f"mount a 16 KiB tmpfs ({m.stderr.strip()})")
    if m.returncode == 0:
        try:
            for nproc in (1, 2):
                refused(["--nproc", nproc, "--n-layer", 3, "--offload-activations", "--offload-dir", mnt],
                        [mnt, "no room", "activations", "No space left"], f"activations filling a tmpfs, nproc {nproc}")
                check(os.listdir(mnt) == [], f"activations filling a tmpfs, nproc {nproc}: nothing left")
        finally:
            subprocess.run(["umount", mnt])
    check(os.listdir(e.odir) == [], "bad input: nothing left in --offload-dir")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--quick", action="store_true", help="optimizer,params,grads alone in the equality part")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    e = Env(a.meshtrain, a.workdir)
    equality(e, a.quick)
    resume(e)
    reports(e)
    memory_4x(e)
    activations(e)
    bad_input(e)
    print(f"{len(FAILS)} failed")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
