"""--schedule pipemare with PipeMare's two corrections, each behind its own flag, against an independent
reference (micro_update_reference.py, written from docs/parallelism.md "PipeMare's corrections").

The rules, on top of pipemare's per-micro-batch updates (the rule of test_micro_updates.py; update n = s m + i,
counted over the run; the backward of micro-batch i reads the stage's newest version):
- --pipemare-lr-anneal K: update n applies to the parameters of stage j of p the learning rate
  lr(s) * tau_j ** -(1 - min(n / K, 1)), tau_j = p - j; the tied wte takes stage 0's tau = p on both of its
  copies; clipping and AdamW's bias correction (t = n + 1) unchanged.
- --pipemare-correction GAMMA: delta, the moving average of a stage's weight changes per update
  (delta = GAMMA delta + (1 - GAMMA) (W(n+1) - W(n)), from 0, no bias correction); the backward of a
  micro-batch whose forward read d versions before its backward's newest W_b multiplies by W_b - d delta.

Problem: test_micro_updates.py's (L=4, H=2, C=32, V=64, B=12, T=16, 12 steps, m 4: 48 updates). Cases at pp 2
and 4: anneal alone (K 20: the factor anneals over the first 20 updates, then is 1), correction alone (GAMMA
0.5), both; tolerances test_micro_updates.py's. Each case's reference is asserted to differ from the
uncorrected rule and from the other two cases by more than 2x the loss or the weight tolerance (the
correction's effect at this size is small: about 1e-3 in loss and weights against the uncorrected rule, 6e-4
between "anneal" and "both" at pp 2; meshtrain agrees with each reference to about 3e-7). Bad input (refused naming both flags): --pipemare-lr-anneal with pipedream and with 1f1b,
--pipemare-correction with pipedream, GAMMA 1.5.
Also both corrections at dp 2 x pp 2 with --zero 1 and at tp 2 x pp 2 (m 2).
Every case has m >= p, so the run goes without a flush (one window of the 12 steps: no evaluation or
checkpoint): the reference follows the window rule (micro_update_reference.window_lengths).
Mutations seen to fail here: tau_j = p - j + 1 (every anneal and both case), the prediction's sign W + d delta
(both correct cases), the tied wte at its own stage's factor instead of stage 0's (every anneal and both case:
the two copies drift apart).
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dp_common as dpc  # noqa: E402
import micro_update_reference as mr  # noqa: E402
import test_micro_updates as tmu  # noqa: E402
from parity_harness import parse_args  # noqa: E402

K = 20
GAMMA = 0.5
# (tag, --pipemare-lr-anneal, --pipemare-correction): each correction alone and both
CASES = [("anneal", K, -1.0), ("correct", 0, GAMMA), ("both", K, GAMMA)]


def main() -> None:
    args = parse_args(__doc__)
    torch.set_num_threads(1)
    checks = dpc.Tally("test_pipemare_corrections")
    lr = dpc.LayoutRunner(args, checks, tmu.CFG, 31, 32, tmu.STEPS, tmu.HP)
    out = lr.out
    refs = {}

    def reference(p, anneal, gamma, m=4, dp=1):
        key = (p, anneal, gamma, m, dp)
        if key not in refs:
            refs[key] = mr.train_micro(lr.init_path, lr.data_path, dpc.B, dpc.T, tmu.STEPS, tmu.HP, p, m,
                                       tmu.SPLITS[p], "newest", False, dp, anneal, gamma,
                                       mr.window_lengths(tmu.STEPS))
        return refs[key]

    def compare(tag, flags, h, W, m):
        got, got_w = lr.run(tag, flags)
        if got is None:
            return
        wl, wg = dpc.compare_steps(got, h, checks, tag, loss_abs=tmu.TOL_LOSS_ABS, against=f"the reference of {tag}")
        dw, where, dk = dpc.weight_diffs(got_w, W, tmu.CFG)
        k_tol = sum(x["lr"] for x in h) * m
        checks.check(dw <= tmu.TOL_W_ABS, f"{tag}: final weights differ from the reference by {dw:.2e} in {where}")
        checks.check(dk <= k_tol, f"{tag}: key-bias slice differs by {dk:.2e} > sum(lr) {k_tol:.2e}")
        print(f"{tag:<30}{wl:>12.2e}{wg:>10.2e}{dw:>10.2e}")

    print(f"\n{'layout':<30}{'max|dloss|':>12}{'gn rel':>10}{'max|dw|':>10}")
    for p in (2, 4):
        for name, anneal, gamma in CASES:
            h, W, _ = reference(p, anneal, gamma)
            # the rule must differ from the uncorrected one and from the other cases, or the test is blind
            for other, a2, g2 in [("uncorrected", 0, -1.0)] + [c for c in CASES if c[0] != name]:
                h0, W0, _ = reference(p, a2, g2)
                dl = max(abs(a["loss"] - b["loss"]) for a, b in zip(h, h0))
                dw0 = tmu.max_weight_diff(W0, W)
                print(f"reference pp {p}: {name} vs {other}: max |dloss| {dl:.3e}, max |dw| {dw0:.3e}")
                checks.check(dl > 2 * tmu.TOL_LOSS_ABS or dw0 > 2 * tmu.TOL_W_ABS,
                             f"test setup: pp {p} {name} too close to {other} (loss {dl:.2e}, weights {dw0:.2e})")
            tag = f"pp{p}_pipemare_{name}"
            flags = ["--nproc", p, "--pp", p, "--schedule", "pipemare", "--micro-batch-size", 3,
                     "--stage-layers", ",".join(map(str, tmu.SPLITS[p]))]
            if anneal:
                flags += ["--pipemare-lr-anneal", anneal]
            if gamma >= 0:
                flags += ["--pipemare-correction", gamma]
            compare(tag, flags, h, W, m=4)

    # both corrections with the other layouts of pp 2 (m 2): dp 2 under ZeRO 1, and tp 2
    h, W, _ = reference(2, K, GAMMA, m=2, dp=2)
    compare("dp2_pp2_both_z1", ["--nproc", 4, "--pp", 2, "--zero", 1, "--schedule", "pipemare",
                                "--micro-batch-size", 3, "--stage-layers", "2,2", "--pipemare-lr-anneal", K,
                                "--pipemare-correction", GAMMA], h, W, m=2)
    h, W, _ = reference(2, K, GAMMA, m=2)
    compare("tp2_pp2_both", ["--nproc", 4, "--pp", 2, "--tp", 2, "--schedule", "pipemare",
                             "--micro-batch-size", 6, "--stage-layers", "2,2", "--pipemare-lr-anneal", K,
                             "--pipemare-correction", GAMMA], h, W, m=2)

    for tag, extra, words in (
            ("bad_pipedream", ["--nproc", 2, "--pp", 2, "--schedule", "pipedream", "--pipemare-lr-anneal", K],
             ["--pipemare-lr-anneal", "--schedule pipedream"]),
            ("bad_1f1b", ["--nproc", 2, "--pp", 2, "--schedule", "1f1b", "--pipemare-lr-anneal", K],
             ["--pipemare-lr-anneal", "--schedule 1f1b"]),
            ("bad_corr_pipedream", ["--nproc", 2, "--pp", 2, "--schedule", "pipedream", "--pipemare-correction", GAMMA],
             ["--pipemare-correction", "--schedule pipedream"]),
            ("bad_corr_gamma", ["--nproc", 2, "--pp", 2, "--schedule", "pipemare", "--pipemare-correction", 1.5],
             ["--pipemare-correction 1.5"])):
        dpc.check_rejected(dpc.train_cmd(args.meshtrain, lr.init_path, lr.data_path, tmu.STEPS, extra),
                           out(tag, "jsonl"), out(tag, "log"), words, checks, " ".join(map(str, extra)))
    checks.finish()


if __name__ == "__main__":
    main()
