"""Shared plumbing for the parity tests: arguments, running the meshtrain binary, reading its metrics, and
collecting failures so that one run reports every mismatch (not only the first) before exiting 1.

Not a test itself (no test_ prefix, so CTest does not pick it up)."""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence


def parse_args(description: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--meshtrain", required=True, help="path of the meshtrain binary under test")
    ap.add_argument("--workdir", required=True, help="scratch directory (created; files are left there)")
    args = ap.parse_args()
    args.meshtrain = os.path.abspath(args.meshtrain)
    os.makedirs(args.workdir, exist_ok=True)
    args.workdir = os.path.abspath(args.workdir)
    return args


def single_thread_env() -> Dict[str, str]:
    """The machine is shared: the binary under test gets one BLAS/OpenMP thread besides --threads 1."""
    env = dict(os.environ)
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


class Run:
    def __init__(self, cmd: Sequence[str], returncode: Optional[int], stdout: bytes, stderr: bytes,
                 seconds: float, timed_out: bool):
        self.cmd, self.returncode, self.stdout, self.stderr = list(cmd), returncode, stdout, stderr
        self.seconds, self.timed_out = seconds, timed_out

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.returncode == 0

    def describe(self) -> str:
        what = "timed out" if self.timed_out else f"exited {self.returncode}"
        err = self.stderr.decode("utf-8", "replace").strip()
        out = self.stdout.decode("utf-8", "replace").strip()
        tail = "\n".join((err or out).splitlines()[-15:])
        return f"`{shlex.join(self.cmd)}` {what} after {self.seconds:.1f}s" + (f"; output:\n{tail}" if tail else "")


def run(cmd: Sequence[str], timeout: float, log_prefix: Optional[str] = None) -> Run:
    """Runs cmd, never raising: a missing binary or a timeout is a failed Run. With log_prefix, stdout and
    stderr are also kept as <log_prefix>.stdout / .stderr for a look after the test."""
    cmd = [str(c) for c in cmd]
    print(f"$ {shlex.join(cmd)}", flush=True)
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                           env=single_thread_env())
        r = Run(cmd, p.returncode, p.stdout, p.stderr, time.monotonic() - t0, False)
    except subprocess.TimeoutExpired as e:
        r = Run(cmd, None, e.stdout or b"", e.stderr or b"", time.monotonic() - t0, True)
    except OSError as e:
        r = Run(cmd, 127, b"", str(e).encode(), time.monotonic() - t0, False)
    if log_prefix:
        with open(log_prefix + ".stdout", "wb") as f:
            f.write(r.stdout)
        with open(log_prefix + ".stderr", "wb") as f:
            f.write(r.stderr)
    print(f"  -> {'timed out' if r.timed_out else f'exit {r.returncode}'} in {r.seconds:.1f}s", flush=True)
    return r


class Checks:
    """Collects pass/fail results with messages; finish() prints the verdict and exits."""

    def __init__(self, name: str):
        self.name, self.failures, self.count = name, [], 0

    def check(self, cond: bool, msg: str) -> bool:
        self.count += 1
        if not cond:
            self.failures.append(msg)
            print(f"FAIL: {msg}", flush=True)
        return bool(cond)

    def fatal(self, msg: str) -> None:
        """A failure after which nothing else can be checked."""
        self.failures.append(msg)
        print(f"FAIL: {msg}", flush=True)
        self.finish()

    def finish(self) -> None:
        if self.failures:
            print(f"\n{self.name}: FAILED ({len(self.failures)} of {self.count} checks)")
            for m in self.failures:
                print(f"  - {m.splitlines()[0]}")
            sys.exit(1)
        if self.count == 0:  # a test that checked nothing has not passed
            print(f"\n{self.name}: FAILED (no checks ran)")
            sys.exit(1)
        print(f"\n{self.name}: PASSED ({self.count} checks)")
        sys.exit(0)


def read_metrics(path: str, steps: int, checks: Checks, first: int = 0, label: str = "") -> Optional[List[dict]]:
    """Parses the JSONL metrics file; returns the records of steps first..steps-1 in order, or None (after
    recording a failure) when the file is missing, malformed, or lacks or repeats a step (fewer rows than
    steps is a failure, so a run that stopped early cannot pass). Lines without a "step" key (a summary,
    say) are reported and skipped. loss, lr, grad_norm, tokens_per_s must be finite, tokens_per_s > 0."""
    if label:
        path_label = f"{label}: metrics file {path}"
    else:
        path_label = f"metrics file {path}"
    if not os.path.exists(path):
        checks.check(False, f"{path_label} was not written")
        return None
    records, bad = {}, []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                bad.append(f"line {n} is not JSON ({e})")
                continue
            if not isinstance(obj, dict):
                bad.append(f"line {n} is not a JSON object")
                continue
            if "step" not in obj:
                print(f"  note: metrics line {n} has no \"step\" key, skipped: {line.strip()[:120]}")
                continue
            s = obj["step"]
            if not isinstance(s, int) or isinstance(s, bool):
                bad.append(f"line {n}: step {s!r} is not an integer")
            elif s in records:
                bad.append(f"line {n}: step {s} appears twice")
            else:
                records[s] = obj
    if not checks.check(not bad, f"{path_label}: " + "; ".join(bad[:5])):
        return None
    want = list(range(first, steps))
    if not checks.check(sorted(records) == want,
                        f"{path_label} has steps {sorted(records)[:10]}{'...' if len(records) > 10 else ''}"
                        f" ({len(records)} records), expected exactly {first}..{steps - 1}"):
        return None
    for s in want:
        for key in ("loss", "lr", "grad_norm", "tokens_per_s"):
            v = records[s].get(key)
            if not checks.check(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
                                f"{path_label}: step {s}: {key} = {v!r} is not a finite number"):
                return None
        checks.check(records[s]["tokens_per_s"] > 0, f"{path_label}: step {s}: tokens_per_s "
                     f"{records[s]['tokens_per_s']} is not positive")
    return [records[s] for s in want]


def rel_diff(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)
