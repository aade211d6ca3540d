"""PipeDream (weight stashing, vertical sync) and PipeMare (no stash) written from the rule in
docs/parallelism.md ("PipeDream and PipeMare"), on gpt_reference.py's model, AdamW, clipping and learning-rate
schedule, simulated serially. Not a test itself (no test_ prefix).

The rule, as the reference follows it:
- the run is cut into windows of consecutive steps; a window ends after every step where the run evaluates,
  saves a checkpoint, stops or ends, after 64 steps at most, and after every step when the run flushes
  (fewer micro-batches per step than stages): `window_lengths` below. A window of K steps is one list over its
  K*m micro-batches, micro-batch i of the window's step t numbered k = t*m + i;
- each of the p stages runs 1F1B's order over the window's K*m micro-batches (warm-up of p-1-j forwards on
  stage j, then one forward one backward, then the remaining backwards; no step boundary inside a window) and
  updates right after each micro-batch's backward; the window ends with every backward and update done;
- version n of every stage is the model after n micro-batch updates (update n = s*m + i); the forward of
  window micro-batch k on stage j reads the newest version of stage j at that point of its list (the window's
  first update number plus the updates before it in the window's list); vertical sync: every stage reads stage
  0's; the backward reads the forward's version (stash) or the stage's newest (pipemare), the forward's
  activations kept;
- update n: the gradient of micro-batch i's mean loss over all stages (the tied wte: embedding part at stage
  0's version, logits part at stage p-1's, summed), clipped by its own global norm, AdamW with t = n + 1 and
  the learning rate of step s;
- the row of step s: mean of the m losses, mean of the m pre-clip norms, lr(s).
- PipeMare's learning-rate rescheduling (lr_anneal = K > 0, "PipeMare's corrections"): update n applies to the
  parameters of stage j the learning rate lr(s) * tau_j ** -(1 - min(n / K, 1)), tau_j = p - j; the tied wte
  (held by stages 0 and p-1) takes tau = p, stage 0's; wpe is stage 0's, ln_f stage p-1's. Clipping and AdamW's
  bias correction are unchanged (the factor scales only the step size, weight decay with it).

A backward that reads other weights than its forward (pipemare): for every product of a parameter w with an
activation x the forward value is x*W_f and the backward multiplies by W_b. Written as
f(x, L) - f(x, L).detach() + f(x, W_f).detach() with L the leaf holding W_b: the value is exactly f(x, W_f),
the gradient to x is f's at W_b and to L is f's with the forward's x. When W_f is W_b it is f(x, L)."""
from __future__ import annotations

import math
import os
import sys
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_reference as ref  # noqa: E402


def one_f_one_b(p: int, m: int, j: int) -> List[Tuple[str, int]]:
    """Stage j's compute order: [("F", i) | ("B", i)]; an update follows every ("B", i)."""
    w = min(p - 1 - j, m)
    out = [("F", i) for i in range(w)]
    for k in range(m - w):
        out += [("F", w + k), ("B", k)]
    out += [("B", i) for i in range(m - w, m)]
    return out


def versions_read(p: int, m: int, mode: str, vertical_sync: bool) -> Tuple[List[List[int]], List[List[int]]]:
    """fwd[j][i], bwd[j][i]: how many of the step's updates the weights micro-batch i's forward and backward
    read on stage j have seen. mode: "stash" (pipedream) or "newest" (pipemare)."""
    fwd = [[-1] * m for _ in range(p)]
    bwd = [[-1] * m for _ in range(p)]
    for j in range(p):
        done = 0  # updates of stage j so far in the step
        for kind, i in one_f_one_b(p, m, j):
            if kind == "F":
                fwd[j][i] = done
            else:
                bwd[j][i] = done
                done += 1
    if vertical_sync:
        fwd = [list(fwd[0]) for _ in range(p)]
    if mode == "stash":
        bwd = [list(f) for f in fwd]
    return fwd, bwd


def window_lengths(steps: int, ends_after: Sequence[int] = (), flush: bool = False, first: int = 0,
                   most: int = 64) -> List[int]:
    """The windows (in steps) of a run of steps first..steps-1: one ends after every step in ends_after
    (evaluation, checkpoint, stop), after the last step and after `most` steps; flush: every step alone."""
    out, k = [], 0
    for s in range(first, steps):
        k += 1
        if flush or s in ends_after or s + 1 == steps or k == most:
            out.append(k)
            k = 0
    return out


def stage_of_block(split: Sequence[int]) -> List[int]:
    out = []
    for s, n in enumerate(split):
        out += [s] * n
    return out


