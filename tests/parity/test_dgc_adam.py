"""DGC with AdamW (`--optimizer adamw --compress topk:R --dgc --freeze-step K`) against an independent PyTorch
reference written from the rule in docs/parallelism.md ("DGC with AdamW"), not from the C++.

The rule, with b1, b2, eps, wd, lr_s as for AdamW, t = s + 1, N data-parallel ranks, g_r rank r's share of
step s's gradient (rank r holds windows [r B/N, (r+1) B/N) of the global batch; its share is the gradient of
its windows' loss sum over the global batch's token count, so the shares sum to the gradient):
  s < K   AdamW on the summed gradient after global-norm clipping at --grad-clip;
  s >= K  v frozen after step K-1, D = sqrt(v / (1 - b2^K)) + eps; at s = K: u_r = m / N, a_r = 0; then
          g_r *= min(1, clip / (|g_r| + 1e-6)) (the share's own norm); u_r = b1 u_r + (1-b1) g_r;
          a_r += (u_r / (1 - b1^t)) / D; per tensor the k = max(1, ceil(R n)) entries of largest |a_r| are sent,
          a_r = 0 there and (masking) u_r = 0 there; U = sum_r sent_r; w -= lr_s (U + wd w) (wd: tensors of
          >= 2 dims).

The problem is dp_common.py's tiny GPT (L=2, H=2, C=32, V=64, B=12 windows, T=16, Markov tokens) at dp 2, 10 steps,
K = 3, R = 0.05, with two changes to dp_common.HP: --grad-clip 0.3, so that clipping acts both on the global
gradient before K and on the shares after K (the test asserts it did), and --eps 1e-3. Why eps: the key slice of
each attn.c_attn.bias has an exactly-zero true gradient, so its float32 gradient is rounding noise that differs
between any two implementations; with eps = 1e-8, D there is ~1e-8 and a_r there is O(1), as large as a real
entry's, so which entries top-k sends would depend on rounding. With eps = 1e-3 those entries stay ~1e-6 and are
never sent, while the real ones (|g| >> 1e-3) are still normalized by sqrt(v).
With --dgc-warmup-steps W the kept fraction of step s >= K is DGC's sparsity warm-up counted from K:
d = max(R, 0.25^(floor(4 (s-K) / W) + 1)) for s - K < W, else R (here W = 4: 0.25, 0.0625, then R).
With --dgc-dense-vectors every tensor of fewer than 2 dims is sent whole every step (k = n) and its u_r is never
masked (for those tensors: Adam with the variance frozen).
With --dgc-global-topk the tensors not sent whole are one group: their a_r flattened and laid end to end, and the
k = max(1, ceil(d n_group)) entries of largest |a_r| over the whole group are sent (one threshold, not one per
tensor); bytes (N-1) x 8 (sum of the whole tensors' sizes + k).
With --dgc-split-clip each rank's share is clipped at --grad-clip / N after K: g_r *= min(1, (clip / N) / (|g_r| +
1e-6)) (so the sum of the N clipped shares has norm <= clip, the bound on the exact steps' gradient).
With --dgc-lr-scale S the steps from K on are w -= (S lr_s) (U + wd w).
Checks, for masking on (DGC's default), --dgc-no-masking, masking with --dgc-warmup-steps 4, masking with
--dgc-dense-vectors, masking with --dgc-global-topk, masking with all three of --dgc-global-topk,
--dgc-dense-vectors and --dgc-warmup-steps 4, and those three with --dgc-split-clip or with --dgc-lr-scale 1.5:
  1. every step's loss within rel 1e-5 of the reference (steps 0..K are AdamW; the later ones follow the rule);
     grad_norm in rank 0's row: the global norm before K, rank 0's share's norm from K on (rel 1e-4);
  2. the final weights (--save) within abs 2e-5 of the reference (one step moves a sent entry by lr |U| ~ 1e-3 or
     more: a wrong bias correction, starting momentum, masking or clipping is far outside);
  3. comm_bytes: exact DP's all-reduce before K (that of an --optimizer adamw run's step 0) and (N-1) x 8 sum_t k_t
     from K on; dgc_compressed false before K and true from K on, dgc_density the step's d from K on;
  4. steps 0..K's losses equal an --optimizer adamw run's (rel 1e-6: the same AdamW steps before the freeze);
     the variants differ from the first (masking and the warm-up matter here) and from plain AdamW after K.
Then: bad combinations exit non-zero before training, naming both flags.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dp_common as dc  # noqa: E402
import gpt_reference as ref  # noqa: E402
from parity_harness import Checks, parse_args, read_metrics, rel_diff  # noqa: E402

N, K, R, STEPS, WARM = 2, 3, 0.05, 10, 4
LR_S = 1.5  # --dgc-lr-scale of the variant that has it
HP = dataclasses.replace(dc.HP, grad_clip=0.3, eps=1e-3)
TOL_LOSS_REL = 1e-5
TOL_NORM_REL = 1e-4
TOL_W_ABS = 2e-5


def kept(n: int, d: float = R) -> int:
    return min(n, max(1, math.ceil(d * n - 1e-9)))


def density(s: int, W: int) -> float:
    """DGC's sparsity warm-up counted from the freeze step: four equal stages of W steps, never below R."""
    j = s - K
    return R if W <= 0 or j >= W else max(R, 0.25 ** (4 * j // W + 1))


@torch.no_grad()
def clip_factor(grads, clip: float) -> float:
    return ref.clip_scale(ref.global_grad_norm(grads), clip)


def reference(init_path: str, data_path: str, masking: bool, W: int = 0, dense: bool = False, glob: bool = False,
              split: bool = False, lr_scale: float = 1.0):
    """[{loss, norm, clipped}] per step and the final weights, from the rule above (float32 tensors)."""
    cfg, p = ref.load_model(init_path, dtype=torch.float32)
    tokens = ref.read_shard(data_path)
    names = list(p)
    b1, b2, eps, wd = HP.beta1, HP.beta2, HP.eps, HP.weight_decay
    m = {n: torch.zeros_like(w) for n, w in p.items()}
    v = {n: torch.zeros_like(w) for n, w in p.items()}
    u = [{n: torch.zeros_like(w) for n, w in p.items()} for _ in range(N)]
    a = [{n: torch.zeros_like(w) for n, w in p.items()} for _ in range(N)]
    rows = []
    for s in range(STEPS):
        x, y = ref.get_batch(tokens, s, dc.B, dc.T)
        shares, loss = [], 0.0
        for r in range(N):
            sl = slice(r * dc.B // N, (r + 1) * dc.B // N)
            q = {n: w.clone().requires_grad_(True) for n, w in p.items()}
            lr_ = ref.gpt_loss(q, torch.tensor(x[sl]), torch.tensor(y[sl]), cfg) * ((sl.stop - sl.start) / dc.B)
            gs = torch.autograd.grad(lr_, [q[n] for n in names])
            shares.append({n: g.detach() for n, g in zip(names, gs)})
            loss += float(lr_)
        lr = ref.lr_at(s, HP.lr, HP.min_lr, HP.warmup_steps, STEPS)
        t = s + 1
        with torch.no_grad():
            if s < K:
                G = {n: shares[0][n] + shares[1][n] for n in names}
                norm = ref.global_grad_norm(G.values())
                c = ref.clip_scale(norm, HP.grad_clip)
                bc1, bc2 = 1.0 - b1 ** t, 1.0 - b2 ** t
                for n in names:
                    g = G[n] * c
                    m[n].mul_(b1).add_((1.0 - b1) * g)
                    v[n].mul_(b2).add_((1.0 - b2) * g * g)
                    upd = (m[n] / bc1) / (torch.sqrt(v[n] / bc2) + eps)
                    if p[n].dim() >= 2:
                        upd = upd + wd * p[n]
                    p[n].sub_(lr * upd)
                rows.append(dict(loss=loss, norm=norm, clipped=c < 1.0))
                continue
            bc2K, bc1 = 1.0 - b2 ** K, 1.0 - b1 ** t
            if s == K:
                for r in range(N):
                    for n in names:
                        u[r][n] = m[n] / N
                        a[r][n] = torch.zeros_like(p[n])
            U = {n: torch.zeros_like(w) for n, w in p.items()}
            norm0, clipped = None, False
            for r in range(N):
                nr = ref.global_grad_norm(shares[r].values())
                c = ref.clip_scale(nr, HP.grad_clip / N if split else HP.grad_clip)
                clipped |= c < 1.0
                if r == 0:
                    norm0 = nr
                for n in names:
                    D = torch.sqrt(v[n] / bc2K) + eps
                    u[r][n] = b1 * u[r][n] + (1.0 - b1) * (shares[r][n] * c)
                    a[r][n] = a[r][n] + (u[r][n] / bc1) / D
                group = [n for n in names if not (dense and p[n].dim() < 2)]  # the tensors under top-k
                if glob:  # one top-k over the group's entries laid end to end
                    cat = torch.cat([a[r][n].reshape(-1) for n in group])
                    gidx = torch.topk(cat.abs(), kept(cat.numel(), density(s, W))).indices
                    chosen = torch.zeros(cat.numel(), dtype=torch.bool)
                    chosen[gidx] = True
                    parts = dict(zip(group, torch.split(chosen, [a[r][n].numel() for n in group])))
                for n in names:
                    flat_a, flat_u = a[r][n].view(-1), u[r][n].view(-1)
                    whole = n not in group
                    if whole:
                        idx = torch.arange(flat_a.numel())
                    elif glob:
                        idx = parts[n].nonzero().view(-1)
                    else:
                        idx = torch.topk(flat_a.abs(), kept(flat_a.numel(), density(s, W))).indices
                    sent = torch.zeros_like(flat_a)
                    sent[idx] = flat_a[idx]
                    flat_a[idx] = 0.0
                    if masking and not whole:
                        flat_u[idx] = 0.0
                    U[n] = U[n] + sent.view_as(U[n])
            for n in names:
                upd = U[n] + (wd * p[n] if p[n].dim() >= 2 else 0.0)
                p[n].sub_(lr_scale * lr * upd)
            rows.append(dict(loss=loss, norm=norm0, clipped=clipped))
    return rows, {n: p[n].numpy().copy() for n in names}


def run(args, checks, tag, extra, save=True):
    w = lambda ext: os.path.join(args.workdir, f"{tag}.{ext}")  # noqa: E731
    dc.remove_stale(w("jsonl"), w("safetensors"))
    flags = list(extra) + ["--metrics", w("jsonl")] + (["--save", w("safetensors")] if save else [])
    r = dc.run_group(dc.train_cmd(args.meshtrain, args.init, args.data, STEPS, flags, hp=HP), 120,
                     os.path.join(args.workdir, tag))
    if not checks.check(r.returncode == 0, dc.failure_text(r, tag)):
        return None, None
    rows = read_metrics(w("jsonl"), STEPS, checks, label=tag)
    weights = dc.load_saved(w("safetensors"), checks, tag) if save else None
    return rows, weights


def main():
    args = parse_args(__doc__)
    os.makedirs(args.workdir, exist_ok=True)
    checks = Checks("DGC with AdamW vs a PyTorch reference")
    args.init, args.data, _ = dc.write_inputs(args.workdir)
    tensors = [(n, int(np.prod(s)), s) for n, s in ref.param_shapes(dc.CFG)]

    adam, adam_w = run(args, checks, "adamw", ["--nproc", N])
    finals = {}
    for variant, extra, W in (("masking", [], 0), ("no_masking", ["--dgc-no-masking"], 0),
                              ("warmup", ["--dgc-warmup-steps", WARM], WARM), ("dense", ["--dgc-dense-vectors"], 0),
                              ("global", ["--dgc-global-topk"], 0),
                              ("global_dense_warmup", ["--dgc-global-topk", "--dgc-dense-vectors",
                                                       "--dgc-warmup-steps", WARM], WARM),
                              ("global_dense_warmup_split", ["--dgc-global-topk", "--dgc-dense-vectors",
                                                             "--dgc-warmup-steps", WARM, "--dgc-split-clip"], WARM),
                              ("global_dense_warmup_lr", ["--dgc-global-topk", "--dgc-dense-vectors",
                                                          "--dgc-warmup-steps", WARM, "--dgc-lr-scale", LR_S], WARM)):
        dense = "dense" in variant
        glob = variant.startswith("global")
        split = variant.endswith("split")
        want, want_w = reference(args.init, args.data, masking=variant != "no_masking", W=W, dense=dense, glob=glob,
                                 split=split, lr_scale=LR_S if variant.endswith("_lr") else 1.0)
        got, got_w = run(args, checks, "dgc_adam_" + variant,
                         ["--nproc", N, "--compress", f"topk:{R}", "--dgc", "--freeze-step", K] + extra)
        clipped_before = sum(r["clipped"] for r in want[:K])
        clipped_after = sum(r["clipped"] for r in want[K:])
        print(f"{variant}: reference clipped {clipped_before} of {K} warm-up steps, {clipped_after} of "
              f"{STEPS - K} compressed steps (some rank's share)")
        checks.check(clipped_before > 0 and clipped_after > 0,
                     f"{variant}: the setup should clip before and after K (got {clipped_before}, {clipped_after})")
        if got is None:
            continue
        worst_l = max(rel_diff(g["loss"], w_["loss"]) for g, w_ in zip(got, want))
        worst_n = max(rel_diff(g["grad_norm"], w_["norm"]) for g, w_ in zip(got, want))
        print(f"{variant}: worst loss rel {worst_l:.2e}, worst grad_norm rel {worst_n:.2e}")
        for g, w_ in zip(got, want):
            checks.check(rel_diff(g["loss"], w_["loss"]) <= TOL_LOSS_REL,
                         f"{variant} step {g['step']}: loss {g['loss']} vs reference {w_['loss']}")
            checks.check(rel_diff(g["grad_norm"], w_["norm"]) <= TOL_NORM_REL,
                         f"{variant} step {g['step']}: grad_norm {g['grad_norm']} vs reference {w_['norm']}")
        if got_w is not None:
            worst, where, worst_k = dc.weight_diffs(got_w, want_w)
            print(f"{variant}: final weights worst abs {worst:.2e} ({where}), key-bias slice {worst_k:.2e}")
            checks.check(worst <= TOL_W_ABS and worst_k <= TOL_W_ABS,
                         f"{variant}: final weights differ from the reference by {worst:.2e} at {where} "
                         f"(key-bias slice {worst_k:.2e}), tolerance {TOL_W_ABS}")
            finals[variant] = got_w
        if adam:
            for g in got:
                s = g["step"]
                d = density(s, W)
                whole = [n for _, n, shape in tensors if dense and len(shape) < 2]
                rest = [n for _, n, shape in tensors if not (dense and len(shape) < 2)]
                topk_entries = kept(sum(rest), d) if glob else sum(kept(n, d) for n in rest)
                want_b = adam[0]["comm_bytes"] if s < K else (N - 1) * 8 * (sum(whole) + topk_entries)
                checks.check(g["comm_bytes"] == want_b and g.get("dgc_compressed") == (s >= K) and
                             g.get("dgc_density") == (d if s >= K else None),
                             f"{variant} step {s}: comm_bytes {g['comm_bytes']} dgc_compressed "
                             f"{g.get('dgc_compressed')} dgc_density {g.get('dgc_density')}, expected {want_b}, "
                             f"{s >= K}, {d if s >= K else None}")
            worst_w = max(rel_diff(g["loss"], b["loss"]) for g, b in zip(got[:K + 1], adam[:K + 1]))
            checks.check(worst_w <= 1e-6, f"{variant}: steps 0..{K} should equal --optimizer adamw's (the same "
                         f"AdamW steps before the freeze): worst loss rel {worst_w:.2e}")
            checks.check(any(rel_diff(g["loss"], b["loss"]) > 1e-4 for g, b in zip(got[K + 1:], adam[K + 1:])),
                         f"{variant}: after the freeze step the losses should differ from AdamW's")
    if "global_dense_warmup" in finals and "global_dense_warmup_split" in finals:
        d = max(float(np.abs(finals["global_dense_warmup"][n] - finals["global_dense_warmup_split"][n]).max())
                for n in finals["global_dense_warmup"])
        print(f"global_dense_warmup vs the same with --dgc-split-clip: final weights differ by {d:.2e}")
        checks.check(d > 1e-4, f"--dgc-split-clip should train differently (max diff {d:.2e})")
    if "global_dense_warmup" in finals and "global_dense_warmup_lr" in finals:
        d = max(float(np.abs(finals["global_dense_warmup"][n] - finals["global_dense_warmup_lr"][n]).max())
                for n in finals["global_dense_warmup"])
        print(f"global_dense_warmup vs the same with --dgc-lr-scale {LR_S}: final weights differ by {d:.2e}")
        checks.check(d > 1e-4, f"--dgc-lr-scale should train differently (max diff {d:.2e})")
    for other in ("no_masking", "warmup", "dense", "global"):
        if "masking" in finals and other in finals:
            d = max(float(np.abs(finals["masking"][n] - finals[other][n]).max()) for n in finals["masking"])
            print(f"masking vs {other}: final weights differ by {d:.2e}")
            checks.check(d > 1e-4, f"masking and {other} should train differently (max diff {d:.2e})")

    base = ["--nproc", N, "--compress", "topk:0.05", "--dgc", "--freeze-step", 3]
    bad = [(base + ["--optimizer", "sgd"], ["--dgc --freeze-step", "--optimizer sgd"]),
           (base + ["--optimizer", "lamb"], ["--optimizer lamb"]),
           (base + ["--zero", 1], ["--compress topk:0.05", "--zero 1"]),
           (["--nproc", 4, "--tp", 2] + base[2:], ["--dgc --freeze-step", "--tp 2"]),
           (base + ["--delayed-update"], ["--dgc --freeze-step", "--delayed-update"]),
           (["--nproc", N, "--freeze-step", 3], ["--freeze-step", "--optimizer onebit-adam or --dgc"]),
           (["--nproc", N, "--compress", "topk:0.05", "--dgc", "--dgc-no-masking"],
            ["--dgc-no-masking", "--freeze-step"]),
           (["--nproc", N, "--compress", "topk:0.05", "--dgc", "--freeze-step", 0], ["--freeze-step", "K >= 1"]),
           (["--nproc", N, "--compress", "topk:0.05", "--dgc", "--dgc-dense-vectors"],
            ["--dgc-dense-vectors", "--freeze-step"]),
           (["--nproc", N, "--compress", "topk:0.05", "--dgc", "--dgc-global-topk"],
            ["--dgc-global-topk", "--freeze-step"]),
           (["--nproc", N, "--compress", "topk:0.05", "--dgc", "--dgc-split-clip"],
            ["--dgc-split-clip", "--freeze-step"]),
           (["--nproc", N, "--compress", "topk:0.05", "--dgc", "--dgc-lr-scale", 2],
            ["--dgc-lr-scale", "--freeze-step"]),
           (base + ["--dgc-lr-scale", 0], ["--dgc-lr-scale", "> 0"]),
           (base + ["--dgc-split-clip"], ["--dgc-split-clip", "--grad-clip"])]
    for i, (flags, names) in enumerate(bad):
        hp = dataclasses.replace(HP, grad_clip=0.0) if i == len(bad) - 1 else HP  # the last: without clipping
        dc.check_rejected(dc.train_cmd(args.meshtrain, args.init, args.data, 2, flags, hp=hp),
                          os.path.join(args.workdir, f"bad{i}.jsonl"), os.path.join(args.workdir, f"bad{i}"),
                          names, checks, " ".join(str(f) for f in flags))
    checks.finish()


if __name__ == "__main__":
    main()
