"""LAMB and Adafactor (--optimizer lamb | adafactor): the single-process run against a PyTorch reference written
from the issue's formulas (optim_reference.py), every exact layout against the single-process run, checkpoints
that resume exactly, and the combinations that are refused.

Model: dp_common's problem in test_tp_equality.py's shape (L=2, H=12, C=48, V=97: tp 2 splits whole heads and
the vocabulary unevenly), B=12, T=16, 20 steps, warmup 3 and cosine to lr/10, wd 0.1, global-norm clipping 2.5,
LAMB with betas 0.9/0.95 and eps 1e-8 at lr 2e-2 (LAMB's steps are |w|-relative: at 1e-3 it clips every step
and barely learns), Adafactor at lr 3e-3. Measured on the reference: LAMB clips steps 0-4, Adafactor 0-2, the
loss falls 4.84 -> 4.08 and 4.84 -> 3.97; no grad norm within 2% of the threshold (asserted), so rounding
cannot flip a clip decision.
For each optimizer:
  1. reference vs `--nproc 1`: every step's loss abs TOL_REF_LOSS, final weights TOL_REF_W apart from the key
     slice of each attn.c_attn.bias (its true gradient is zero: see dp_common.weight_diffs), which must stay
     within sum(lr). The setup is checked to exercise the rules: LAMB's trust ratios spread away from 1,
     Adafactor's RMS clipping of U triggers.
  2. layouts vs `--nproc 1`, tighter than dp_common's (whose 2e-3 loss and 5e-3 weights let a LAMB run that
     skips the dp reduction of its norms under ZeRO 1 pass: one tensor cut by the shard boundary gets a wrong
     trust ratio, moving the loss by 4e-5 and weights by 7e-5): every step's loss abs TOL_LAYOUT_LOSS,
     grad_norm rel TOL_LAYOUT_GN, lr rel 1e-6, final weights TOL_LAYOUT_W (key-bias slice within sum(lr)).
     Measured for correct layouts (float32 reduction order only): loss <= 3e-7, grad_norm <= 2.1e-7 rel,
     weights <= 1.5e-5 (LAMB under tp, where the key-bias noise enters the c_attn.bias trust ratio), so the
     tolerances keep a 7x (weights) to 50x margin. Layouts: dp 2 with ZeRO 0, 1, 2, 3 (ZeRO's pieces cut
     tensors: the norms and row/column sums are summed over dp), ZeRO 1 with 10 KB buckets (the shard
     boundaries cut many tensors), tp 2 (split tensors: summed over tp, row/column indices in full-tensor
     coordinates), pp 2 (the tied embedding on both stages), dp 2 x tp 2 with ZeRO 1, dp 2 ZeRO 2 with
     micro-batches of 3, dp 2 x pp 2 with ZeRO 2 (the pipeline executor calling the store's hooks).
  3. resume: a single-process checkpoint at step 8 resumed in a single process continues bit for bit (every
     later loss and grad_norm equal, final weights equal: Adam-style moments, or Adafactor's factored R and C
     and its flat V, all restored); one written under dp 2 ZeRO 3 resumes under dp 2 x tp 2 and continues the
     single-process trajectory within the layout tolerances.
Bad input: --optimizer lamb|adafactor with --compress, --local-sgd or --async ps fails before training with
a message naming both flags; an unknown --optimizer lists the choices.
"""
from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dp_common as dpc  # noqa: E402
import gpt_reference as ref  # noqa: E402
import optim_reference as oref  # noqa: E402
from parity_harness import parse_args, rel_diff  # noqa: E402

