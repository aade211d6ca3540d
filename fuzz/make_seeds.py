#!/usr/bin/env python3
"""Writes the seed corpora in fuzz/corpus/<target>/: small valid files of each format (and a few
near-misses), from the formats' definitions in docs/formats.md. Run once by hand when a format changes;
the fuzzer grows its own corpus from these in a scratch directory during CI."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, raw bytes)."""
    header, off, blob = {}, 0, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blob += raw
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + blob


def f32(*v):
    return struct.pack("<%df" % len(v), *v)


def parts(*files):
    """The fuzz targets' multi-file input: each file but the last behind a 2-byte little-endian length."""
    out = b""
    for f in files[:-1]:
        out += struct.pack("<H", len(f)) + f
    return out + files[-1]


# safetensors
put("safetensors", "f32", safetensors([("a", "F32", [2, 2], f32(1, 2, 3, 4))], {"format": "pt"}))
put("safetensors", "mixed", safetensors([
    ("w", "BF16", [3], struct.pack("<3H", 0x3F80, 0x4000, 0xC040)),
    ("h", "F16", [2], struct.pack("<2H", 0x3C00, 0x7C00)),
    ("d", "F64", [1], struct.pack("<d", 2.5)),
    ("i", "I32", [2], struct.pack("<2i", 7, -7)),
    ("e", "F32", [0, 4], b"")]))
put("safetensors", "scalar", safetensors([("s", "F32", [], f32(3.0))]))

# token shards (llm.c version 1): 256 int32 header, uint16 tokens
def shard(tokens, magic=20240520, version=1):
    head = struct.pack("<3i", magic, version, len(tokens)) + b"\0" * (1024 - 12)
    return head + struct.pack("<%dH" % len(tokens), *tokens)

put("token_shard", "small", shard([1, 2, 3, 50256, 0]))
put("token_shard", "one", shard([65535]))

# IDX: the first byte of the fuzz input picks images (odd) or labels (even)
put("idx", "images", b"\x01" + struct.pack(">4I", 2051, 2, 2, 3) + bytes(range(12)))
put("idx", "labels", b"\x00" + struct.pack(">2I", 2049, 5) + bytes([0, 1, 2, 3, 9]))

# a checkpoint of the fuzz target's model: wte.weight [4, 3], ln.bias [3]; AdamW's m and v; one factored row
wte = f32(*[0.1 * i for i in range(12)])
ln = f32(0.0, 0.5, -0.5)
model = safetensors([("wte.weight", "F32", [4, 3], wte), ("ln.bias", "F32", [3], ln)], {"n_layer": "1"})
opt = safetensors([("adamw.m/wte.weight", "F32", [4, 3], wte), ("adamw.m/ln.bias", "F32", [3], ln),
                   ("adamw.v/wte.weight", "F32", [4, 3], wte), ("adamw.v/ln.bias", "F32", [3], ln),
                   ("adafactor.row/wte.weight", "F32", [4], f32(1, 2, 3, 4))])
state = json.dumps({"step": 5, "seed": 1, "data": {"position": 40}}).encode()
put("checkpoint", "complete", parts(state, model, opt))
put("checkpoint", "wrong_step", parts(json.dumps({"step": 6}).encode(), model, opt))
put("checkpoint", "bf16_model", parts(state, safetensors([
    ("wte.weight", "BF16", [4, 3], struct.pack("<12H", *([0x3F80] * 12))),
    ("transformer.ln.bias", "F32", [3], ln)]), opt))

# a run directory: metrics rows, summary, trace
rows = b"".join(json.dumps({"step": i, "loss": 3.0 - 0.1 * i, "lr": 1e-3, "norm": 1.5}).encode() + b"\n"
                for i in range(4))
summary = json.dumps({"tokens_per_s": 1234.5, "pipeline": {"schedule": "1f1b", "stages": 2}}).encode()
trace = json.dumps({"traceEvents": [{"name": "forward", "ph": "X", "ts": 0, "dur": 5, "pid": 0, "tid": 1}]}).encode()
put("run_data", "run", parts(rows, summary, trace))
put("run_data", "metrics_only", parts(rows, b"", b""))
