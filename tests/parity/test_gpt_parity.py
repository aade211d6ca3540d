"""Parity: `meshtrain train` against the PyTorch reference, step by step and weight by weight.

A small GPT (L=2, H=4, C=64, V=96, Tmax=64) from a seeded random init trains 25 steps (B=4, T=32) on a
seeded token shard in both implementations (lr 1e-3 -> min-lr 1e-4, warmup 5, wd 0.1, clip 3.0, betas
0.9/0.95, eps 1e-8). Compared, with the reason for each tolerance:
  loss      step 0: rel 1e-5. One float32 forward; reference float32 vs float64 differ ~1e-7 rel, while a
            wrong attention scale shifts it ~1e-3 rel.
            every step: abs 2e-4. Trajectories separate only by float32 rounding amplified by Adam
            (observed float32 vs float64 reference: ~5e-7 over 25 steps).
  lr        rel 1e-7: a closed form of the step in double, while meshtrain applies (and reports) the lr as
            float32 (rounding <= 6e-8 rel); adjacent steps' lrs differ by >= 1e-3 rel away from the peak,
            so an off-by-one in the schedule (warmup uses s+1, the cosine s-W) still fails.
  grad_norm rel 1e-3: float32 sums of squares in any order, before clipping.
  weights   max abs diff <= 2e-4 per tensor after 25 steps. Adam moves each weight by ~lr = 1e-3 per step
            whatever the gradient's size, so one wrong step shows as 1e-4..1e-3 while rounding gives
            ~2e-6 (observed float32 vs float64). One exception, compared separately: the key slice
            [C, 2C) of each attn.c_attn.bias. Its true gradient is exactly zero (adding a constant to
            every key adds q.b_k to all scores of a query, which softmax ignores), so in float32 it is pure
            rounding noise that Adam rescales to steps of up to ~lr: two correct implementations drift
            apart there (observed 7e-5 float32 vs float64, and 1.8e-4 between two float32 runs of this
            reference that differ only in BLAS threading, i.e. at the strict tolerance). It must stay
            within sum(lr) = 1.4e-2 of the reference, which still catches a slice that is garbage or
            NaN; the key bias cannot change the loss, so nothing else about it is observable.
Why this init and data: weights are N(0, 0.02) except c_attn (0.1), c_fc (0.2), wte (0.1), wpe (0.05), so
attention is not uniform and GELU works in its curved range (with all-0.02 weights a wrong attention
scale or head split barely moves the loss). LayerNorm weights are 1 + N(0, 0.1) and biases N(0, 0.02),
so every parameter matters. Clipping triggers on steps 0-6 and not after (asserted from the reference's
norms, none within 1e-4 of the threshold). The shard (2917 tokens) is shorter than the run (3201), so
windows wrap around its end mid-window in steps 22-24. Tokens follow a sparse Markov chain so the loss
falls (4.85 -> 4.28): a trainer that does not learn cannot match by accident.
"""
from __future__ import annotations

import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_reference as ref  # noqa: E402
from parity_harness import Checks, parse_args, read_metrics, rel_diff, run  # noqa: E402

CFG = ref.GPTConfig(n_layer=2, n_head=4, n_embd=64, vocab_size=96, n_positions=64)
B, T, STEPS = 4, 32, 25
HP = ref.HParams(lr=1e-3, min_lr=1e-4, warmup_steps=5, beta1=0.9, beta2=0.95, eps=1e-8,
                 weight_decay=0.1, grad_clip=3.0)
INIT_STD = {"c_attn.weight": 0.1, "c_fc.weight": 0.2, "wte.weight": 0.1, "wpe.weight": 0.05}
N_TOKENS = 2917  # < STEPS*B*T + 1 = 3201, and not a multiple of T: late windows wrap mid-window
SEED_DATA, SEED_INIT = 2, 1
TOL_LOSS0_REL, TOL_LOSS_ABS, TOL_LR_REL, TOL_GN_REL, TOL_W_ABS = 1e-5, 2e-4, 1e-7, 1e-3, 2e-4