def mixed(f: Callable[[torch.Tensor], torch.Tensor], leaf: torch.Tensor, wf: torch.Tensor) -> torch.Tensor:
    if wf is leaf:
        return f(leaf)
    y = f(leaf)
    return y - y.detach() + f(wf).detach()


def staged_loss(P: Callable[[str, int], Tuple[torch.Tensor, torch.Tensor]], idx: torch.Tensor,
                targets: torch.Tensor, cfg: ref.GPTConfig, block_stage: Sequence[int], p: int) -> torch.Tensor:
    """gpt_reference's forward with every parameter use through P(name, stage) -> (leaf at the backward's
    version, tensor at the forward's version)."""
    B, T = idx.shape

    def lin(x, name, s):
        L, W = P(name, s)
        return mixed(lambda w: x @ w, L, W)

    def add(x, name, s):
        L, W = P(name, s)
        return mixed(lambda w: x + w, L, W)

    def ln(x, prefix, s):
        mean = x.mean(dim=-1, keepdim=True)
        xc = x - mean
        var = (xc * xc).mean(dim=-1, keepdim=True)
        xh = xc * torch.rsqrt(var + ref.LN_EPS)
        L, W = P(prefix + ".weight", s)
        y = mixed(lambda w: xh * w, L, W)
        return add(y, prefix + ".bias", s)

    Le, We = P("wte.weight", 0)
    x = mixed(lambda w: w[idx], Le, We)
    x = add(x, "wpe.weight_T", 0)  # wpe[:T], sliced in P
    for l in range(cfg.n_layer):
        s, h = block_stage[l], f"h.{l}."
        a = ln(x, h + "ln_1", s)
        C, H = cfg.n_embd, cfg.n_head
        hs = C // H
        qkv = add(lin(a, h + "attn.c_attn.weight", s), h + "attn.c_attn.bias", s)
        q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
        q = q.reshape(B, T, H, hs).transpose(1, 2)
        k = k.reshape(B, T, H, hs).transpose(1, 2)
        v = v.reshape(B, T, H, hs).transpose(1, 2)
        sc = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        sc = sc.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(diagonal=1), float("-inf"))
        y = (ref.softmax_last(sc) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + add(lin(y, h + "attn.c_proj.weight", s), h + "attn.c_proj.bias", s)
        a = ln(x, h + "ln_2", s)
        hh = ref.gelu_tanh(add(lin(a, h + "mlp.c_fc.weight", s), h + "mlp.c_fc.bias", s))
        x = x + add(lin(hh, h + "mlp.c_proj.weight", s), h + "mlp.c_proj.bias", s)
    x = ln(x, "ln_f", p - 1)
    Lh, Wh = P("wte.weight", p - 1)
    logits = mixed(lambda w: x @ w.t(), Lh, Wh)
    return ref.cross_entropy(logits, targets)


def stage_tau(name: str, p: int, block_stage: Sequence[int]) -> int:
    """PipeMare's delay of the stage holding `name`: p - j; the tied wte takes stage 0's (p)."""
    if name.startswith("h."):
        return p - block_stage[int(name.split(".")[1])]
    if name.startswith("ln_f"):
        return 1
    assert name in ("wte.weight", "wpe.weight"), name
    return p


def train_micro(init_path: str, data_path: str, B: int, T: int, steps: int, hp: ref.HParams, p: int, m: int,
                split: Sequence[int], mode: str, vertical_sync: bool = False, dp: int = 1,
                lr_anneal: int = 0, correction: float = -1.0, windows: Sequence[int] = ()) -> Tuple[List[Dict[str, float]], Dict[str, np.ndarray], Dict[str, object]]:
    """Returns ([{step, loss, lr, grad_norm, clipped}] per step, the final weights, facts) where facts holds
    the versions read in the first window (fwd, bwd) and how many micro-batch updates were clipped. B windows
    per step, split over dp ranks (B/dp each), each rank's share in m micro-batches; micro-batch i is the
    i-th of every rank's share. windows: window_lengths (empty: every step its own window, the flushed run)."""
    cfg, w = ref.load_model(init_path)
    tokens = ref.read_shard(data_path)
    names = list(w)
    block_stage = stage_of_block(split)
    assert len(block_stage) == cfg.n_layer and len(split) == p
    opt = ref.AdamW(w, hp.beta1, hp.beta2, hp.eps, hp.weight_decay)
    windows = list(windows) or [1] * steps
    assert sum(windows) == steps, (windows, steps)
    share, mb = B // dp, B // dp // m
    assert share * dp == B and mb * m == share
    history, clipped_updates, all_norms = [], 0, []
    delta = {n: torch.zeros_like(t) for n, t in w.items()}
    first_facts = None
    for s, s0, K in [(s, s0, K) for s0, K in windows_from(windows) for s in range(s0, s0 + K)]:
        if s == s0:
            # The window's versions: hist[k] = the model after k of this window's updates.
            hist = [{n: t.detach().clone() for n, t in w.items()}]
            fwd, bwd = versions_read(p, K * m, mode, vertical_sync)
            if first_facts is None:
                first_facts = (fwd, bwd)
        x_all, y_all = (torch.from_numpy(a) for a in ref.get_batch(tokens, s, B, T))
        losses, norms = [], []
        lr = ref.lr_at(s, hp.lr, hp.min_lr, hp.warmup_steps, steps)
        for i in range(m):
            kw = (s - s0) * m + i  # the micro-batch's number in its window
            rows = [r * share + i * mb + k for r in range(dp) for k in range(mb)]
            x, y = x_all[rows], y_all[rows]
            leaves: Dict[Tuple[str, int], torch.Tensor] = {}

            def P(name: str, st: int, kw=kw, leaves=leaves, hist=hist, fwd=fwd, bwd=bwd):
                base = "wpe.weight" if name == "wpe.weight_T" else name
                key = (base, st)
                if key not in leaves:
                    d = bwd[st][kw] - fwd[st][kw]
                    wb = hist[bwd[st][kw]][base]
                    if correction >= 0 and d > 0:
                        wb = wb - d * delta[base]
                    leaves[key] = wb.clone().requires_grad_(True)
                L = leaves[key]
                W = L if fwd[st][kw] == bwd[st][kw] else hist[fwd[st][kw]][base]
                if name == "wpe.weight_T":
                    return L[:T], (L[:T] if W is L else W[:T])
                return L, W

            loss = staged_loss(P, x, y, cfg, block_stage, p)
            keys = list(leaves)
            gs = torch.autograd.grad(loss, [leaves[k] for k in keys])
            grads = {n: torch.zeros_like(w[n]) for n in names}
            for (n, _), g in zip(keys, gs):
                grads[n] += g
            norm = ref.global_grad_norm(grads.values())
            scale = ref.clip_scale(norm, hp.grad_clip)
            if scale < 1.0:
                grads = {n: g * scale for n, g in grads.items()}
                clipped_updates += 1
            n_upd = s * m + i
            if lr_anneal > 0:
                power = 1.0 - min(n_upd / lr_anneal, 1.0)
                for n in names:
                    opt.step({n: w[n]}, {n: grads[n]}, n_upd + 1, lr * float(stage_tau(n, p, block_stage)) ** -power)
            else:
                opt.step(w, grads, n_upd + 1, lr)
            hist.append({n: t.detach().clone() for n, t in w.items()})
            if correction >= 0:
                for n in names:
                    delta[n] = correction * delta[n] + (1.0 - correction) * (hist[-1][n] - hist[-2][n])
            losses.append(float(loss))
            norms.append(norm)
            all_norms.append(norm)
        history.append({"step": s, "loss": sum(losses) / m, "lr": lr, "grad_norm": sum(norms) / m,
                        "clipped": False})
    facts = {"fwd": first_facts[0], "bwd": first_facts[1], "clipped_updates": clipped_updates, "norms": all_norms}
    return history, {n: t.detach().numpy().astype(np.float32) for n, t in w.items()}, facts


def windows_from(windows: Sequence[int]) -> List[Tuple[int, int]]:
    """[(first step, length)] of every window."""
    out, s0 = [], 0
    for K in windows:
        out.append((s0, K))
        s0 += K
    return out


def stash_depth(p: int, m: int, mode: str, vertical_sync: bool = False) -> List[int]:
    """Per stage, the most versions held at once along its list of m micro-batches (a window's: K*m), the
    newest and the versions of the
    micro-batches in flight (forward run, backward not yet run: until its backward has read it), looked at
    after each forward, at each backward (before it ends) and after each update. Without a stash only the
    newest."""
    fwd, bwd = versions_read(p, m, mode, vertical_sync)
    out = []
    for j in range(p):
        done, started, finished, peak = 0, set(), set(), 0

        def look():
            live = {done}
            if mode == "stash" or vertical_sync:
                live |= {fwd[j][k] for k in started - finished}
            return len(live)

        for kind, i in one_f_one_b(p, m, j):
            if kind == "F":
                started.add(i)
                peak = max(peak, look())
            else:
                peak = max(peak, look())  # i still in flight
                finished.add(i)
                done += 1  # the update after it
                peak = max(peak, look())
        out.append(peak)
    return out
