"""Independent PyTorch reference for `--precision bf16`, written from issue 24's rule:

  every matrix product of the model rounds its two inputs to bfloat16 (round to nearest even), multiplies,
  accumulates in float32 and returns float32 -- in forward (x W, q k^T, P v, x wte^T) and in backward
  (dY W^T and X^T dY for a linear layer; the same pair for each attention product and for the tied logits);
  everything else (LayerNorm, GELU, softmax, the loss, residual sums, gradients, clipping, AdamW, the master
  weights) stays float32.

The products are one autograd function, `bf16_matmul`, whose forward and backward both round their inputs
(torch's own float -> bfloat16 conversion, round to nearest even, shares nothing with meshtrain's) and
multiply in the working dtype. The model is gpt_reference's, written again with that function at every
product. Run in float64 (dtype=torch.float64: the same rounded inputs, float64 accumulation everywhere) it
measures how far float32 summation order alone moves a bf16 trajectory: the drift the parity tests allow.

Not a test itself (no test_ prefix)."""
from __future__ import annotations

import contextlib
import math
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

import gpt_reference as ref


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the nearest bfloat16 (ties to even), returned in x's dtype. float64 goes through float32
    first: meshtrain's inputs are float32 values, and the float64 run must round the same values."""
    return x.to(torch.float32).to(torch.bfloat16).to(x.dtype)


class Bf16Matmul(torch.autograd.Function):
    """a @ b with both inputs rounded; backward: dA = r(dY) r(b)^T, dB = r(a)^T r(dY), r = round_bf16.
    a [..., M, K], b [K, N] (a weight: its gradient sums over a's leading dims) or b [..., K, N] batched
    like a (attention)."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return torch.matmul(round_bf16(a), round_bf16(b))

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        a, b = ctx.saved_tensors
        ra, rb, rg = round_bf16(a), round_bf16(b), round_bf16(g)
        da = torch.matmul(rg, rb.transpose(-2, -1))
        if b.dim() == 2 and a.dim() > 2:  # a weight shared by all rows: X^T dY over the flattened rows
            db = torch.matmul(ra.reshape(-1, a.shape[-1]).t(), rg.reshape(-1, g.shape[-1]))
        else:
            db = torch.matmul(ra.transpose(-2, -1), rg)
        return da, db


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return Bf16Matmul.apply(a, b)


@contextlib.contextmanager
def bf16_products():
    """Within it, every `a @ b` of torch tensors is a product of the rule (Bf16Matmul). The MoE reference
    (moe_reference.py) and the dense one it builds on write every model product, and nothing else, as `@`
    (router, experts, attention, logits), so the MoE run under this context is the rule applied to it."""
    saved = torch.Tensor.__matmul__
    torch.Tensor.__matmul__ = lambda a, b: Bf16Matmul.apply(a, b)
    try:
        yield
    finally:
        torch.Tensor.__matmul__ = saved


def causal_self_attention(x: torch.Tensor, p: Mapping[str, torch.Tensor], prefix: str, n_head: int) -> torch.Tensor:
    B, T, C = x.shape
    hs = C // n_head
    qkv = mm(x, p[prefix + "c_attn.weight"]) + p[prefix + "c_attn.bias"]
    q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
    q = q.reshape(B, T, n_head, hs).transpose(1, 2)
    k = k.reshape(B, T, n_head, hs).transpose(1, 2)
    v = v.reshape(B, T, n_head, hs).transpose(1, 2)
    scores = mm(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # the scale after the product, in float32
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
    scores = scores.masked_fill(future, float("-inf"))
    y = mm(ref.softmax_last(scores), v)
    y = y.transpose(1, 2).reshape(B, T, C)
    return mm(y, p[prefix + "c_proj.weight"]) + p[prefix + "c_proj.bias"]


def mlp(x: torch.Tensor, p: Mapping[str, torch.Tensor], prefix: str) -> torch.Tensor:
    h = ref.gelu_tanh(mm(x, p[prefix + "c_fc.weight"]) + p[prefix + "c_fc.bias"])
    return mm(h, p[prefix + "c_proj.weight"]) + p[prefix + "c_proj.bias"]


def gpt_forward(p: Mapping[str, torch.Tensor], idx: torch.Tensor, cfg: ref.GPTConfig) -> torch.Tensor:
    B, T = idx.shape
    x = p["wte.weight"][idx] + p["wpe.weight"][:T]
    for i in range(cfg.n_layer):
        h = f"h.{i}."
        x = x + causal_self_attention(ref.layer_norm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"]), p, h + "attn.",
                                      cfg.n_head)
        x = x + mlp(ref.layer_norm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"]), p, h + "mlp.")
    x = ref.layer_norm(x, p["ln_f.weight"], p["ln_f.bias"])
    return mm(x, p["wte.weight"].t())  # tied logits: x and wte rounded; dwte = r(dlogits)^T r(x)


def train(init_path: str, data_path: str, B: int, T: int, steps: int, hp: ref.HParams,
          dtype=torch.float32) -> Tuple[List[Dict[str, float]], Dict[str, np.ndarray]]:
    """gpt_reference.train with the bf16 products: the same data, schedule, clipping and AdamW."""
    cfg, params = ref.load_model(init_path, dtype=dtype)

    def step_loss(p, x, y, s):
        loss = ref.cross_entropy(gpt_forward(p, x, cfg), y)
        return loss, {"loss": float(loss)}
    return ref.optimize(params, ref.read_shard(data_path), B, T, steps, hp, step_loss)
