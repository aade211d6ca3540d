"""The resolved configuration a run writes beside its metrics (metrics.jsonl -> metrics.toml), read by an
independent TOML parser (Python's tomllib), not by meshtrain's own reader:
  1. It is valid TOML, and every value given on the command line comes back with its TOML type and value
     (integers as int, numbers as float with the exact double, switches as bool, lists as arrays, names and
     paths as strings).
  2. It is complete: every flag that `meshtrain train --help` lists appears, as a key or as a "# key: not set"
     comment, except --help, --config and the other model's flags (the MLP's: --labels, --val-labels,
     --val-fraction, --hidden for this GPT run).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tomllib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_checks import write_shard  # noqa: E402

MLP_ONLY = {"labels", "val-labels", "val-fraction", "hidden"}



def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    data = os.path.join(a.workdir, "data.bin")
    metrics = os.path.join(a.workdir, "metrics.jsonl")
    write_shard(data, 4000, 64, wobble=False)
    given = {
        "data": data, "metrics": metrics, "n-layer": 2, "n-head": 2, "n-embd": 16, "vocab-size": 64,
        "seq-len": 16, "batch-size": 4, "steps": 2, "lr": 1.23456789e-3, "min-lr": 0.0, "grad-clip": 0.5,
        "seed": 7, "recompute": True, "nproc": 2, "pp": 2, "stage-layers": [1, 1], "schedule": "gpipe",
        "micro-batch-size": 2, "comm-timeout": 60.0, "quiet": True,
    }
    argv = [a.meshtrain, "train"]
    for k, v in given.items():
        if v is True:
            argv.append(f"--{k}")
        elif isinstance(v, list):
            argv += [f"--{k}", ",".join(map(str, v))]
        else:
            argv += [f"--{k}", str(v)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        print("run failed:", r.stderr, file=sys.stderr)
        return 1
    path = os.path.join(a.workdir, "metrics.toml")
    text = open(path).read()
    cfg = tomllib.loads(text)  # raises on invalid TOML
    bad = []
    for k, v in given.items():
        if k not in cfg or type(cfg[k]) is not type(v) or cfg[k] != v:
            bad.append(f"{k}: given {v!r}, file has {cfg.get(k)!r}")
    help_text = subprocess.run([a.meshtrain, "train", "--help"], capture_output=True, text=True).stdout
    flags = set(re.findall(r"^\s+--([a-z0-9-]+)", help_text, re.M)) - {"help", "config"}
    commented = set(re.findall(r"^# ([a-z0-9-]+)[: =]", text, re.M))
    for f in sorted(flags):
        if f in MLP_ONLY:
            if f in cfg or f in commented:
                bad.append(f"{f}: an MLP flag in a GPT run's file")
        elif f not in cfg and f not in commented:
            bad.append(f"{f}: listed by --help, missing from the file")
    if len(flags) < 60:
        bad.append(f"only {len(flags)} flags parsed from --help")
    for b in bad:
        print("FAIL", b, file=sys.stderr)
    print(f"{len(cfg)} keys, {len(commented)} commented, {len(flags)} flags in --help; {len(bad)} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
