"""LAMB and Adafactor written out from the formulas of issue 27 (not torch.optim: it has no Adafactor of this
form, and LAMB is not in it), with the interface of gpt_reference.AdamW: step(params, grads, t, lr), t = s + 1,
gradients already clipped by the global norm. Whole tensors only: this is the single-process math that every
meshtrain layout must reproduce. Not a test itself (no test_ prefix).

LAMB (You et al.): m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; r = m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd w
(wd only on tensors of >= 2 dims); trust = |w| / |r| over the whole tensor (1 when either norm is 0);
w -= lr trust r.
Adafactor (Shazeer and Stern, no momentum, no relative step sizes): beta2_t = 1 - t^-0.8; a matrix [rows, cols]
keeps R = beta2_t R + (1-beta2_t) rowmean(g^2 + eps1) and C likewise over columns, V = outer(R, C) / mean(R);
a vector keeps V = beta2_t V + (1-beta2_t)(g^2 + eps1); U = g / sqrt(V); U /= max(1, RMS(U));
w -= lr (U + wd w) (wd as above); eps1 = 1e-16.
"""
from __future__ import annotations

import math
from typing import Mapping

import torch

EPS1 = 1e-16


class Lamb:
    def __init__(self, params: Mapping[str, torch.Tensor], beta1: float, beta2: float, eps: float,
                 weight_decay: float):
        self.b1, self.b2, self.eps, self.wd = beta1, beta2, eps, weight_decay
        self.m = {n: torch.zeros_like(p) for n, p in params.items()}
        self.v = {n: torch.zeros_like(p) for n, p in params.items()}
        self.trust = {}  # the last step's trust ratio per tensor (for the test's setup checks)

    @torch.no_grad()
    def step(self, params: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor], t: int,
             lr: float) -> None:
        bc1, bc2 = 1.0 - self.b1 ** t, 1.0 - self.b2 ** t
        for n, w in params.items():
            g, m, v = grads[n], self.m[n], self.v[n]
            m.mul_(self.b1).add_((1.0 - self.b1) * g)
            v.mul_(self.b2).add_((1.0 - self.b2) * g * g)
            r = (m / bc1) / (torch.sqrt(v / bc2) + self.eps)
            if w.dim() >= 2:
                r = r + self.wd * w
            wn, rn = float(w.double().norm()), float(r.double().norm())
            trust = 1.0 if wn == 0.0 or rn == 0.0 else wn / rn
            self.trust[n] = trust
            w.sub_(lr * trust * r)


class Adafactor:
    def __init__(self, params: Mapping[str, torch.Tensor], weight_decay: float):
        self.wd = weight_decay
        self.R = {n: torch.zeros(p.shape[0], dtype=p.dtype) for n, p in params.items() if p.dim() == 2}
        self.C = {n: torch.zeros(p.shape[1], dtype=p.dtype) for n, p in params.items() if p.dim() == 2}
        self.V = {n: torch.zeros_like(p) for n, p in params.items() if p.dim() == 1}
        self.rms = {}  # the last step's RMS(U) per tensor (for the test's setup checks)

    @torch.no_grad()
    def step(self, params: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor], t: int,
             lr: float) -> None:
        b2 = 1.0 - t ** -0.8
        for n, w in params.items():
            g2 = grads[n] * grads[n] + EPS1
            if w.dim() == 2:
                self.R[n] = b2 * self.R[n] + (1.0 - b2) * g2.mean(dim=1)
                self.C[n] = b2 * self.C[n] + (1.0 - b2) * g2.mean(dim=0)
                V = torch.outer(self.R[n], self.C[n]) / self.R[n].mean()
            else:
                assert w.dim() == 1, f"{n}: Adafactor here factors matrices and keeps vectors whole"
                self.V[n] = b2 * self.V[n] + (1.0 - b2) * g2
                V = self.V[n]
            U = grads[n] / torch.sqrt(V)
            rms = math.sqrt(float((U.double() ** 2).mean()))
            self.rms[n] = rms
            U = U / max(1.0, rms)
            if w.dim() >= 2:
                U = U + self.wd * w
            w.sub_(lr * U)
