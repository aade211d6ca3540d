"""--overlap-update at ZeRO 3 with the parameter shards offloaded (the exact update on a thread of its own, each
group's next forward waiting only for its own shard's update; parallel/data/zero_stage.cpp, Stage3; docs/offload.md)
never changes the math. Small GPT (L=2, C=32, V=64, B=8, T=16; 4 KiB offload tiles, so the update has many tiles;
small buckets, so a rank's shard holds several groups). Under MESHTRAIN_OVERLAP_HOLD=1 each update starts only once
the next step's forward has begun (or something waits for it), so every update but the last runs alongside a
forward whatever the timing, and the summary's overlap_update counts say so.
  1. nproc 1 and dp 2, --offload optimizer,params and optimizer,params,grads, each with --eval-every 2 and
     --save-every 2 (evaluation and checkpoints in the middle of the run, which must wait for the update): every
     metrics row (loss, grad norm, lr, val loss) and the final weights (--save bytes) equal the in-memory ZeRO 3
     run's; the checkpoints written at steps 2 and 4 hold the same bytes as the in-memory run's; the summary counts
     6 updates on the thread, 3 of them released by a next forward (steps 0, 2, 4; the others end at the evaluation
     and checkpoint after their step) and some forward groups taking their shard from the update's copy in memory
     rather than the file (fresh_taken > 0); nothing is left in --offload-dir. Also once without the hold (the real
     timing). And once with 16 KiB tiles under the hold (several groups' shards in one tile), the same bits.
  2. bf16 products at dp 2 (the mirror the bf16 gathers read is rounded by the update tile by tile), both kinds,
     under the hold: rows and final weights equal the in-memory bf16 run's.
  3. Resume: overlapped to step 2, in memory to step 4, overlapped to the end (dp 2, optimizer,params,grads) ends
     byte-equal to the uninterrupted in-memory run.
  4. Reads (one rank): the exact offloaded run reads the parameter file exactly steps x (3 S - E) bytes (the tied
     embedding's group stays gathered from the forward's end into the backward and is not read again while
     gathered); with --overlap-update and an evaluation after every step, each evaluation's forward takes the
     update's 3 kept copies, which outlive the update's end (fresh_taken = 18), and the rows equal in memory.
  5. Refused with the flags named: --overlap-update at ZeRO 3 with --offload params but not optimizer; with --tp 2;
     at ZeRO 2 without --delayed-update.
Mutation checks (by hand, before committing): with the wait for a group's shard removed (Stage3::wait_updated a
no-op and updated() always true) part 1 fails (rows and weights differ at nproc 1 and dp 2), and so it does with
the update's copy left unwritten (Stage3::keep_fresh without its memcpy). Part 4 (off8): with the tied group released at
the forward's end (Stage3::after_forward), or start_read reading a gathered group's shard, the exact run's read
figure fails (2018304 and 2028544 bytes against 1956864); with finish_update dropping every kept copy, fresh_taken
is 0 against 18; with Tiles reading three tiles ahead instead of two (into the buffer of the tile being updated),
part 1's rows, weights and checkpoints differ.
"""
from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_offload import Env, check, rows, write_shard, FAILS  # noqa: E402

Z3 = ["--zero", 3, "--bucket-mb", 0.004]


def full_rows(path: str):
    with open(path) as f:
        return [{k: j[k] for k in ("step", "loss", "grad_norm", "lr", "val_loss") if k in j} for j in map(json.loads, f)]


def off(e: Env, kinds: str, tile: str = "4096"):
    return ["--offload", kinds, "--offload-dir", e.odir, "--offload-tile", tile]


def ckpt_files(d: str):
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, d)] = open(p, "rb").read()
    return out