CFG = ref.GPTConfig(n_layer=2, n_head=12, n_embd=48, vocab_size=97, n_positions=32)
STEPS, SAVE_AT = 20, 8
# Reference vs single process: measured loss 5.4e-7 (LAMB), 7.0e-7 (Adafactor), weights 3.9e-6, 1.8e-7; the
# reference itself in float32 vs float64 differs by loss 5.4e-7 / 6.8e-7 and weights 8.1e-6 / 4.8e-7.
TOL_REF_LOSS, TOL_REF_W = 2e-5, 1e-4
TOL_LAYOUT_LOSS, TOL_LAYOUT_GN, TOL_LAYOUT_LR, TOL_LAYOUT_W = 2e-5, 1e-5, 1e-6, 1e-4
LAYOUTS = [("dp2_zero0", ["--nproc", 2, "--zero", 0]), ("dp2_zero1", ["--nproc", 2, "--zero", 1]),
           ("dp2_zero2", ["--nproc", 2, "--zero", 2]), ("dp2_zero3", ["--nproc", 2, "--zero", 3]),
           ("dp2_zero1_10kB", ["--nproc", 2, "--zero", 1, "--bucket-mb", 0.01]),
           ("tp2", ["--nproc", 2, "--tp", 2]), ("pp2", ["--nproc", 2, "--pp", 2]),
           ("dp2_tp2_zero1", ["--nproc", 4, "--tp", 2, "--zero", 1]),
           ("dp2_zero2_micro", ["--nproc", 2, "--zero", 2, "--micro-batch-size", 3]),
           ("dp2_pp2_zero2", ["--nproc", 4, "--pp", 2, "--zero", 2])]
HP = {"lamb": dataclasses.replace(dpc.HP, lr=2e-2, min_lr=2e-3),
      "adafactor": dataclasses.replace(dpc.HP, lr=3e-3, min_lr=3e-4)}
MAKE = {"lamb": lambda p, hp: oref.Lamb(p, hp.beta1, hp.beta2, hp.eps, hp.weight_decay),
        "adafactor": lambda p, hp: oref.Adafactor(p, hp.weight_decay)}


def against_reference(name: str, lr: dpc.LayoutRunner, want, want_w, checks: dpc.Tally) -> None:
    hp = HP[name]
    made = []

    def make(p, hp):
        made.append(MAKE[name](p, hp))
        return made[-1]

    hist, ref_w = ref.train(lr.init_path, lr.data_path, dpc.B, dpc.T, STEPS, hp, make_optimizer=make)
    opt = made[0]
    n_clip = sum(h["clipped"] for h in hist)
    checks.check(0 < n_clip < STEPS, f"{name}: test setup: global-norm clipping on {n_clip} of {STEPS} steps")
    near = [h["step"] for h in hist if abs(h["grad_norm"] / hp.grad_clip - 1.0) < 0.02]
    checks.check(not near, f"{name}: test setup: grad norms of steps {near} within 2% of the clip threshold")
    if name == "lamb":
        trust = sorted(opt.trust.values())
        checks.check(trust[0] < 0.5 and trust[-1] > 2.0,
                     f"{name}: test setup: last step's trust ratios {trust[0]:.3g}..{trust[-1]:.3g} stay near 1")
        print(f"{name}: last step's trust ratios {trust[0]:.3g} .. {trust[-1]:.3g}")
    else:
        rms = max(opt.rms.values())
        checks.check(rms > 1.05, f"{name}: test setup: the last step's RMS(U) is at most {rms:.3f}: no clipping")
        print(f"{name}: last step's largest RMS(U) {rms:.3f}")
    recs = [{"step": i, "loss": h["loss"], "lr": h["lr"], "grad_norm": h["grad_norm"]} for i, h in enumerate(hist)]
    wl, _ = dpc.compare_steps(want, recs, checks, f"{name} single vs PyTorch", loss_abs=TOL_REF_LOSS)
    dw, where, dk = dpc.weight_diffs(want_w, ref_w, CFG)
    k_tol = sum(h["lr"] for h in hist)
    checks.check(dw <= TOL_REF_W, f"{name} single vs PyTorch: final weights differ by {dw:.2e} in {where}")
    checks.check(dk <= k_tol, f"{name} single vs PyTorch: key-bias slice differs by {dk:.2e} > sum(lr) {k_tol:.2e}")
    # The same reference in float64: how far float32 rounding alone moves this run (printed, for the tolerances).
    made.clear()
    hist64, ref64 = ref.train(lr.init_path, lr.data_path, dpc.B, dpc.T, STEPS, hp, dtype=torch.float64,
                              make_optimizer=make)
    dl64 = max(abs(a["loss"] - b["loss"]) for a, b in zip(hist, hist64))
    dw64, _, _ = dpc.weight_diffs(ref_w, ref64, CFG)
    print(f"{name}: meshtrain vs reference: loss {wl:.2e}, weights {dw:.2e} (key slice {dk:.2e}); "
          f"reference float32 vs float64: loss {dl64:.2e}, weights {dw64:.2e}; loss {hist[0]['loss']:.4f} -> "
          f"{hist[-1]['loss']:.4f}")


