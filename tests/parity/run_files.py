"""Reading and writing the files of a training run, shared by the test scripts (not a test itself): a token
shard of random tokens, a checkpoint's tensors as raw bytes (for bit-for-bit comparisons), and the computations
a Chrome trace recorded."""
import json
import struct

import numpy as np


def write_random_shard(path, n, vocab):
    """An llm.c token shard (header 20240520, version 1, n) of n uniformly random tokens below vocab (seed 0)."""
    toks = np.random.RandomState(0).randint(0, vocab, size=n).astype(np.uint16)
    hdr = np.zeros(256, dtype=np.int32)
    hdr[:3] = [20240520, 1, n]
    with open(path, "wb") as f:
        f.write(hdr.tobytes() + toks.tobytes())


def tensor_bytes(path):
    """name -> raw bytes of each tensor in a safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    base = 8 + n
    return {k: raw[base + v["data_offsets"][0]:base + v["data_offsets"][1]] for k, v in head.items()
            if k != "__metadata__"}


def trace_computations(trace_path, rank):
    """(name, start, end) of each forward and backward a Chrome trace recorded for world rank `rank` ("F3", "B2":
    window numbering), in time order."""
    with open(trace_path) as f:
        d = json.load(f)
    ev = d["traceEvents"] if isinstance(d, dict) else d
    comp = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("forward", "backward") and e.get("pid") == rank]
    comp.sort(key=lambda e: e["ts"])
    return [(e["name"], e["ts"], e["ts"] + e["dur"]) for e in comp]
