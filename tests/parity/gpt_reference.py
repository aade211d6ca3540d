"""Independent PyTorch reference for meshtrain's GPT: the judge of the C++ trainer in the parity tests.

What lives here: a safetensors reader/writer (json + numpy), the llm.c token shard format, a from-scratch
GPT-2 (explicit ops, no torch.nn layers), the global-batch rule, AdamW + global-norm clipping + warmup/cosine
LR written out by hand, `train` (the whole conformance run; its loop `optimize` is shared with the MoE
reference, moe_reference.py) and greedy generation. It shares no code with the C++ side; every formula
below is the conformance interface, written a second time.

What does not live here: anything fast. This is float32 torch with plain ops, meant to be obviously right;
tests/parity/test_reference_selfcheck.py checks it against torch.optim.AdamW, clip_grad_norm_, a
pure-Python loop forward and float64 gradcheck.

Legend: B batch (windows), T sequence length, C n_embd, H n_head, hs = C/H head size, V vocab size,
L n_layer, Tmax n_positions, s step (0-based), t = s+1 (AdamW step count), W warmup steps, S total steps.
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, asdict
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

# ----------------------------------------------------------------------------------------------------------
# safetensors: [u64 little-endian header size N][N bytes of JSON, space padded][raw little-endian data].
# The JSON maps name -> {"dtype", "shape", "data_offsets": [begin, end)} (offsets relative to the data
# start) plus an optional "__metadata__" of string -> string.

_ST_DTYPES = {  # safetensors dtype -> numpy dtype as stored on disk
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U8": np.dtype("u1"), "U16": np.dtype("<u2"), "BOOL": np.dtype("?"),
}
_NP_TO_ST = {np.dtype("float64"): "F64", np.dtype("float32"): "F32", np.dtype("float16"): "F16",
             np.dtype("int64"): "I64", np.dtype("int32"): "I32", np.dtype("int16"): "I16",
             np.dtype("int8"): "I8", np.dtype("uint8"): "U8", np.dtype("uint16"): "U16",
             np.dtype("bool"): "BOOL"}
_MAX_HEADER = 100 * 1024 * 1024


class FormatError(ValueError):
    """A file that does not follow its format; the message names the file and the thing at fault."""


def _st_header_bytes(entries: Mapping[str, dict], metadata: Optional[Mapping[str, str]]) -> bytes:
    header = {}
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(f"safetensors metadata must map str to str, got {k!r}: {v!r}")
        header["__metadata__"] = dict(metadata)
    header.update(entries)
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * ((-len(raw)) % 8)  # pad so the data section starts 8-byte aligned
    return raw


def _st_layout(specs: Sequence[Tuple[str, str, Sequence[int]]]) -> Tuple[Dict[str, dict], int]:
    entries, offset = {}, 0
    for name, st_dtype, shape in specs:
        if name == "__metadata__" or name in entries:
            raise ValueError(f"bad or duplicate tensor name {name!r}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * _ST_DTYPES[st_dtype].itemsize
        entries[name] = {"dtype": st_dtype, "shape": [int(d) for d in shape],
                         "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    return entries, offset


def write_safetensors(path: str, tensors: Mapping[str, np.ndarray],
                      metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes numpy arrays (kept in the given order) as one safetensors file."""
    arrays = {name: np.asarray(a) for name, a in tensors.items()}
    specs = []
    for name, a in arrays.items():
        if a.dtype not in _NP_TO_ST:
            raise TypeError(f"tensor {name}: dtype {a.dtype} has no safetensors name")
        specs.append((name, _NP_TO_ST[a.dtype], a.shape))
    entries, _ = _st_layout(specs)
    with open(path, "wb") as f:
        raw = _st_header_bytes(entries, metadata)
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, a in arrays.items():
            f.write(np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes())


