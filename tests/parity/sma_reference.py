"""Crossbow's synchronous model averaging (SMA), written from the rule the paper states (Koliousis et al.,
"Crossbow: Scaling Deep Learning with Small Batch Sizes on Multi-GPU Servers", VLDB 2019, Algorithm 1), on
gpt_reference's model and AdamW. Not a test itself.

k learners; learner j takes windows [j b, (j + 1) b) of each step's global batch (b = B / k). Every learner
and the central model z start from the init (z_prev = z). One step s:
  g_j   = gradient of learner j's mean loss over its windows at its weights w_j
  g_j  *= min(1, clip / (|g_j| + 1e-6))                 (each learner clipped by its own norm)
  c_j   = alpha (w_j - z)                                (from the weights before the step)
  w_j   = AdamW_j(w_j, g_j) - c_j                        (AdamW_j: learner j's own moments, t = s + 1)
  z     = z + sum_j c_j + mu (z - z_prev),  z_prev = old z
Rows: loss = mean_j loss_j (the global batch's mean, each window at its learner's weights), grad_norm =
sqrt(mean_j |g_j|^2) before clipping. Returns the rows and z after the last step.
"""
from __future__ import annotations

import math
from typing import Dict, List, Tuple

import numpy as np
import torch

import gpt_reference as ref


def train_sma(init_path: str, data_path: str, B: int, T: int, steps: int, hp: ref.HParams, k: int,
              alpha: float, mu: float, dtype=torch.float32) -> Tuple[List[dict], Dict[str, np.ndarray]]:
    cfg, z = ref.load_model(init_path, dtype=dtype)
    names = list(z)
    z_prev = {n: t.clone() for n, t in z.items()}
    learners = [{n: t.clone() for n, t in z.items()} for _ in range(k)]
    opts = [ref.AdamW(w, hp.beta1, hp.beta2, hp.eps, hp.weight_decay) for w in learners]
    tokens = ref.read_shard(data_path)
    b = B // k
    rows = []
    for s in range(steps):
        x, y = (torch.from_numpy(a) for a in ref.get_batch(tokens, s, B, T))
        losses, grads, norms = [], [], []
        for j, w in enumerate(learners):
            for t in w.values():
                t.requires_grad_(True)
            loss = ref.gpt_loss(w, x[j * b:(j + 1) * b], y[j * b:(j + 1) * b], cfg)
            got = torch.autograd.grad(loss, [w[n] for n in names])
            for t in w.values():
                t.requires_grad_(False)
            losses.append(float(loss))
            grads.append(dict(zip(names, got)))
            norms.append(ref.global_grad_norm(got))
        lr = ref.lr_at(s, hp.lr, hp.min_lr, hp.warmup_steps, steps)
        csum = {n: torch.zeros_like(t) for n, t in z.items()}
        with torch.no_grad():
            for j, w in enumerate(learners):
                scale = ref.clip_scale(norms[j], hp.grad_clip)
                g = {n: v * scale for n, v in grads[j].items()} if scale < 1.0 else grads[j]
                c = {n: alpha * (w[n] - z[n]) for n in names}
                opts[j].step(w, g, s + 1, lr)
                for n in names:
                    w[n].sub_(c[n])
                    csum[n].add_(c[n])
            for n in names:
                old = z[n].clone()
                z[n] = old + csum[n] + mu * (old - z_prev[n])
                z_prev[n] = old
        rows.append({"step": s, "loss": float(np.mean(losses)), "lr": lr,
                     "grad_norm": math.sqrt(sum(v * v for v in norms) / k)})
    return rows, {n: z[n].detach().to(torch.float32).numpy().copy() for n in names}