def equality(e: Env, val: str) -> None:
    mid = ["--val-data", val, "--eval-every", 2, "--eval-batches", 2, "--save-every", 2]
    for np_ in (1, 2):
        base = ["--nproc", np_] + Z3 + mid
        m0, w0, c0 = (os.path.join(e.wd, f"np{np_}.memory{x}") for x in (".jsonl", ".safetensors", ".ckpt"))
        shutil.rmtree(c0, ignore_errors=True)
        r = e.run(base + ["--metrics", m0, "--save", w0, "--checkpoint-dir", c0])
        check(r.returncode == 0, f"np {np_} in memory: exit 0 {r.stderr.strip()[-300:] if r.returncode else ''}")
        if r.returncode != 0:
            continue
        a = full_rows(m0)
        check(len(a) == 6 and sum("val_loss" in x for x in a) == 3, f"np {np_}: 6 rows, 3 with a val loss")
        for kinds, hold, tile in (("optimizer,params", True, "4096"), ("optimizer,params,grads", True, "4096"),
                                  ("optimizer,params", False, "4096"), ("optimizer,params", True, "16384")):
            tag = f"np {np_} {kinds}{' hold' if hold else ''}{' 16 KiB tiles' if tile != '4096' else ''}"
            m, w, c, s = (os.path.join(e.wd, f"np{np_}.{kinds}.{hold}.{tile}{x}") for x in (".jsonl", ".safetensors", ".ckpt", ".json"))
            shutil.rmtree(c, ignore_errors=True)
            env = {"MESHTRAIN_OVERLAP_HOLD": "1"} if hold else {}
            os.environ.update(env)
            try:
                r = e.run(base + off(e, kinds, tile) + ["--overlap-update", "--metrics", m, "--save", w, "--checkpoint-dir",
                                                  c, "--summary", s])
            finally:
                for k in env:
                    del os.environ[k]
            check(r.returncode == 0, f"{tag}: exit 0 {r.stderr.strip()[-300:] if r.returncode else ''}")
            check(os.listdir(e.odir) == [], f"{tag}: nothing left in --offload-dir")
            if r.returncode != 0:
                continue
            check(full_rows(m) == a, f"{tag}: every row's loss, grad norm, lr and val loss equal bit for bit")
            check(filecmp.cmp(w0, w, shallow=False), f"{tag}: final weights byte-equal")
            f0, f1 = ckpt_files(c0), ckpt_files(c)
            same = sorted(k for k in f0 if k.endswith(".safetensors") and f1.get(k) == f0[k])
            want = sorted(k for k in f0 if k.endswith(".safetensors"))
            check(len(want) >= 2 and same == want, f"{tag}: checkpoint tensors byte-equal ({len(same)} of {len(want)} "
                                                   f"files)")
            o = json.load(open(s)).get("overlap_update") or {}
            if hold:  # the updates of steps 1, 3 and 5 end at the evaluation and checkpoint after them
                check(o.get("deferred") == 6 and o.get("overlapped") == 3,
                      f"{tag}: 6 updates on the thread, 3 alongside the next forward ({o})")
                check(o.get("fresh_taken", 0) > 0, f"{tag}: some groups' shards taken from the update's copy ({o})")
                check(o.get("kept_copied", 0) > 0, f"{tag}: the updates' first tiles copied from the backward's "
                                                   f"gathers ({o})")
                w, wg, wf = (o.get(x, -1) for x in ("waited_s", "waited_group_s", "waited_first_s"))
                check(0 <= wf <= wg + 1e-9 and wg <= w + 1e-9,
                      f"{tag}: the waits' split: first groups' <= groups' <= all ({o})")
            else:
                check(o.get("deferred") == 6, f"{tag}: 6 updates on the thread ({o})")


def bf16(e: Env) -> None:
    """bf16 products: the groups gathered in bf16 read the mirror, which the update rounds tile by tile."""
    base = ["--nproc", 2, "--precision", "bf16"] + Z3
    m0, w0 = (os.path.join(e.wd, f"bf16.memory{x}") for x in (".jsonl", ".safetensors"))
    check(e.run(base + ["--metrics", m0, "--save", w0]).returncode == 0, "bf16 dp 2 in memory: exit 0")
    for kinds in ("optimizer,params", "optimizer,params,grads"):
        m, w = (os.path.join(e.wd, f"bf16.{kinds}{x}") for x in (".jsonl", ".safetensors"))
        os.environ["MESHTRAIN_OVERLAP_HOLD"] = "1"
        try:
            r = e.run(base + off(e, kinds) + ["--overlap-update", "--metrics", m, "--save", w])
        finally:
            del os.environ["MESHTRAIN_OVERLAP_HOLD"]
        check(r.returncode == 0, f"bf16 dp 2 {kinds} hold: exit 0 {r.stderr.strip()[-300:] if r.returncode else ''}")
        if r.returncode == 0:
            check(rows(m) == rows(m0) and len(rows(m0)) == 6, f"bf16 dp 2 {kinds} hold: every row equal bit for bit")
            check(filecmp.cmp(w0, w, shallow=False), f"bf16 dp 2 {kinds} hold: final weights byte-equal")
    check(os.listdir(e.odir) == [], "bf16: nothing left in --offload-dir")


def resume(e: Env) -> None:
    flags = ["--nproc", 2] + Z3
    full = os.path.join(e.wd, "chain.full.safetensors")
    check(e.run(flags + ["--save", full]).returncode == 0, "chain: uninterrupted in-memory run")
    ck = os.path.join(e.wd, "ck_chain")
    shutil.rmtree(ck, ignore_errors=True)
    o = off(e, "optimizer,params,grads") + ["--overlap-update"]
    w = os.path.join(e.wd, "chain.safetensors")
    ok = True
    for tier, res, stop, tag in ((o, [], 2, "overlapped to step 2"), ([], ["--resume", ck], 4, "in memory to step 4"),
                                 (o, ["--resume", ck], None, "overlapped to the end")):
        extra = flags + tier + res + ["--checkpoint-dir", ck, "--save-every", 2]
        extra += ["--stop-at-step", stop] if stop else ["--save", w]
        r = e.run(extra)
        ok = ok and r.returncode == 0
        check(r.returncode == 0, f"chain, {tag}: exit 0 {r.stderr.strip()[-300:] if r.returncode else ''}")
        check(os.listdir(e.odir) == [], f"chain, {tag}: nothing left in --offload-dir")
    check(ok and os.path.exists(w) and filecmp.cmp(full, w, shallow=False),
          "chain: overlapped -> in memory -> overlapped ends byte-equal to the uninterrupted run")