def write_safetensors_streaming(path: str, specs: Sequence[Tuple[str, str, Sequence[int]]],
                                fill: Callable[[str, Tuple[int, ...]], Iterable[np.ndarray]],
                                metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes a file too big to hold in memory: `specs` is [(name, dtype, shape)] in file order and
    fill(name, shape) yields that tensor's values as flat chunks (in row-major order, any chunk sizes)."""
    entries, _ = _st_layout(specs)
    with open(path, "wb") as f:
        raw = _st_header_bytes(entries, metadata)
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, st_dtype, shape in specs:
            want = entries[name]["data_offsets"][1] - entries[name]["data_offsets"][0]
            wrote = 0
            for chunk in fill(name, tuple(shape)):
                b = np.ascontiguousarray(chunk, dtype=_ST_DTYPES[st_dtype]).tobytes()
                f.write(b)
                wrote += len(b)
            if wrote != want:
                raise ValueError(f"{path}: fill wrote {wrote} bytes for {name}, expected {want}")


def read_safetensors_header(path: str) -> Tuple[Dict[str, dict], Dict[str, str], int]:
    """Returns (entries, metadata, data_start) after checking the header against the file size."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise FormatError(f"{path}: {size} bytes, too short for a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or 8 + n > size:
            raise FormatError(f"{path}: header size {n} does not fit in a file of {size} bytes")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise FormatError(f"{path}: header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise FormatError(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    data_len = size - 8 - n
    spans = []
    for name, e in header.items():
        try:
            dtype, shape, (begin, end) = e["dtype"], e["shape"], e["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise FormatError(f"{path}: tensor {name}: malformed entry {e!r}") from None
        if dtype not in _ST_DTYPES:
            raise FormatError(f"{path}: tensor {name}: unsupported dtype {dtype}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * _ST_DTYPES[dtype].itemsize
        if not (0 <= begin <= end <= data_len) or end - begin != nbytes:
            raise FormatError(f"{path}: tensor {name}: data_offsets [{begin}, {end}) wrong for dtype "
                              f"{dtype} shape {shape} ({nbytes} bytes) in a data section of {data_len}")
        spans.append((begin, end, name))
    spans.sort()
    pos = 0
    for begin, end, name in spans:  # the data section must be covered exactly, without overlap
        if begin != pos:
            raise FormatError(f"{path}: tensor {name} starts at {begin}, expected {pos} (hole or overlap)")
        pos = end
    if pos != data_len:
        raise FormatError(f"{path}: tensors cover {pos} bytes of a {data_len}-byte data section")
    return header, metadata, 8 + n


def read_safetensors(path: str, mmap: bool = False) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    """Returns ({name: array}, metadata) in file order. BF16 is widened to float32. With mmap=True the
    arrays are read-only views of the file (for files larger than is comfortable to copy)."""
    entries, metadata, start = read_safetensors_header(path)
    base = np.memmap(path, dtype=np.uint8, mode="r") if mmap else None
    out = {}
    with open(path, "rb") as f:
        for name, e in sorted(entries.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            dt = _ST_DTYPES[e["dtype"]]
            begin, end = e["data_offsets"]
            if base is not None:
                a = base[start + begin:start + end].view(dt)
            else:
                f.seek(start + begin)
                a = np.frombuffer(f.read(end - begin), dtype=dt)
            a = a.reshape(e["shape"])
            if e["dtype"] == "BF16":
                a = (a.astype(np.uint32) << 16).view(np.float32)
            out[name] = a
    return out, metadata


# ----------------------------------------------------------------------------------------------------------
# Token shards (llm.c): 256 int32 little-endian header ([0] magic, [1] version, [2] token count), then the
# tokens as uint16.

SHARD_MAGIC, SHARD_VERSION, SHARD_HEADER_INTS = 20240520, 1, 256


def write_shard(path: str, tokens: np.ndarray) -> None:
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.size == 0 or tokens.min() < 0 or tokens.max() > 65535:
        raise ValueError("tokens must be a non-empty 1-D array of values in [0, 65535]")
    header = np.zeros(SHARD_HEADER_INTS, dtype="<i4")
    header[:3] = (SHARD_MAGIC, SHARD_VERSION, tokens.size)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())


def read_shard(path: str) -> np.ndarray:
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(4 * SHARD_HEADER_INTS), dtype="<i4")
        if header.size != SHARD_HEADER_INTS or header[0] != SHARD_MAGIC or header[1] != SHARD_VERSION:
            raise FormatError(f"{path}: not a version-{SHARD_VERSION} token shard (bad magic or version)")
        n = int(header[2])
        tokens = np.frombuffer(f.read(), dtype="<u2")
    if tokens.size != n or n <= 0:
        raise FormatError(f"{path}: header says {n} tokens, file holds {tokens.size}")
    return tokens


def get_batch(tokens: np.ndarray, step: int, B: int, T: int) -> Tuple[np.ndarray, np.ndarray]:
    """The global batch of step s: window j starts at o = (s*B + j)*T; inputs tokens[o, o+T), targets
    tokens[o+1, o+T+1); every index is taken modulo the token count. Returns int64 arrays [B, T]."""
    n = tokens.size
    o = (np.int64(step) * B + np.arange(B, dtype=np.int64))[:, None] * T      # [B, 1]
    pos = o + np.arange(T + 1, dtype=np.int64)[None, :]                       # [B, T+1]
    window = tokens[pos % n].astype(np.int64)
    return window[:, :-1], window[:, 1:]


# ----------------------------------------------------------------------------------------------------------
# Model configuration and the Hugging Face GPT-2 tensor names.

@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    n_positions: int

    def metadata(self) -> Dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items()}


def param_shapes(cfg: GPTConfig) -> List[Tuple[str, Tuple[int, ...]]]:
    """Every trainable tensor, in a fixed order, with its shape (Conv1D layout: y = x W + b)."""
    C, V = cfg.n_embd, cfg.vocab_size
    out = [("wte.weight", (V, C)), ("wpe.weight", (cfg.n_positions, C))]
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        out += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
                (p + "attn.c_attn.weight", (C, 3 * C)), (p + "attn.c_attn.bias", (3 * C,)),
                (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
                (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
                (p + "mlp.c_fc.weight", (C, 4 * C)), (p + "mlp.c_fc.bias", (4 * C,)),
                (p + "mlp.c_proj.weight", (4 * C, C)), (p + "mlp.c_proj.bias", (C,))]
    out += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    return out


def is_buffer_name(name: str) -> bool:
    """The causal-mask buffers of Hugging Face checkpoints: not parameters, dropped on load."""
    return name.endswith(".attn.bias") or name.endswith(".attn.masked_bias")


def normalize_names(tensors: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Strips a leading "transformer." and drops attention mask buffers (as meshtrain does on load)."""
    out = {}
    for name, a in tensors.items():
        if name.startswith("transformer."):
            name = name[len("transformer."):]
        if not is_buffer_name(name):
            out[name] = a
    return out


def config_from_weights(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str],
                        n_head: Optional[int] = None) -> GPTConfig:
    """Shapes come from the tensors; n_head from the argument, else from the metadata (it cannot be read
    off any shape). Checks that every expected tensor is present with the right shape and none is extra."""
    if n_head is None:
        if "n_head" not in metadata:
            raise FormatError("n_head is neither in the file's __metadata__ nor given")
        n_head = int(metadata["n_head"])
    V, C = tensors["wte.weight"].shape
    n_layer = 0
    while f"h.{n_layer}.ln_1.weight" in tensors:
        n_layer += 1
    cfg = GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=C, vocab_size=V,
                    n_positions=tensors["wpe.weight"].shape[0])
    for key in ("n_layer", "n_embd", "vocab_size", "n_positions"):
        if key in metadata and int(metadata[key]) != getattr(cfg, key):
            raise FormatError(f"metadata {key}={metadata[key]} but the tensors say {getattr(cfg, key)}")
    if C % n_head:
        raise FormatError(f"n_embd {C} is not divisible by n_head {n_head}")
    want = dict(param_shapes(cfg))
    for name, shape in want.items():
        if name not in tensors or tuple(tensors[name].shape) != shape:
            got = tuple(tensors[name].shape) if name in tensors else "missing"
            raise FormatError(f"tensor {name}: expected shape {shape}, got {got}")
    extra = sorted(set(tensors) - set(want))
    if extra:
        raise FormatError(f"unexpected tensors: {extra[:5]}")
    return cfg