def markov_tokens(n: int, vocab: int, seed: int) -> np.ndarray:
    """Each token is followed by one of 6 fixed successors (70%) or a uniform token (30%)."""
    rng = np.random.default_rng(seed)
    succ = rng.integers(0, vocab, size=(vocab, 6))
    toks = np.empty(n, dtype=np.int64)
    toks[0] = 0
    for i in range(1, n):
        toks[i] = succ[toks[i - 1], rng.integers(0, 6)] if rng.random() >= 0.3 else rng.integers(0, vocab)
    return toks


def wraps(step: int) -> bool:
    return (step * B + B) * T + 1 > N_TOKENS  # the last window of the step reaches past the end


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    torch.set_num_threads(1)
    checks = Checks("test_gpt_parity")
    wd = args.workdir
    init_path, data_path = os.path.join(wd, "init.safetensors"), os.path.join(wd, "data.bin")
    metrics_path, save_path = os.path.join(wd, "metrics.jsonl"), os.path.join(wd, "final.safetensors")
    for p in (metrics_path, save_path):  # never judge a stale file from an earlier run
        if os.path.exists(p):
            os.remove(p)

    init = ref.random_init(CFG, SEED_INIT, std_by_suffix=INIT_STD)
    ref.write_safetensors(init_path, init, CFG.metadata())
    ref.write_shard(data_path, markov_tokens(N_TOKENS, CFG.vocab_size, SEED_DATA))

    # --- the reference run, and checks that the setup exercises what it claims to
    hist, ref_final = ref.train(init_path, data_path, B, T, STEPS, HP)
    n_clipped = sum(h["clipped"] for h in hist)
    checks.check(0 < n_clipped < STEPS, f"test setup: clipping must trigger on some steps but not all; "
                 f"it triggered on {n_clipped} of {STEPS}")
    near = [h["step"] for h in hist if abs(h["grad_norm"] / HP.grad_clip - 1.0) < 1e-4]
    checks.check(not near, f"test setup: grad norms at steps {near} are within 1e-4 of the clip threshold, "
                 f"where rounding could flip the clip decision")
    checks.check(any(wraps(s) for s in range(STEPS)), "test setup: no window wraps around the shard end")
    checks.check(hist[-1]["loss"] < hist[0]["loss"] - 0.05,
                 f"test setup: reference loss did not fall ({hist[0]['loss']:.4f} -> {hist[-1]['loss']:.4f})")

    # --- meshtrain
    r = run([args.meshtrain, "train", "--model", "gpt", "--init", init_path, "--data", data_path,
             "--batch-size", B, "--seq-len", T, "--steps", STEPS, "--lr", repr(HP.lr),
             "--min-lr", repr(HP.min_lr), "--warmup-steps", HP.warmup_steps, "--beta1", repr(HP.beta1),
             "--beta2", repr(HP.beta2), "--eps", repr(HP.eps), "--weight-decay", repr(HP.weight_decay),
             "--grad-clip", repr(HP.grad_clip), "--seed", 1234, "--threads", 1,
             "--metrics", metrics_path, "--save", save_path], timeout=600,
            log_prefix=os.path.join(wd, "meshtrain_train"))
    if not r.ok:
        checks.fatal(f"meshtrain train failed: {r.describe()}")

    # --- per-step metrics
    mt = read_metrics(metrics_path, STEPS, checks)
    if mt is not None:
        print(f"\n{'step':>4} {'loss ref':>10} {'loss mt':>10} {'|dloss|':>9} {'lr ref':>11} {'lr rel':>8} "
              f"{'gnorm ref':>10} {'gnorm mt':>10} {'gn rel':>8} clip wrap  verdict")
        for h, m in zip(hist, mt):
            s = h["step"]
            dl = abs(m["loss"] - h["loss"])
            lr_rel, gn_rel = rel_diff(m["lr"], h["lr"]), rel_diff(m["grad_norm"], h["grad_norm"])
            bad = []
            if s == 0 and rel_diff(m["loss"], h["loss"]) > TOL_LOSS0_REL:
                bad.append(f"loss rel {rel_diff(m['loss'], h['loss']):.2e} > {TOL_LOSS0_REL:g}")
            if dl > TOL_LOSS_ABS:
                bad.append(f"loss abs {dl:.2e} > {TOL_LOSS_ABS:g}")
            if lr_rel > TOL_LR_REL:
                bad.append(f"lr {m['lr']!r} vs {h['lr']!r} rel {lr_rel:.2e} > {TOL_LR_REL:g}")
            if gn_rel > TOL_GN_REL:
                bad.append(f"grad_norm rel {gn_rel:.2e} > {TOL_GN_REL:g}")
            print(f"{s:>4} {h['loss']:>10.6f} {m['loss']:>10.6f} {dl:>9.2e} {h['lr']:>11.5e} {lr_rel:>8.1e} "
                  f"{h['grad_norm']:>10.6f} {m['grad_norm']:>10.6f} {gn_rel:>8.1e} "
                  f"{'yes' if h['clipped'] else 'no':>4} {'yes' if wraps(s) else 'no':>4}  "
                  f"{'ok' if not bad else 'MISMATCH'}")
            checks.check(not bad, f"step {s}: " + "; ".join(bad))

    # --- final weights
    if not os.path.exists(save_path):
        checks.fatal(f"--save file {save_path} was not written")
    try:
        saved_raw, saved_meta = ref.read_safetensors(save_path)
        entries, _, _ = ref.read_safetensors_header(save_path)
    except (ref.FormatError, OSError, ValueError) as e:
        checks.fatal(f"--save file {save_path} is not valid safetensors: {e}")
    for key, want in CFG.metadata().items():
        checks.check(saved_meta.get(key) == want, f"saved __metadata__ {key} = {saved_meta.get(key)!r}, "
                     f"expected {want!r}")
    extra = sorted(n for n in saved_raw if n not in ref_final and not ref.is_buffer_name(n))
    checks.check(not extra, f"saved file has unexpected tensors {extra[:5]}")
    C = CFG.n_embd
    k_tol = sum(h["lr"] for h in hist)  # see the module docstring: the zero-gradient key-bias slice
    rows = []  # (diff, label, index of the worst element, how far the reference moved, tolerance)
    for name, want in ref_final.items():
        if not checks.check(name in saved_raw, f"saved file lacks tensor {name}"):
            continue
        got = saved_raw[name]
        if not checks.check(entries[name]["dtype"] == "F32" and got.shape == want.shape,
                            f"tensor {name}: saved {entries[name]['dtype']} {list(got.shape)}, expected F32 "
                            f"{list(want.shape)}"):
            continue
        err = np.abs(got.astype(np.float64) - want)
        err[~np.isfinite(err)] = np.inf
        moved = np.abs(want - init[name])
        parts = [(name, np.ones(want.shape, bool), TOL_W_ABS)]
        if name.endswith("attn.c_attn.bias"):
            key = np.zeros(want.shape, bool)
            key[C:2 * C] = True
            parts = [(name + "[q,v]", ~key, TOL_W_ABS), (name + "[k]", key, k_tol)]
        for label, mask, tol in parts:
            e = np.where(mask, err, -1.0)
            at = np.unravel_index(int(np.argmax(e)), want.shape)
            rows.append((float(e[at]), label, tuple(int(i) for i in at), float(moved[mask].max()), tol))
    rows.sort(key=lambda r: -r[0] / r[4])
    print(f"\n{'tensor':<30} {'max|diff|':>10} {'tolerance':>10} {'at':>11} {'ref moved':>10}  verdict")
    for diff, label, at, moved, tol in rows:
        print(f"{label:<30} {diff:>10.2e} {tol:>10.2e} {str(at):>11} {moved:>10.2e}  "
              f"{'ok' if diff <= tol else 'MISMATCH'}")
    for diff, label, at, moved, tol in rows:
        checks.check(diff <= tol, f"final weight {label}: max abs diff {diff:.3e} at index {at} > {tol:g}")
    strict = [r for r in rows if r[4] == TOL_W_ABS]
    if strict:
        worst = max(strict)
        print(f"worst tensor: {worst[1]} (max abs diff {worst[0]:.3e} at {worst[2]}, tolerance {TOL_W_ABS:g})")
    checks.check(len(rows) == len(ref_final) + CFG.n_layer,
                 f"compared {len(rows)} of {len(ref_final) + CFG.n_layer} tensors/slices")
    checks.finish()


if __name__ == "__main__":
    main()
