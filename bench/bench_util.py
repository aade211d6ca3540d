"""Helpers shared by the benchmark scripts in bench/ (not a benchmark itself)."""
import numpy as np


def write_shard(path, n, vocab_size, seed=0):
    """An llm.c token shard of n uniformly random tokens below vocab_size (header 20240520, version 1, n)."""
    toks = np.random.RandomState(seed).randint(0, vocab_size, size=n).astype(np.uint16)
    hdr = np.zeros(256, dtype=np.int32)
    hdr[:3] = [20240520, 1, n]
    with open(path, "wb") as f:
        f.write(hdr.tobytes() + toks.tobytes())