def load_model(path: str, n_head: Optional[int] = None, dtype=torch.float32,
               mmap: bool = False) -> Tuple[GPTConfig, Dict[str, torch.Tensor]]:
    raw, metadata = read_safetensors(path, mmap=mmap)
    arrays = normalize_names(raw)
    cfg = config_from_weights(arrays, metadata, n_head)
    params = {name: torch.tensor(np.asarray(arrays[name]), dtype=dtype) for name, _ in param_shapes(cfg)}
    return cfg, params


def save_model(path: str, cfg: GPTConfig, params: Mapping[str, torch.Tensor]) -> None:
    write_safetensors(path, {n: params[n].detach().to(torch.float32).numpy() for n, _ in param_shapes(cfg)},
                      cfg.metadata())


# ----------------------------------------------------------------------------------------------------------
# The model, as explicit tensor ops on a dict of parameters (float32 or float64, whatever they are).

LN_EPS = 1e-5


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    mean = x.mean(dim=-1, keepdim=True)
    xc = x - mean
    var = (xc * xc).mean(dim=-1, keepdim=True)  # biased variance, as GPT-2
    return xc * torch.rsqrt(var + LN_EPS) * w + b


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def softmax_last(x: torch.Tensor) -> torch.Tensor:
    e = torch.exp(x - x.max(dim=-1, keepdim=True).values.detach())  # shift: exact math, no overflow
    return e / e.sum(dim=-1, keepdim=True)


