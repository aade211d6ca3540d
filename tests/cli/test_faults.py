"""Faults end to end (docs/faults.md), on a small GPT (L=2, C=32, V=64, T=16) under the shm launcher:
  1. --max-restarts, same layout: a 2-rank job whose rank 1 is SIGKILLed mid-run (MESHTRAIN_FAULT) restarts
     from its last checkpoint and ends with the unbroken 2-rank run's metrics rows (loss, grad_norm, lr) and
     final weights, bit for bit; the failure is reported with the flight recorder's verdict naming rank 1, its
     host and how it died; the failed attempt's PATH.flight.json is removed once the restart finished the job.
  1b. the same with --learners 2 (its learners' state is in checkpoints): rows and weights bit for bit.
  2. --min-nproc, dp 4 -> dp 2: rank 3's place is lost (fault kind "lose"); the restart continues on 2 ranks
     (3 do not divide --batch-size 8), the global batch unchanged. Its rows equal, bit for bit, a 4-rank run
     stopped at the same checkpoint and resumed by hand on 2 ranks, and the single-process unbroken run up to
     float32 rounding (rel. 2e-5 on loss and grad_norm; lr exact).
  3. A stalled rank (SIGSTOP) ends the job within --comm-timeout + grace with the verdict naming it, and without
     --max-restarts the job is not restarted; the last checkpoint is resumable.
  4. The checkpoint disk fills (a 1.5 MiB tmpfs; root only): the job ends non-zero naming the checkpoint
     directory, leaves no temporaries, and the last complete checkpoint on it resumes to the unbroken run's rows.
  5. Refused flag combinations name both flags.
After every job: nothing of it in /dev/shm and none of its rank processes alive (MESHTRAIN_PIDS_FILE).
Exits 77 (CTest: skipped) when a part could not run (not root: no tmpfs), after running the others.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_checks import FAILS, check, write_shard  # noqa: E402

SKIPS: list[str] = []




def shm_entries() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("meshtrain-")}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class Env:
    def __init__(self, meshtrain: str, workdir: str):
        self.bin, self.wd = meshtrain, workdir
        self.data = os.path.join(workdir, "data.bin")
        write_shard(self.data, 20000, 64)
        self.pids = os.path.join(workdir, "pids.txt")

    def path(self, name: str) -> str:
        p = os.path.join(self.wd, name)
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.exists(p):
            os.remove(p)
        return p

    def cmd(self, extra):
        base = {"--data": self.data, "--n-layer": 2, "--n-head": 2, "--n-embd": 32, "--vocab-size": 64,
                "--seq-len": 16, "--batch-size": 8, "--steps": 8, "--lr": 3e-3, "--warmup-steps": 2,
                "--weight-decay": 0.1, "--grad-clip": 0.5, "--seed": 5, "--comm-timeout": 60}
        extra = [str(x) for x in extra]
        for k in [k for k in base if k in extra]:
            del base[k]
        return [self.bin, "train", "--quiet"] + [str(x) for kv in base.items() for x in kv] + extra

    def run(self, extra, fault: str = "", timeout=300):
        env = dict(os.environ, MESHTRAIN_PIDS_FILE=self.pids)
        env.pop("MESHTRAIN_FAULT", None)
        if fault:
            env["MESHTRAIN_FAULT"] = fault
        if os.path.exists(self.pids):
            os.remove(self.pids)
        before = shm_entries()
        r = subprocess.run(self.cmd(extra), capture_output=True, text=True, timeout=timeout, env=env)
        left = shm_entries() - before
        check(not left, f"nothing left in /dev/shm ({sorted(left)})")
        if os.path.exists(self.pids):
            with open(self.pids) as f:
                pids = [int(line.split()[1]) for line in f if line.strip()]
            survivors = [p for p in pids if alive(p)]
            check(not survivors, f"no rank process left ({survivors})")
        return r


def rows(path: str):
    with open(path) as f:
        return [{k: j[k] for k in ("step", "loss", "grad_norm", "lr")} for j in map(json.loads, f)]


def no_temporaries(d: str) -> bool:
    return not any(".tmp." in n for _, dirs, files in os.walk(d) for n in dirs + files)


def restart_same_layout(e: Env) -> None:
    common = ["--nproc", 2, "--save-every", 2, "--keep-checkpoints", 0]
    a_m, a_w, a_c = e.path("a.jsonl"), e.path("a.safetensors"), e.path("ckpt_a")
    r = e.run(common + ["--checkpoint-dir", a_c, "--metrics", a_m, "--save", a_w])
    check(r.returncode == 0, f"unbroken 2-rank run ({r.stderr[-400:]})")
    b_m, b_w, b_c = e.path("b.jsonl"), e.path("b.safetensors"), e.path("ckpt_b")
    b_s = e.path("b_summary.json")
    r = e.run(common + ["--checkpoint-dir", b_c, "--metrics", b_m, "--save", b_w, "--max-restarts", 2,
                        "--summary", b_s], fault=f"1:{FAULT_OP}:kill")
    print(r.stderr)
    check(r.returncode == 0, "the killed job restarted and finished")
    m = re.search(r"meshtrain: restart 1 of 2: from \S*step_(\d+) with 2 rank\(s\)", r.stderr)
    check(m is not None and 2 <= int(m.group(1)) <= 6, "restarted from a checkpoint in the middle of the run "
          f"(step {m.group(1) if m else None}; the fault's operation index sets it)")
    summary = json.load(open(b_s))
    check(m is not None and summary["steps"] == 8 - int(m.group(1)) and summary["dp"] == 2,
          f"the restarted attempt ran only the steps after the checkpoint (summary: {summary['steps']} steps)")
    check("rank 1 (host " in r.stderr and "killed by signal 9 (SIGKILL)" in r.stderr and
          "\n  flight recorder: " in r.stderr, "the verdict names rank 1, its host and its death")
    check("restart 2" not in r.stderr, "one restart was enough (faults fire in the first attempt only)")
    ra, rb = rows(a_m), rows(b_m)
    check(len(rb) == 8 and [x["step"] for x in rb] == list(range(8)), "every step's row exactly once")
    check(ra == rb, "rows equal the unbroken run's, bit for bit")
    with open(a_w, "rb") as fa, open(b_w, "rb") as fb:
        check(fa.read() == fb.read(), "final weights byte-equal to the unbroken run's")
    check(no_temporaries(b_c), "no temporaries in the checkpoint directory")
    check(not os.path.exists(b_m + ".flight.json"), "the failed attempt's rings file is removed once the restart "
          "finished the job")
    check(not os.path.exists(a_m + ".flight.json"), "an unbroken job writes no rings file")


def restart_learners(e: Env) -> None:
    """--learners 2 (Crossbow SMA, central momentum 0.5) restarts too: the checkpoint holds the learners' weights,
    their AdamW moments and z_prev, so the restarted job's rows and final weights equal the unbroken run's."""
    common = ["--nproc", 2, "--save-every", 2, "--keep-checkpoints", 0, "--learners", 2, "--micro-batch-size", 2,
              "--sma-momentum", 0.5]
    a_m, a_w = e.path("la.jsonl"), e.path("la.safetensors")
    r = e.run(common + ["--checkpoint-dir", e.path("ckpt_la"), "--metrics", a_m, "--save", a_w])
    check(r.returncode == 0, f"unbroken --learners run ({r.stderr[-400:]})")
    b_m, b_w = e.path("lb.jsonl"), e.path("lb.safetensors")
    r = e.run(common + ["--checkpoint-dir", e.path("ckpt_lb"), "--metrics", b_m, "--save", b_w, "--max-restarts", 1],
              fault=f"1:{FAULT_OP}:kill")
    m = re.search(r"meshtrain: restart 1 of 1: from \S*step_(\d+) with 2 rank\(s\)", r.stderr)
    check(r.returncode == 0 and m is not None and 2 <= int(m.group(1)) <= 6,
          f"--learners: the killed job restarted from a checkpoint in the middle and finished ({r.stderr[-400:]})")
    check(rows(a_m) == rows(b_m), "--learners: rows equal the unbroken run's, bit for bit")
    with open(a_w, "rb") as fa, open(b_w, "rb") as fb:
        check(fa.read() == fb.read(), "--learners: final weights byte-equal to the unbroken run's")


def restart_fewer_ranks(e: Env) -> None:
    d_m = e.path("d.jsonl")
    r = e.run(["--nproc", 1, "--metrics", d_m])
    check(r.returncode == 0, "single-process unbroken run")
    b_m, b_c = e.path("b4.jsonl"), e.path("ckpt_b4")
    b_s = e.path("b4_summary.json")
    r = e.run(["--nproc", 4, "--save-every", 2, "--keep-checkpoints", 0, "--checkpoint-dir", b_c, "--metrics", b_m,
               "--max-restarts", 1, "--min-nproc", 2, "--summary", b_s], fault=f"3:{FAULT_OP_4}:lose")
    print(r.stderr)
    check(r.returncode == 0, "the job that lost rank 3 restarted on fewer ranks and finished")
    m = re.search(r"restart 1 of 1: from \S*step_(\d+) with 2 rank\(s\) \(the place of rank\(s\) 3 is lost; 3 left, "
                  r"2 used\)", r.stderr)
    check(m is not None, "restart message: from the checkpoint, 2 ranks, rank 3 lost")
    if m is None:
        return
    step = int(m.group(1))
    check(2 <= step <= 6, f"restarted in the middle of the run (step {step})")
    summary = json.load(open(b_s))
    check(summary["steps"] == 8 - step and summary["dp"] == 2,
          f"the restarted attempt ran steps {step}..7 on dp 2 (summary: {summary['steps']} steps, dp {summary['dp']})")
    # The same thing by hand: stop the 4-rank run at that step, resume it on 2 ranks.
    h_m, h_c = e.path("h.jsonl"), e.path("ckpt_h")
    r1 = e.run(["--nproc", 4, "--save-every", 2, "--checkpoint-dir", h_c, "--metrics", h_m, "--stop-at-step", step])
    r2 = e.run(["--nproc", 2, "--save-every", 2, "--checkpoint-dir", h_c, "--metrics", h_m, "--resume", h_c])
    check(r1.returncode == 0 and r2.returncode == 0, "stop at the step on 4 ranks, resume on 2")
    rb, rh, rd = rows(b_m), rows(h_m), rows(d_m)
    check([x["step"] for x in rb] == list(range(8)), "every step's row exactly once")
    check(rb == rh, "rows equal the stopped-and-resumed-by-hand run's, bit for bit")
    worst = max(abs(x[k] - y[k]) / max(abs(y[k]), 1e-30) for x, y in zip(rb, rd) for k in ("loss", "grad_norm"))
    check(len(rb) == len(rd) and worst <= 2e-5 and all(x["lr"] == y["lr"] for x, y in zip(rb, rd)),
          f"rows equal the single-process run's up to float32 rounding (worst rel. {worst:.2e})")


def stalled_rank(e: Env) -> None:
    m, c = e.path("s.jsonl"), e.path("ckpt_s")
    three = ["--nproc", 3, "--batch-size", 6, "--save-every", 2, "--checkpoint-dir", c, "--metrics", m]
    r = e.run(three + ["--comm-timeout", 3], fault=f"2:{FAULT_OP}:stop", timeout=60)
    print(r.stderr)
    check(r.returncode == 1, "the stalled job failed")
    check("meshtrain: rank 2 did not respond within --comm-timeout" in r.stderr, "the headline names rank 2")
    check(re.search(r"flight recorder: all ranks but 2 entered \S+ #\d+ on group \S+; rank 2 \(host [^;]+; stopped",
                    r.stderr) is not None, "the verdict names rank 2, its host and that it is stopped")
    check("restart" not in r.stderr, "no restart without --max-restarts")
    flight = json.load(open(m + ".flight.json"))
    check(len(flight["ranks"]) == 3 and flight["verdict"].startswith("all ranks but 2"), "the rings' file")
    r = e.run(three + ["--resume", c])
    check(r.returncode == 0 and [x["step"] for x in rows(m)] == list(range(8)), "its last checkpoint resumes")


def disk_full(e: Env) -> None:
    mnt = e.path("tmpfs")
    os.makedirs(mnt)
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1536k", "tmpfs", mnt], capture_output=True, text=True)
    if mount.returncode != 0:
        print(f"SKIP disk_full: cannot mount a tmpfs ({mount.stderr.strip()}): needs root")
        SKIPS.append("disk_full")
        return
    try:
        ref_m = e.path("ref2.jsonl")
        check(e.run(["--nproc", 2, "--metrics", ref_m]).returncode == 0, "unbroken run")
        ck, m = os.path.join(mnt, "ckpt"), e.path("full.jsonl")
        r = e.run(["--nproc", 2, "--save-every", 1, "--keep-checkpoints", 0, "--checkpoint-dir", ck, "--metrics", m,
                   "--max-restarts", 1])
        print(r.stderr)
        check(r.returncode != 0, "a full checkpoint disk ends the job")
        check(ck in r.stderr and "No space left on device" in r.stderr, "the message names the directory and the cause")
        check(no_temporaries(ck), "no temporaries left on the full disk")
        done = sorted(n for n in os.listdir(ck) if n.startswith("step_"))
        check(len(done) >= 1, f"checkpoints written before the disk filled: {done}")
        other = e.path("ckpt_after_full")
        r = e.run(["--nproc", 2, "--checkpoint-dir", other, "--metrics", m, "--resume", ck])
        check(r.returncode == 0, f"the last checkpoint on the full disk resumes ({r.stderr[-300:]})")
        check(rows(m) == rows(ref_m), "and the resumed rows equal the unbroken run's")
    finally:
        subprocess.run(["umount", mnt])


def refused(e: Env) -> None:
    for extra, want in [(["--max-restarts", 1], "--max-restarts 1 without --checkpoint-dir"),
                        (["--min-nproc", 1, "--nproc", 2], "--min-nproc 1 without --max-restarts"),
                        (["--max-restarts", -1], "--max-restarts must be in 0..1000"),
                        (["--max-restarts", 1, "--checkpoint-dir", e.path("x"), "--min-nproc", 3, "--nproc", 2],
                         "--min-nproc must be in 1..--nproc (2), got 3")]:
        r = e.run(extra)
        check(r.returncode != 0 and want in r.stderr, f"refused: {want} ({r.stderr.strip()[-200:]})")
    r = e.run(["--nproc", 2], fault="1:x:kill")
    check(r.returncode != 0 and "MESHTRAIN_FAULT='1:x:kill' is not RANK:K:KIND" in r.stderr, "a bad fault spec")


# The fault's operation: the K-th communication operation of the rank (docs/faults.md). A 2-layer GPT step
# under dp issues a few per step; these put the fault after the first checkpoints and before the end, which
# the tests check from the restart message (so a change in the count shows as a failure, not a silent pass).
FAULT_OP = 12
FAULT_OP_4 = 12


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    e = Env(a.meshtrain, a.workdir)
    for part in (refused, restart_same_layout, restart_learners, restart_fewer_ranks, stalled_rank, disk_full):
        if not a.only or a.only == part.__name__:
            print(f"== {part.__name__}", flush=True)
            part(e)
    print(f"{len(FAILS)} failed" if FAILS else "all passed", f"({len(SKIPS)} part(s) skipped: {SKIPS})" if SKIPS else "")
    if FAILS:
        return 1
    return 77 if SKIPS else 0


if __name__ == "__main__":
    sys.exit(main())