def compare(tag: str, got, got_w, want, want_w, checks: dpc.Tally, k_tol: float):
    """Every step and the final weights against the single-process run at this test's tolerances (see the
    module docstring); returns (worst loss diff, worst grad_norm rel diff, worst weight diff or nan)."""
    bad, wl, wg = [], 0.0, 0.0
    for g, w in zip(got, want):
        dl, gn, dlr = abs(g["loss"] - w["loss"]), rel_diff(g["grad_norm"], w["grad_norm"]), rel_diff(g["lr"], w["lr"])
        wl, wg = max(wl, dl), max(wg, gn)
        if dl > TOL_LAYOUT_LOSS or gn > TOL_LAYOUT_GN or dlr > TOL_LAYOUT_LR:
            bad.append(f"step {w['step']}: loss {g['loss']:.7f} vs {w['loss']:.7f}, grad_norm rel {gn:.1e}, lr rel {dlr:.1e}")
    checks.check(len(got) == len(want) and not bad, f"{tag}: {len(bad)} of {len(want)} steps differ from the "
                 f"single-process run beyond loss {TOL_LAYOUT_LOSS:g} / grad_norm {TOL_LAYOUT_GN:g} rel; first: "
                 f"{bad[0] if bad else f'{len(got)} records, want {len(want)}'}")
    dw = float("nan")
    if got_w is not None and want_w is not None:
        dw, where, dk = dpc.weight_diffs(got_w, want_w, CFG)
        checks.check(dw <= TOL_LAYOUT_W, f"{tag}: final weights differ by {dw:.2e} in {where} (> {TOL_LAYOUT_W:g})")
        checks.check(dk <= k_tol, f"{tag}: key-bias slice differs by {dk:.2e} > sum(lr) {k_tol:.2e}")
    return wl, wg, dw


def check_factored_file(path: str, checks: dpc.Tally) -> None:
    """Adafactor's checkpoint holds R and C of every matrix once, named and shaped as declared
    (adafactor.row/NAME [rows], adafactor.col/NAME [cols]), all positive (eps1 keeps them so)."""
    try:
        tensors, _ = ref.read_safetensors(path)
    except (ref.FormatError, OSError, ValueError) as e:
        checks.check(False, f"adafactor checkpoint {path}: {e}")
        return
    problems = []
    for n, shape in ref.param_shapes(CFG):
        for kind, want in (("row", shape[:1]), ("col", shape[1:])):
            key = f"adafactor.{kind}/{n}"
            if len(shape) != 2:
                if key in tensors:
                    problems.append(f"{key} for a vector")
            elif key not in tensors:
                problems.append(f"{key} missing")
            elif tuple(tensors[key].shape) != tuple(want) or not (tensors[key] > 0).all():
                problems.append(f"{key}: shape {list(tensors[key].shape)} (want {list(want)}), min {tensors[key].min()}")
    checks.check(not problems, f"adafactor checkpoint {path}: " + "; ".join(problems[:4]))
    print(f"adafactor checkpoint: R and C of {sum(len(s) == 2 for _, s in ref.param_shapes(CFG))} matrices, "
          f"{len(problems)} problems")