def causal_self_attention(x: torch.Tensor, p: Mapping[str, torch.Tensor], prefix: str,
                          n_head: int) -> torch.Tensor:
    """x [B, T, C] -> [B, T, C]; q, k, v in that order from c_attn; heads as view(B, T, H, hs)."""
    B, T, C = x.shape
    hs = C // n_head
    qkv = x @ p[prefix + "c_attn.weight"] + p[prefix + "c_attn.bias"]            # [B, T, 3C]
    q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
    q = q.reshape(B, T, n_head, hs).transpose(1, 2)                              # [B, H, T, hs]
    k = k.reshape(B, T, n_head, hs).transpose(1, 2)
    v = v.reshape(B, T, n_head, hs).transpose(1, 2)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))                   # [B, H, T, T]
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
    scores = scores.masked_fill(future, float("-inf"))
    y = softmax_last(scores) @ v                                                 # [B, H, T, hs]
    y = y.transpose(1, 2).reshape(B, T, C)
    return y @ p[prefix + "c_proj.weight"] + p[prefix + "c_proj.bias"]


def mlp(x: torch.Tensor, p: Mapping[str, torch.Tensor], prefix: str) -> torch.Tensor:
    h = gelu_tanh(x @ p[prefix + "c_fc.weight"] + p[prefix + "c_fc.bias"])       # [B, T, 4C]
    return h @ p[prefix + "c_proj.weight"] + p[prefix + "c_proj.bias"]


