"""--overlap-update (train/overlapped_update.h): --delayed-update with step t's optimizer update on a thread of its
own while step t+1's forward and backward run. End to end on the small GPT of test_offload.py (L=2, C=32, V=64,
B=8, T=16, 6 steps, clipping at 0.5 so that the clipping scale is live):
  1. The same bits as the serial --delayed-update (which tests/parity/test_delay_one.py holds to the independent
     delay-1 reference): losses, gradient norms, lr and validation losses equal, --save files byte-equal, at
     nproc 1 and dp 2 with ZeRO 0 and 1, each in memory and with --offload optimizer (4 KiB tiles), and at
     nproc 1 with bf16 products, with gradient accumulation and with evaluation every 2 steps (a settle between
     steps).
  2. The update runs alongside the next step: with MESHTRAIN_OVERLAP_HOLD=1 the worker starts each update only
     once the main thread has begun the next step's forward (or waits for the update), so --summary's
     overlap_update counts say that every update but the last (settled at the end of the run) was still running
     when the next forward began: overlapped = deferred - 1 = 5. A part that waited for the update before the
     next forward would hang there and fail on --comm-timeout; one that ran it on the main thread would count
     0. The bits stay those of the serial run.
  3. Resume: a serial run checkpointed at step 3 resumes with --overlap-update, and an overlapped one resumes
     serially, each ending byte-equal to the uninterrupted serial run.
  4. Refused at start with both flags named: --overlap-update without --delayed-update, with --zero 2, with
     --tp 2, with --optimizer lamb, with --offload-activations.
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
from test_offload import FAILS, Env, check  # noqa: E402


def rows(path: str):
    keys = ("step", "loss", "grad_norm", "lr", "val_loss")
    with open(path) as f:
        return [{k: j[k] for k in keys if k in j} for j in map(json.loads, f)]


DELAYED = ["--delayed-update"]
OVERLAP = ["--delayed-update", "--overlap-update"]


def equality(e: Env) -> None:
    off = ["--offload", "optimizer", "--offload-dir", e.odir, "--offload-tile", 4096]
    layouts = {
        "nproc1": ["--nproc", 1],
        "nproc1_offload": ["--nproc", 1] + off,
        "dp2_zero0": ["--nproc", 2, "--zero", 0],
        "dp2_zero1": ["--nproc", 2, "--zero", 1],
        "dp2_zero0_offload": ["--nproc", 2, "--zero", 0] + off,
        "dp2_zero1_offload": ["--nproc", 2, "--zero", 1] + off,
        "bf16": ["--nproc", 1, "--precision", "bf16"],
        "accumulation": ["--nproc", 1, "--micro-batch-size", 2],
        "eval": ["--nproc", 1, "--eval-every", 2, "--eval-batches", 2, "--val-data", e.data],
    }
    for name, flags in layouts.items():
        out = {}
        for mode, method in (("serial", DELAYED), ("overlap", OVERLAP)):
            m = os.path.join(e.wd, f"{name}.{mode}.jsonl")
            w = os.path.join(e.wd, f"{name}.{mode}.safetensors")
            r = e.run(flags + method + ["--metrics", m, "--save", w])
            check(r.returncode == 0, f"{name} {mode}: exit 0")
            out[mode] = (m, w)
            check(os.listdir(e.odir) == [], f"{name} {mode}: nothing left in --offload-dir")
        if all(os.path.exists(p) for p in out["serial"] + out["overlap"]):
            a, b = rows(out["serial"][0]), rows(out["overlap"][0])
            check(len(a) == 6 and a == b, f"{name}: losses, grad norms, lr (and val losses) equal bit for bit "
                  f"({len(a)} steps, {sum('val_loss' in x for x in a)} evaluations)")
            check(filecmp.cmp(out["serial"][1], out["overlap"][1], shallow=False), f"{name}: final weights byte-equal")


def concurrent(e: Env) -> None:
    off = ["--offload", "optimizer", "--offload-dir", e.odir, "--offload-tile", 4096]
    for name, flags in (("nproc1_offload", ["--nproc", 1] + off), ("dp2_zero1", ["--nproc", 2, "--zero", 1])):
        s = os.path.join(e.wd, f"held.{name}.summary.json")
        w = os.path.join(e.wd, f"held.{name}.safetensors")
        ref = os.path.join(e.wd, f"held.{name}.serial.safetensors")
        r = subprocess.run(e.cmd(flags + OVERLAP + ["--summary", s, "--save", w, "--comm-timeout", 20]),
                           capture_output=True, text=True, timeout=120, env={**os.environ, "MESHTRAIN_OVERLAP_HOLD": "1"})
        check(r.returncode == 0, f"held {name}: exit 0" + ("" if r.returncode == 0 else ": " + r.stderr[-400:]))
        if r.returncode != 0:
            continue
        with open(s) as f:
            o = json.load(f).get("overlap_update")
        check(isinstance(o, dict) and o.get("deferred") == 6 and o.get("overlapped") == 5,
              f"held {name}: 6 updates deferred, 5 still running when the next step's forward began ({o})")
        check(e.run(flags + DELAYED + ["--save", ref]).returncode == 0, f"held {name}: serial run exit 0")
        check(filecmp.cmp(ref, w, shallow=False), f"held {name}: final weights byte-equal to the serial run")


def resume(e: Env) -> None:
    full = os.path.join(e.wd, "resume.full.safetensors")
    check(e.run(DELAYED + ["--save", full]).returncode == 0, "uninterrupted serial run")
    for first, second, tag in ((DELAYED, OVERLAP, "serial -> overlapped"), (OVERLAP, DELAYED, "overlapped -> serial")):
        key = "a" if first is DELAYED else "b"
        ck = os.path.join(e.wd, "ck_" + key)
        shutil.rmtree(ck, ignore_errors=True)
        r = e.run(first + ["--checkpoint-dir", ck, "--save-every", 3, "--stop-at-step", 3])
        check(r.returncode == 0, f"{tag}: first half exit 0")
        w = os.path.join(e.wd, f"resume.{key}.safetensors")
        r = e.run(second + ["--resume", ck, "--save", w])
        check(r.returncode == 0, f"{tag}: second half exit 0")
        check(os.path.exists(w) and filecmp.cmp(full, w, shallow=False),
              f"{tag}: final weights byte-equal to the uninterrupted run")


def refused(e: Env) -> None:
    cases = [
        (["--overlap-update"], ["--overlap-update", "--delayed-update"]),
        (OVERLAP + ["--nproc", 2, "--zero", 2], ["--overlap-update", "--zero 2"]),
        (OVERLAP + ["--nproc", 2, "--tp", 2], ["--overlap-update", "--tp 2"]),
        (OVERLAP + ["--optimizer", "lamb"], ["--overlap-update", "--optimizer lamb"]),
        (OVERLAP + ["--offload-activations", "--offload-dir", e.odir], ["--overlap-update", "--offload-activations"]),
    ]
    for flags, names in cases:
        r = e.run(flags, expect_ok=False)
        check(r.returncode != 0 and all(n in r.stderr for n in names),
              f"refused: {' '.join(map(str, flags))} (exit {r.returncode}, names {names})"
              + ("" if r.returncode != 0 and all(n in r.stderr for n in names) else ": " + r.stderr[-300:]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    e = Env(a.meshtrain, a.workdir)
    for part in (equality, concurrent, resume, refused):
        if not a.only or a.only == part.__name__:
            part(e)
    print(f"{len(FAILS)} failed" if FAILS else "all passed")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