def main() -> None:
    args = parse_args(__doc__)
    checks = dpc.Tally("test_optim_layouts")
    for name in ("lamb", "adafactor"):
        lr = dpc.LayoutRunner(args, checks, CFG, 11, 12, STEPS, HP[name])
        opt = ["--optimizer", name]
        want, want_w = lr.run(f"{name}_single", opt)
        if want is None:
            continue
        against_reference(name, lr, want, want_w, checks)
        k_tol = sum(r["lr"] for r in want)
        print(f"\n{'layout':<28}{'max|dloss|':>12}{'gn rel':>10}{'max|dw|':>10}")
        for tag, extra in LAYOUTS:
            got, got_w = lr.run(f"{name}_{tag}", opt + extra)
            if got is None:
                continue
            wl, wg, dw = compare(f"{name} {tag}", got, got_w, want, want_w, checks, k_tol)
            print(f"{name + ' ' + tag:<28}{wl:>12.2e}{wg:>10.2e}{dw:>10.2e}")

        # Resume: same layout (bit for bit), and resharded.
        for src, src_flags, dst, dst_flags, exact in [("single", [], "single", [], True),
                                                      ("dp2_zero3", ["--nproc", 2, "--zero", 3], "dp2_tp2",
                                                       ["--nproc", 4, "--tp", 2], False)]:
            ck = os.path.join(args.workdir, f"ckpt_{name}_{src}")
            dpc.remove_stale(ck)
            saved, _ = lr.run(f"{name}_save_{src}", opt + src_flags + ["--checkpoint-dir", ck, "--save-every", 4,
                                                                         "--stop-at-step", SAVE_AT],
                              save=False, end=SAVE_AT)
            if saved is None:
                continue
            if name == "adafactor" and src == "single":
                check_factored_file(os.path.join(ck, f"step_{SAVE_AT:08d}", "optimizer.safetensors"), checks)
            tag = f"{name}_resume_{src}_to_{dst}"
            got, got_w = lr.run(tag, opt + dst_flags + ["--resume", ck], first=SAVE_AT)
            if got is None:
                continue
            if exact:
                same = [(a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"]) for a, b in zip(got, want[SAVE_AT:])]
                checks.check(all(same), f"{tag}: steps {[SAVE_AT + i for i, x in enumerate(same) if not x][:5]} differ "
                             f"from the uninterrupted run (a same-layout resume is bit-identical)")
                diff = [n for n in want_w if not np.array_equal(got_w[n], want_w[n])] if got_w else ["(no file)"]
                checks.check(not diff, f"{tag}: final weights differ from the uninterrupted run's in {diff[:3]}")
                print(f"{tag}: {sum(same)} of {len(same)} steps bit-identical, {len(want_w) - len(diff)} of "
                      f"{len(want_w)} tensors equal")
            else:
                wl, _, dw = compare(tag, got, got_w, want[SAVE_AT:], want_w, checks, k_tol)
                print(f"{tag:<28}{wl:>12.2e}{'':>10}{dw:>10.2e}")

    # Refused combinations name both flags; an unknown optimizer lists the choices.
    metrics = lr.out("rejected", "jsonl")
    base = dpc.train_cmd(args.meshtrain, lr.init_path, lr.data_path, STEPS, [])
    for flags, names in [(["--optimizer", "lamb", "--nproc", 2, "--compress", "topk:0.01"], ["--optimizer lamb", "--compress"]),
                         (["--optimizer", "adafactor", "--nproc", 2, "--compress", "qsgd:4"], ["--optimizer adafactor", "--compress"]),
                         (["--optimizer", "adafactor", "--nproc", 2, "--local-sgd", 4], ["--optimizer adafactor", "--local-sgd 4"]),
                         (["--optimizer", "lamb", "--nproc", 2, "--local-sgd", 4], ["--optimizer lamb", "--local-sgd 4"]),
                         (["--optimizer", "lamb", "--nproc", 3, "--async", "ps"], ["--optimizer lamb", "--async ps"]),
                         (["--optimizer", "adafactor", "--nproc", 3, "--async", "ps"], ["--optimizer adafactor", "--async ps"]),
                         (["--optimizer", "adam"], ["--optimizer", "adamw, sgd, lamb, adafactor", "'adam'"])]:
        dpc.check_rejected(base + flags, metrics, lr.out("rejected", "log"), names, checks, " ".join(map(str, flags)))
    checks.finish()


if __name__ == "__main__":
    main()
