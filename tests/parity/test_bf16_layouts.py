"""Layout equality under `--precision bf16`: data parallelism (2 and 4 ranks) with ZeRO 0-3, tensor parallelism
(2 and 4) with sequence parallelism, pipeline parallelism (2 and 4 stages; 1F1B and interleaved), the compressed
exchange at its lossless limit (top-k keeping everything), the 3-D mesh on 8 ranks and MoE with expert
parallelism each reproduce the single-process bf16 run; --recompute reproduces it bit for bit.

Dense problem: dp_common's with L=4 (so 2 stages x 2 chunks hold whole blocks), H=2, C=32, V=64, B=12, T=16,
12 steps (warmup 3, cosine, wd 0.1, clipping on the early steps). MoE problem: test_moe_layouts' top-2 case
(E=4, capacity 1.0, G=2, random second choice), 8 steps.

Why these tolerances: a layout changes float32 summation order, and with bf16 products that also moves the
rare product input across a bf16 rounding boundary (a 2^-8 relative change of that input), which then grows
like any other rounding difference. Measured here (12 steps):
  step 0   identical weights: dp, ZeRO and pp differ from the single process by <= 2e-8 in loss and grad_norm,
           MoE with ep by 2.5e-7, tp 2 with sp (its row-parallel products split the sum over K) by 4.8e-6 in
           loss and 4.3e-6 rel in grad_norm. Tolerances: loss abs 2e-5, grad_norm rel 2e-5. The single-process
           fp32 run is 1.1e-4 away in step-0 loss, and the test asserts more than twice the tolerance, so a
           layout whose products ignored --precision fails at step 0. tp 4 with sp (H=4) splits each
           row-parallel sum four ways: 2.9e-5 in step-0 loss, tolerance 6e-5, and its own fp32 run must be
           more than twice that away.
  steps    loss abs 1.5e-3, grad_norm rel 4e-3, final weights abs 3e-3: about 3x the largest drift measured
           (tp2_sp: 3.9e-4, 1.2e-3, 7.0e-4; test_bf16_parity's bf16 reference in float32 vs float64 over 20
           steps: 5.6e-4, 5.3e-4, 9.3e-4); the key-bias slice of each c_attn.bias (zero true gradient, pure
           rounding noise that Adam scales to ~lr steps) within 2 sum(lr).
  MoE      the same; routing decisions (moe_dropped) are not compared: a flip in a router product may move a
           token across a capacity boundary, which is the drift above, not a layout error.
Also measured and printed: the single-process run with micro-batches of 3 (only the summation order differs).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dp_common as dpc  # noqa: E402
import gpt_reference as ref  # noqa: E402
import test_moe_layouts as ml  # noqa: E402
from parity_harness import parse_args, rel_diff  # noqa: E402

CFG = ref.GPTConfig(n_layer=4, n_head=2, n_embd=32, vocab_size=64, n_positions=32)
STEPS = 12
TOL_LOSS0_ABS, TOL_GN0_REL = 2e-5, 2e-5
TOL_LOSS0_TP4 = 6e-5
TOL_LOSS_ABS, TOL_GN_REL, TOL_W_ABS = 1.5e-3, 4e-3, 3e-3
BF16 = ["--precision", "bf16"]


def compare(tag, got, got_w, want, want_w, checks, cfg, k_tol, tol_loss0=TOL_LOSS0_ABS):
    """Every step and the final weights against the single-process bf16 run; returns the worst diffs."""
    bad, wl, wg = [], 0.0, 0.0
    for g, w in zip(got, want):
        s = w["step"]
        dl, dg = abs(g["loss"] - w["loss"]), rel_diff(g["grad_norm"], w["grad_norm"])
        wl, wg = max(wl, dl), max(wg, dg)
        tl, tg = (tol_loss0, TOL_GN0_REL) if s == 0 else (TOL_LOSS_ABS, TOL_GN_REL)
        if dl > tl or dg > tg:
            bad.append(f"step {s}: loss {g['loss']:.6f} vs {w['loss']:.6f} (abs {dl:.2e}, tol {tl:g}), grad_norm "
                       f"rel {dg:.2e} (tol {tg:g})")
    checks.check(not bad, f"{tag}: {len(bad)} steps differ from the single-process bf16 run; first: "
                 f"{bad[0] if bad else ''}")
    dw = float("nan")
    if got_w is not None and want_w is not None:
        dw, where, dk = dpc.weight_diffs(got_w, want_w, cfg)
        checks.check(dw <= TOL_W_ABS, f"{tag}: final weights differ by {dw:.2e} in {where} (tol {TOL_W_ABS:g})")
        checks.check(dk <= k_tol, f"{tag}: key-bias slice differs by {dk:.2e} > 2 sum(lr) = {k_tol:.2e}")
    return wl, wg, dw


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    checks = dpc.Tally("test_bf16_layouts")
    lr = dpc.LayoutRunner(args, checks, CFG, 31, 32, STEPS)
    want, want_w = lr.run("single_bf16", BF16)
    fp32, _ = lr.run("single_fp32", [], save=False)
    if want is None or fp32 is None:
        checks.finish()
    sep_l, sep_g = abs(fp32[0]["loss"] - want[0]["loss"]), rel_diff(fp32[0]["grad_norm"], want[0]["grad_norm"])
    print(f"single process step 0: fp32 vs bf16 loss {sep_l:.2e}, grad_norm rel {sep_g:.2e}")
    checks.check(sep_l > 2 * TOL_LOSS0_ABS,
                 f"test setup: the fp32 and bf16 step-0 losses differ by only {sep_l:.2e}, within twice the step-0 "
                 f"tolerance {TOL_LOSS0_ABS:g}: the test cannot tell the precisions apart")
    k_tol = 2 * sum(r["lr"] for r in want)
    # Recomputation repeats the same operations, the same roundings included: bit for bit the plain run.
    rc, _ = lr.run("single_recompute", BF16 + ["--recompute"], save=False)
    if rc is not None:
        same = [(a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"]) for a, b in zip(rc, want)]
        checks.check(all(same), f"bf16 --recompute differs from the plain bf16 run at steps "
                     f"{[i for i, x in enumerate(same) if not x][:5]}")

    layouts = [("single_mb3", ["--micro-batch-size", 3]),
               ("dp2_z0", ["--nproc", 2]), ("dp2_z1", ["--nproc", 2, "--zero", 1]),
               ("dp2_z2", ["--nproc", 2, "--zero", 2]), ("dp2_z3", ["--nproc", 2, "--zero", 3]),
               ("tp2", ["--nproc", 2, "--tp", 2]),
               ("tp2_sp", ["--nproc", 2, "--tp", 2, "--sequence-parallel"]),
               ("pp2_1f1b_M2", ["--nproc", 2, "--pp", 2, "--schedule", "1f1b", "--micro-batch-size", 6]),
               ("pp2_interleaved_V2_M2", ["--nproc", 2, "--pp", 2, "--schedule", "interleaved", "--virtual-stages", 2,
                                          "--micro-batch-size", 6]),
               ("dp4_z3", ["--nproc", 4, "--zero", 3]),
               ("pp4_1f1b_M4", ["--nproc", 4, "--pp", 4, "--micro-batch-size", 3]),
               # Top-k keeping every element: the compressed exchange at its lossless limit.
               ("dp2_topk_all", ["--nproc", 2, "--compress", "topk:1"]),
               # The 3-D mesh on 8 ranks: dp 2 x tp 2 x pp 2, ZeRO 1, 2 micro-batches per rank.
               ("dp2_tp2_pp2_z1", ["--nproc", 8, "--tp", 2, "--pp", 2, "--zero", 1, "--micro-batch-size", 3])]
    print(f"\n{'layout':<28}{'max|dloss|':>12}{'gn rel':>10}{'max|dw|':>10}{'s':>6}")
    for tag, extra in layouts:
        t0 = time.time()
        got, got_w = lr.run(tag, BF16 + extra)
        if got is None:
            continue
        wl, wg, dw = compare(tag, got, got_w, want, want_w, checks, CFG, k_tol)
        print(f"{tag:<28}{wl:>12.2e}{wg:>10.2e}{dw:>10.2e}{time.time() - t0:>6.1f}")

    # tp 4 needs heads divisible by 4: the same problem with H=4, its own single-process run, in a subdirectory.
    targs = argparse.Namespace(**vars(args))
    targs.workdir = os.path.join(args.workdir, "h4")
    os.makedirs(targs.workdir, exist_ok=True)
    cfg4 = ref.GPTConfig(n_layer=4, n_head=4, n_embd=32, vocab_size=64, n_positions=32)
    lr4 = dpc.LayoutRunner(targs, checks, cfg4, 31, 32, STEPS)
    want4, want4_w = lr4.run("single_bf16_h4", BF16 + ["--n-head", 4])
    fp32_4, _ = lr4.run("single_fp32_h4", ["--n-head", 4], save=False)
    if want4 is not None and fp32_4 is not None:
        sep4 = abs(fp32_4[0]["loss"] - want4[0]["loss"])
        checks.check(sep4 > 2 * TOL_LOSS0_TP4, f"test setup (H=4): fp32 and bf16 step-0 losses differ by only "
                     f"{sep4:.2e}, within twice the tp 4 step-0 tolerance {TOL_LOSS0_TP4:g}")
        for tag, extra in [("tp4_sp_h4", ["--nproc", 4, "--tp", 4, "--sequence-parallel"])]:
            t0 = time.time()
            got, got_w = lr4.run(tag, BF16 + ["--n-head", 4] + extra)
            if got is None:
                continue
            wl, wg, dw = compare(tag, got, got_w, want4, want4_w, checks, cfg4, 2 * sum(r["lr"] for r in want4),
                                 TOL_LOSS0_TP4)
            print(f"{tag:<28}{wl:>12.2e}{wg:>10.2e}{dw:>10.2e}{time.time() - t0:>6.1f}")

    # MoE: its own problem and files, in a subdirectory.
    margs = argparse.Namespace(**vars(args))
    margs.workdir = os.path.join(args.workdir, "moe")
    os.makedirs(margs.workdir, exist_ok=True)
    mr = ml.Runner(margs, checks)
    mwant, mwant_w = mr.run("moe_single_bf16", BF16)
    if mwant is not None:
        mk_tol = 2 * sum(r["lr"] for r in mwant)
        for tag, extra in [("moe_dp2_ep2", ["--nproc", 2, "--ep", 2]),
                           ("moe_dp2_ep2_z3_mb2", ["--nproc", 2, "--ep", 2, "--zero", 3, "--micro-batch-size", 2])]:
            t0 = time.time()
            got, got_w = mr.run(tag, BF16 + extra)
            if got is None:
                continue
            wl, wg, dw = compare(tag, got, got_w, mwant, mwant_w, checks, ml.CFG, mk_tol)
            print(f"{tag:<28}{wl:>12.2e}{wg:>10.2e}{dw:>10.2e}{time.time() - t0:>6.1f}")
    checks.finish()


if __name__ == "__main__":
    main()
