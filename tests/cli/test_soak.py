"""Soak (bounded to about 70 s): many short 2- and 3-rank GPT jobs (6 steps, a checkpoint every 2), each with a
random injected fault (MESHTRAIN_FAULT: a random rank SIGKILLs or SIGSTOPs itself before a random operation;
some operations lie past the job's end, so some jobs run clean), half of them with --max-restarts 2.
Nothing is lost: every job, restarted by the launcher or resumed by hand from its last complete checkpoint (or
run again from the start when there is none), ends with the unbroken run's metrics rows bit for bit. No leaks:
after every job nothing of it is in /dev/shm, none of its rank processes is alive, no temporaries are left in
its checkpoint directory. A failed job's stderr holds the flight recorder's verdict naming the faulty rank.
(The launcher's own file descriptors across many faulty jobs: tests/comm/test_flight_e2e.cpp.)
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_checks  # noqa: E402
from cli_checks import FAILS, write_shard  # noqa: E402

BUDGET_S = 70


def check(cond: bool, msg: str) -> None:
    cli_checks.check(cond, msg, quiet=True)




def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return False


def rows(path: str):
    with open(path) as f:
        return [{k: j[k] for k in ("step", "loss", "grad_norm", "lr")} for j in map(json.loads, f)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--seed", type=int, default=int(os.environ.get("MESHTRAIN_SOAK_SEED", "29")))
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    data = os.path.join(a.workdir, "data.bin")
    write_shard(data, 20000, 64)
    pids = os.path.join(a.workdir, "pids.txt")

    def cmd(nproc, metrics, ckpt, extra):
        return [a.meshtrain, "train", "--quiet", "--data", data, "--n-layer", "2", "--n-head", "2",
                "--n-embd", "32", "--vocab-size", "64", "--seq-len", "16", "--batch-size", "6", "--steps", "6",
                "--lr", "3e-3", "--seed", "5", "--nproc", str(nproc), "--metrics", metrics, "--checkpoint-dir", ckpt,
                "--save-every", "2"] + [str(x) for x in extra]

    def run(argv, fault=""):
        env = dict(os.environ, MESHTRAIN_PIDS_FILE=pids)
        env.pop("MESHTRAIN_FAULT", None)
        if fault:
            env["MESHTRAIN_FAULT"] = fault
        if os.path.exists(pids):
            os.remove(pids)
        before = {n for n in os.listdir("/dev/shm") if n.startswith("meshtrain-")}
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
        left = {n for n in os.listdir("/dev/shm") if n.startswith("meshtrain-")} - before
        check(not left, f"/dev/shm left {sorted(left)} after {' '.join(argv[-6:])} {fault}")
        if os.path.exists(pids):
            with open(pids) as f:
                survivors = [int(l.split()[1]) for l in f if l.strip() and alive(int(l.split()[1]))]
            check(not survivors, f"rank processes {survivors} survived {fault}")
        return r

    ref = {}
    for n in (2, 3):
        m, c = os.path.join(a.workdir, f"ref{n}.jsonl"), os.path.join(a.workdir, f"ref{n}")
        shutil.rmtree(c, ignore_errors=True)
        r = run(cmd(n, m, c, []))
        check(r.returncode == 0, f"reference run on {n} ranks: {r.stderr[-300:]}")
        ref[n] = rows(m)

    rng = random.Random(a.seed)
    t0 = time.monotonic()
    jobs = fired = restarted = resumed = 0
    while time.monotonic() - t0 < BUDGET_S:
        jobs += 1
        n = rng.choice((2, 3))
        rank, k = rng.randrange(n), rng.randint(1, 24)
        kind = "stop" if rng.random() < 0.3 else "kill"
        restarts = rng.random() < 0.5
        fault = f"{rank}:{k}:{kind}"
        m, c = os.path.join(a.workdir, "job.jsonl"), os.path.join(a.workdir, "job_ckpt")
        shutil.rmtree(c, ignore_errors=True)
        extra = ["--comm-timeout", 2] + (["--max-restarts", 2] if restarts else [])
        r = run(cmd(n, m, c, extra), fault)
        what = f"job {jobs}: {n} ranks, fault {fault}, restarts {restarts}"
        failed_once = "\n  flight recorder: " in r.stderr
        fired += failed_once
        if failed_once:
            check(re.search(rf"rank {rank} \(host [^)]*(killed by signal 9|stopped)", r.stderr) is not None,
                  f"{what}: the verdict names rank {rank}, its host and its fate:\n{r.stderr}")
        if restarts:
            restarted += "restart 1 of 2" in r.stderr
            check(r.returncode == 0, f"{what}: restarted to the end:\n{r.stderr}")
        elif r.returncode != 0:
            check(failed_once, f"{what}: failed with a verdict:\n{r.stderr}")
            has = any(x.startswith("step_") and ".tmp." not in x for x in os.listdir(c)) if os.path.isdir(c) else False
            again = ["--resume", c] if has else ["--overwrite-checkpoints"]
            r = run(cmd(n, m, c, again))
            resumed += 1
            check(r.returncode == 0, f"{what}: resumed ({again[0]}):\n{r.stderr}")
        check(rows(m) == ref[n], f"{what}: rows equal the unbroken run's")
        check(not any(".tmp." in x for x in os.listdir(c)), f"{what}: no temporaries in the checkpoint directory")
    print(f"{jobs} jobs in {time.monotonic() - t0:.0f} s: {fired} failed by their fault, {restarted} restarted by "
          f"the launcher, {resumed} resumed by hand; {len(FAILS)} failed checks")
    check(jobs >= 8 and fired >= 4, "the soak ran enough faulty jobs to mean something")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