def reads(e: Env, val: str) -> None:
    """What the parameter file is read for (one rank, ZeRO 3, optimizer,params offloaded; S the shard's bytes, here
    every parameter, and E the tied embedding group's, wte and wpe: (V + T) x C x 4 = (64 + 16) x 32 x 4 bytes).
    Exact step: per step the forward reads each group's shard once, the update the whole shard, and the backward
    each group's but the tied embedding's, which stays gathered from the forward's end (the group the backward
    opens first), so reads = steps x (3 S - E), plus the last update's read-ahead of the next forward's first two
    groups (E and block 0's (12 C^2 + 13 C) x 4 bytes), which the run waits for before its summary; reading the
    tied group again at the forward's end, or a second time while it is gathered in the backward, adds E per step
    each. --overlap-update under the hold with an evaluation after
    every step: each update ends at the evaluation (settle), and its copies of the first 3 buckets' shards (4096
    floats or fewer each, all in the tied group; Stage3::kFresh) outlive its end, so each evaluation's forward
    takes 3 of them: fresh_taken = 3 x 6; the run's rows (val loss included) equal the in-memory run's."""
    flags = ["--nproc", 1, "--n-positions", 16] + Z3
    s = os.path.join(e.wd, "reads.json")
    r = e.run(flags + off(e, "optimizer,params") + ["--summary", s])
    check(r.returncode == 0, f"reads, exact: exit 0 {r.stderr.strip()[-300:] if r.returncode else ''}")
    if r.returncode == 0:
        j = json.load(open(s))
        S, E = 4 * j["params"], (64 + 16) * 32 * 4
        pf = [f for f in j["offload"]["shards"] if f["kind"] == "parameters"]
        got = pf[0]["read_bytes"] if pf else None
        B0 = (12 * 32 * 32 + 13 * 32) * 4
        want = 6 * (3 * S - E) + E + B0
        check(S == j["ranks"][0]["params_offloaded_bytes"] and got == want,
              f"reads, exact: the parameter file read 6 x (3 S - E) + E + B0 = {want} bytes (S {S}, E {E}, B0 {B0}): {got}")
    mid = ["--val-data", val, "--eval-every", 1, "--eval-batches", 2]
    m0, m = (os.path.join(e.wd, f"reads.{x}.jsonl") for x in ("memory", "overlap"))
    r0 = e.run(flags + mid + ["--metrics", m0])
    os.environ["MESHTRAIN_OVERLAP_HOLD"] = "1"
    try:
        r = e.run(flags + mid + off(e, "optimizer,params") + ["--overlap-update", "--metrics", m, "--summary", s])
    finally:
        del os.environ["MESHTRAIN_OVERLAP_HOLD"]
    check(r0.returncode == 0 and r.returncode == 0, f"reads, eval every step: exit 0 {r.stderr.strip()[-300:]}")
    if r0.returncode == 0 and r.returncode == 0:
        check(full_rows(m) == full_rows(m0) and sum("val_loss" in x for x in full_rows(m0)) == 6,
              "reads, eval every step: every row (6 with a val loss) equal bit for bit")
        o = json.load(open(s)).get("overlap_update") or {}
        check(o.get("deferred") == 6 and o.get("fresh_taken") == 18,
              f"reads, eval every step: each evaluation's forward took the 3 kept copies (fresh_taken 18: {o})")
    check(os.listdir(e.odir) == [], "reads: nothing left in --offload-dir")


def refused(e: Env) -> None:
    cases = (
        (["--zero", 3] + off(e, "params") + ["--overlap-update"], 1,
         "--overlap-update --zero 3 --offload params without --offload optimizer"),
        (["--zero", 3, "--tp", 2] + off(e, "optimizer,params") + ["--overlap-update"], 2,
         "--overlap-update --zero 3 --offload params with --tp 2"),
        (["--zero", 2] + off(e, "optimizer,params") + ["--overlap-update"], 2, "--overlap-update without --delayed-update"),
    )
    for flags, np_, want in cases:
        r = e.run(["--nproc", np_] + flags, 2, expect_ok=False)
        check(r.returncode != 0 and want in r.stderr,
              f"refused naming '{want}' (exit {r.returncode}: {r.stderr.strip()[-200:]})")
    check(os.listdir(e.odir) == [], "refused: nothing left in --offload-dir")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--only", default="", help="comma-separated parts: equality,bf16,resume,reads,refused")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    e = Env(a.meshtrain, a.workdir)
    val = os.path.join(a.workdir, "val.bin")
    write_shard(val, 4000, 64)
    parts = {"equality": lambda e: equality(e, val), "bf16": bf16, "resume": resume, "reads": lambda e: reads(e, val),
             "refused": refused}
    for name, fn in parts.items():
        if not a.only or name in a.only.split(","):
            fn(e)
    print(f"{len(FAILS)} failed")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