def gpt_forward(p: Mapping[str, torch.Tensor], idx: torch.Tensor, cfg: GPTConfig,
                n_layer: Optional[int] = None) -> torch.Tensor:
    """idx [B, T] int64 -> logits [B, T, V]. n_layer < cfg.n_layer runs only the first blocks (used by
    tests to show that a comparison depends on the blocks)."""
    B, T = idx.shape
    if T > cfg.n_positions:
        raise ValueError(f"sequence length {T} exceeds n_positions {cfg.n_positions}")
    x = p["wte.weight"][idx] + p["wpe.weight"][:T]                                # [B, T, C]
    for i in range(cfg.n_layer if n_layer is None else n_layer):
        h = f"h.{i}."
        x = x + causal_self_attention(layer_norm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"]), p,
                                      h + "attn.", cfg.n_head)
        x = x + mlp(layer_norm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"]), p, h + "mlp.")
    x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"])
    return x @ p["wte.weight"].t()                                               # tied output


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over all B*T positions of -log softmax(logits)[target]."""
    z = logits - logits.max(dim=-1, keepdim=True).values.detach()
    lse = torch.log(torch.exp(z).sum(dim=-1))
    return (lse - z.gather(-1, targets.unsqueeze(-1)).squeeze(-1)).mean()


def gpt_loss(p: Mapping[str, torch.Tensor], idx: torch.Tensor, targets: torch.Tensor,
             cfg: GPTConfig) -> torch.Tensor:
    return cross_entropy(gpt_forward(p, idx, cfg), targets)


# ----------------------------------------------------------------------------------------------------------
# Optimizer: LR schedule, global-norm clipping, AdamW; exactly the conformance formulas.

@dataclass(frozen=True)
class HParams:
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 5
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0


def lr_at(step: int, lr: float, min_lr: float, warmup: int, total: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    span = total - warmup
    frac = (step - warmup) / span if span > 0 else 0.0
    return min_lr + (lr - min_lr) * (1.0 + math.cos(math.pi * frac)) / 2.0


def global_grad_norm(grads: Iterable[torch.Tensor]) -> float:
    """L2 norm over all gradients, accumulated in float64 (each unique tensor once)."""
    return math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))


def clip_scale(norm: float, clip: float) -> float:
    return min(1.0, clip / (norm + 1e-6))


class AdamW:
    """m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    p -= lr (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd p), wd only for tensors of 2+ dimensions."""

    def __init__(self, params: Mapping[str, torch.Tensor], beta1: float, beta2: float, eps: float,
                 weight_decay: float):
        self.b1, self.b2, self.eps, self.wd = beta1, beta2, eps, weight_decay
        self.m = {n: torch.zeros_like(p) for n, p in params.items()}
        self.v = {n: torch.zeros_like(p) for n, p in params.items()}

    @torch.no_grad()
    def step(self, params: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor], t: int,
             lr: float) -> None:
        bc1, bc2 = 1.0 - self.b1 ** t, 1.0 - self.b2 ** t
        for n, p in params.items():
            g, m, v = grads[n], self.m[n], self.v[n]
            m.mul_(self.b1).add_((1.0 - self.b1) * g)
            v.mul_(self.b2).add_((1.0 - self.b2) * g * g)
            update = (m / bc1) / (torch.sqrt(v / bc2) + self.eps)
            if p.dim() >= 2:
                update = update + self.wd * p
            p.sub_(lr * update)


# ----------------------------------------------------------------------------------------------------------
# The conformance run.

def train(init_path: str, data_path: str, B: int, T: int, steps: int, hyperparams,
          n_head: Optional[int] = None, dtype=torch.float32, make_optimizer=None
          ) -> Tuple[List[Dict[str, float]], Dict[str, np.ndarray]]:
    """Trains from the init file for `steps` steps. Returns ([{step, loss, lr, grad_norm, clipped}] per
    step, {name: final float32 array}). loss is the step's batch loss before the update, grad_norm the
    global norm before clipping, lr the rate used at that step. make_optimizer(params, hp) replaces AdamW
    (an object with step(params, grads, t, lr), as AdamW's)."""
    hp = hyperparams if isinstance(hyperparams, HParams) else HParams(**hyperparams)
    cfg, params = load_model(init_path, n_head=n_head, dtype=dtype)

    def step_loss(p, x, y, s):
        loss = gpt_loss(p, x, y, cfg)
        return loss, {"loss": float(loss)}
    return optimize(params, read_shard(data_path), B, T, steps, hp, step_loss, make_optimizer)


def optimize(params: Dict[str, torch.Tensor], tokens: np.ndarray, B: int, T: int, steps: int, hp: HParams,
             step_loss: Callable[[Mapping[str, torch.Tensor], torch.Tensor, torch.Tensor, int],
                                 Tuple[torch.Tensor, Dict[str, float]]],
             make_optimizer=None) -> Tuple[List[Dict[str, float]], Dict[str, np.ndarray]]:
    """The conformance loop shared by every model: for s in 0..steps-1, the global batch of step s, the
    gradient of step_loss(params, x [B, T], y [B, T], s)[0] over all params, global-norm clipping, the LR
    schedule and AdamW (updates `params` in place). History rows are {step, **metrics, lr, grad_norm,
    clipped} with the metrics step_loss returns beside its loss. make_optimizer(params, hp): another
    optimizer than AdamW."""
    opt = (make_optimizer(params, hp) if make_optimizer
           else AdamW(params, hp.beta1, hp.beta2, hp.eps, hp.weight_decay))
    names = list(params)
    history = []
    for s in range(steps):
        x, y = (torch.from_numpy(a) for a in get_batch(tokens, s, B, T))
        for q in params.values():
            q.requires_grad_(True)
        loss, metrics = step_loss(params, x, y, s)
        # allow_unused: an MoE expert that no admitted token reached this step is not in the graph; its
        # gradient is exactly zero (weight decay still moves it). A dense model uses every tensor.
        got = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
        grads = {n: torch.zeros_like(params[n]) if g is None else g for n, g in zip(names, got)}
        for q in params.values():
            q.requires_grad_(False)
        norm = global_grad_norm(grads.values())
        scale = clip_scale(norm, hp.grad_clip)
        if scale < 1.0:
            grads = {n: g * scale for n, g in grads.items()}
        lr = lr_at(s, hp.lr, hp.min_lr, hp.warmup_steps, steps)
        opt.step(params, grads, s + 1, lr)
        history.append({"step": s, **metrics, "lr": lr, "grad_norm": norm, "clipped": scale < 1.0})
    final = {n: params[n].detach().to(torch.float32).numpy().copy() for n in names}
    return history, final


@torch.no_grad()
def greedy_generate(p: Mapping[str, torch.Tensor], cfg: GPTConfig, prompt: Sequence[int],
                    max_new_tokens: int, n_layer: Optional[int] = None) -> Tuple[List[int], List[float]]:
    """Greedy (temperature 0) continuation of `prompt`, re-running the full forward each token on the
    last n_positions tokens. Returns (new token ids, the top-1 minus top-2 logit margin of each choice);
    a tiny margin means float rounding could legitimately pick the other token. n_layer as in gpt_forward."""
    ids = list(prompt)
    new, margins = [], []
    for _ in range(max_new_tokens):
        ctx = torch.tensor([ids[-cfg.n_positions:]], dtype=torch.int64)
        logits = gpt_forward(p, ctx, cfg, n_layer=n_layer)[0, -1]
        top = torch.topk(logits, 2)
        nxt = int(top.indices[0])
        new.append(nxt)
        margins.append(float(top.values[0] - top.values[1]))
        ids.append(nxt)
    return new, margins


def random_init(cfg: GPTConfig, seed: int, std: float = 0.02, ln_noise: float = 0.1,
                bias_std: float = 0.02, std_by_suffix: Optional[Mapping[str, float]] = None
                ) -> Dict[str, np.ndarray]:
    """Weights N(0, std) (std_by_suffix overrides by name ending, e.g. {"c_fc.weight": 0.2}); LayerNorm
    weights 1 + N(0, ln_noise); biases N(0, bias_std): every parameter differs from its neutral value, so
    a mix-up of any two tensors or a skipped bias changes the result."""
    return random_init_shapes(param_shapes(cfg), seed, std, ln_noise, bias_std, std_by_suffix)


def random_init_shapes(shapes: Iterable[Tuple[str, Sequence[int]]], seed: int, std: float = 0.02,
                       ln_noise: float = 0.1, bias_std: float = 0.02,
                       std_by_suffix: Optional[Mapping[str, float]] = None) -> Dict[str, np.ndarray]:
    """random_init over any (name, shape) list, drawn in its order (models with other tensors use it too)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes:
        noise = rng.standard_normal(shape)
        if name.startswith("ln_f.") or ".ln_" in name:
            out[name] = ((1.0 if name.endswith(".weight") else 0.0) + ln_noise * noise).astype(np.float32)
        elif name.endswith(".bias"):
            out[name] = (bias_std * noise).astype(np.float32)
        else:
            s = next((v for k, v in (std_by_suffix or {}).items() if name.endswith(k)), std)
            out[name] = (s * noise).astype(np.float32)
    return out
