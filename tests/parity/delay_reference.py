"""The delay-1 update rule (PipeDream-2BW, the delayed parameter update) written from its definition, on
gpt_reference.py's model, AdamW, clipping and learning-rate schedule. Not a test itself (no test_ prefix).

The rule: the gradient used at step t is that of step t's global batch evaluated at the weights W(t-1)
(W(-1) = W(0)), clipped by its own global norm, and applied by the optimizer to W(t): W(t+1) = opt(W(t), g_t).
The row of step t reports the loss and the pre-clip norm of that evaluation.

`delay` generalizes it to W(t - delay) (W(negative) = W(0)): delay 1 is the rule; 0 is the exact run and 2 a
rule off by one step, which the tests use to show that their comparison can tell them apart."""
from __future__ import annotations

import os
import sys
from typing import Dict, List, Tuple

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_reference as ref  # noqa: E402


def train_delayed(init_path: str, data_path: str, B: int, T: int, steps: int, hp: ref.HParams, delay: int = 1
                  ) -> Tuple[List[Dict[str, float]], List[Dict[str, np.ndarray]]]:
    """Returns ([{step, loss, lr, grad_norm, clipped}] per step, [W(0), W(1), ..., W(steps)] as
    {name: float32 array}). W(steps) is the final master, what --save writes."""
    cfg, w = ref.load_model(init_path)
    tokens = ref.read_shard(data_path)
    names = list(w)
    opt = ref.AdamW(w, hp.beta1, hp.beta2, hp.eps, hp.weight_decay)
    versions = [{n: t.detach().clone() for n, t in w.items()}]  # versions[t] = W(t)
    history = []
    for s in range(steps):
        read = {n: t.clone().requires_grad_(True) for n, t in versions[max(0, s - delay)].items()}
        x, y = (torch.from_numpy(a) for a in ref.get_batch(tokens, s, B, T))
        loss = ref.gpt_loss(read, x, y, cfg)
        grads = dict(zip(names, torch.autograd.grad(loss, [read[n] for n in names])))
        norm = ref.global_grad_norm(grads.values())
        scale = ref.clip_scale(norm, hp.grad_clip)
        if scale < 1.0:
            grads = {n: g * scale for n, g in grads.items()}
        lr = ref.lr_at(s, hp.lr, hp.min_lr, hp.warmup_steps, steps)
        opt.step(w, grads, s + 1, lr)  # w holds W(s): the master the optimizer updates
        versions.append({n: t.detach().clone() for n, t in w.items()})
        history.append({"step": s, "loss": float(loss), "lr": lr, "grad_norm": norm, "clipped": scale < 1.0})
    return history, [{n: t.numpy().astype(np.float32) for n, t in v.items()} for v in versions]
