"""Helpers shared by the benchmark scripts in bench/ (not a benchmark itself)."""
import os
import subprocess

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
