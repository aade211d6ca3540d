"""Helpers shared by the benchmark scripts in bench/ (not a benchmark itself)."""
import json
import os
import subprocess
import sys
import time

import numpy as np


def write_shard(path, n, vocab_size, seed=0):
    """An llm.c token shard of n uniformly random tokens below vocab_size (header 20240520, version 1, n)."""
    toks = np.random.RandomState(seed).randint(0, vocab_size, size=n).astype(np.uint16)
    hdr = np.zeros(256, dtype=np.int32)
    hdr[:3] = [20240520, 1, n]
    with open(path, "wb") as f:
        f.write(hdr.tobytes() + toks.tobytes())


def prepare_text(meshtrain, work, data):
    """Byte-level token shards of the first 90% (train) and the last 10% (validation) of tinyshakespeare."""
    with open(os.path.join(data, "tinyshakespeare.txt"), "rb") as f:
        text = f.read()
    cut = len(text) * 9 // 10
    for name, piece in (("train", text[:cut]), ("val", text[cut:])):
        txt = os.path.join(work, name + ".txt")
        with open(txt, "wb") as f:
            f.write(piece)
        subprocess.run([meshtrain, "prepare", "--text", txt, "--out", os.path.join(work, name + ".bin")],
                       check=True, capture_output=True, timeout=120)


def isa_flags():
    """The vector ISA flags /proc/cpuinfo lists, of those the figures depend on."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    break
    except OSError:
        pass
    return [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags]


def char_gpt_train_cmd(meshtrain, work, steps, lr, metrics, summary):
    """The `meshtrain train` command of the convergence benchmarks (delay_one_convergence.py, pp_convergence.py):
    a 4-layer character GPT (C 128, T 64) on prepare_text's shards in work, batch 16 in micro-batches of 4, cosine
    rate from lr to lr / 10 after 20 warm-up steps, clipping at 1.0, validation every 50 steps, seed 1337, one
    thread; the caller adds its layout flags."""
    return [meshtrain, "train", "--data", os.path.join(work, "train.bin"), "--val-data",
            os.path.join(work, "val.bin"), "--n-layer", "4", "--n-head", "4", "--n-embd", "128",
            "--vocab-size", "256", "--seq-len", "64", "--batch-size", "16", "--micro-batch-size", "4",
            "--steps", str(steps), "--lr", repr(lr), "--min-lr", repr(lr / 10), "--warmup-steps", "20",
            "--grad-clip", "1.0", "--eval-every", "50", "--eval-batches", "8", "--seed", "1337", "--threads", "1",
            "--quiet", "--metrics", metrics, "--summary", summary]


def run_train(cmd, metrics, summary, env, timeout, what):
    """Runs a training command that writes metrics and summary; exits naming `what` if it fails. Returns the
    validation losses [(step + 1, val_loss)], the mean step time over steps 2.. (s), the wall time (s) and the
    summary."""
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit(f"{what}: exit {r.returncode}\n{r.stderr[-2000:]}")
    with open(metrics) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    val = [(row["step"] + 1, row["val_loss"]) for row in rows if "val_loss" in row]
    step_s = sum(row["step_time_s"] for row in rows[1:]) / max(1, len(rows) - 1)
    with open(summary) as f:
        return val, step_s, wall, json.load(f)


def save_table(out, text, host, steps, results):
    """Prints text and writes it to out/table.md, and the runs to out/results.json (what --from-results reads)."""
    print("\n" + text)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(dict(host=host, steps=steps, runs=results), f, indent=1)
