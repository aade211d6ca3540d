"""--learners (Crossbow's SMA) against an independent PyTorch reference written from the paper's rule
(sma_reference.py), on dp_common.py's tiny GPT (B = 12 windows, T = 16, AdamW, clip 2.5, 8 steps).

Checks:
  1. --learners 1 --sma-alpha 0 in one process is plain training: every step's loss and gradient norm equal
     the run without --learners (rel 1e-6; the same float32 operations in the same order).
  2. --learners 2 (k = 2 learners of 6 windows, alpha 1/2 by default, --sma-momentum 0.5) in one process with
     --micro-batch-size 6: every step's loss and grad_norm match the reference (loss abs 2e-5, grad_norm rel
     1e-3) and the saved weights (the central model z) match at abs 2e-4, the key-bias slice apart (dp_common's
     weight_diffs says why; measured: loss 4e-7, weights 4e-7, key-bias slice 3e-5: float32 summation order,
     while a wrong alpha, mu or gradient scale moves z by ~lr = 1e-3 a step); and its losses differ from plain
     training (step 1 on by > 1e-3).
  3. dp 2 x --learners 2 (--nproc 2 --micro-batch-size 3: k = 4 learners of 3 windows, alpha 1/4) against
     the reference with k = 4, the same way.
  4. refused combinations name both flags; a micro-batch count that is not a multiple of L is refused.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dp_common as dc  # noqa: E402
from parity_harness import Checks, parse_args, read_metrics, rel_diff  # noqa: E402
from sma_reference import train_sma  # noqa: E402

STEPS = 8
TOL_LOSS_ABS = 2e-5
TOL_W_ABS = 2e-4


def run(args, checks, tag, extra):
    metrics = os.path.join(args.workdir, tag + ".jsonl")
    save = os.path.join(args.workdir, tag + ".safetensors")
    dc.remove_stale(metrics, save)
    init_path, data_path = args.inputs
    r = dc.run_group(dc.train_cmd(args.meshtrain, init_path, data_path, STEPS,
                                  list(extra) + ["--metrics", metrics, "--save", save]),
                     180, os.path.join(args.workdir, tag))
    if not checks.check(r.returncode == 0, dc.failure_text(r, tag)):
        return None, None
    return read_metrics(metrics, STEPS, checks, label=tag), dc.load_saved(save, checks, tag)


def against_reference(checks, tag, rows, saved, k, alpha, mu, args):
    want, z = train_sma(*args.inputs, dc.B, dc.T, STEPS, dc.HP, k, alpha, mu)
    worst_loss, worst_gn = dc.compare_steps(rows, want, checks, tag, loss_abs=TOL_LOSS_ABS,
                                            against=f"the SMA reference (k={k})")
    print(f"{tag}: worst |loss diff| {worst_loss:.2e}, worst grad_norm rel {worst_gn:.2e}")
    if saved is not None:
        worst, where, worst_k = dc.weight_diffs(saved, z)
        print(f"{tag}: central model vs reference: worst abs {worst:.2e} ({where}), key-bias slice {worst_k:.2e}")
        checks.check(worst <= TOL_W_ABS, f"{tag}: saved central model differs from the reference by {worst:.2e} "
                     f"at {where} (> {TOL_W_ABS})")
    return want


def main():
    args = parse_args(__doc__)
    os.makedirs(args.workdir, exist_ok=True)
    checks = Checks("--learners (Crossbow SMA)")
    init_path, data_path, _ = dc.write_inputs(args.workdir)
    args.inputs = (init_path, data_path)

    # 1. L = 1, alpha 0: plain training
    plain, _ = run(args, checks, "plain", [])
    one, _ = run(args, checks, "sma_l1_a0", ["--learners", 1, "--sma-alpha", 0])
    if plain and one:
        worst = max(max(rel_diff(a["loss"], b["loss"]), rel_diff(a["grad_norm"], b["grad_norm"]))
                    for a, b in zip(plain, one))
        print(f"L=1 alpha=0 vs plain: worst rel {worst:.2e}")
        checks.check(worst <= 1e-6, f"--learners 1 --sma-alpha 0 vs plain training: worst rel {worst:.2e} > 1e-6")

    # 2. L = 2 in one process, momentum on the central model
    rows, saved = run(args, checks, "sma_l2", ["--learners", 2, "--micro-batch-size", 6, "--sma-momentum", 0.5])
    if rows:
        against_reference(checks, "sma_l2", rows, saved, 2, 0.5, 0.5, args)
        if plain:
            d = max(abs(a["loss"] - b["loss"]) for a, b in zip(plain[1:], rows[1:]))
            checks.check(d > 1e-3, f"--learners 2 should differ from plain training: worst loss diff {d:.2e}")

    # 3. dp 2 x L 2
    rows, saved = run(args, checks, "sma_dp2_l2", ["--nproc", 2, "--learners", 2, "--micro-batch-size", 3])
    if rows:
        against_reference(checks, "sma_dp2_l2", rows, saved, 4, 0.25, 0.0, args)

    # 4. refusals
    bad = [(["--learners", "2", "--micro-batch-size", "4"], ["--learners 2", "micro-batch"]),
           (["--nproc", "2", "--learners", "2", "--micro-batch-size", "3", "--zero", "1"], ["--learners 2", "--zero 1"]),
           (["--nproc", "2", "--learners", "1", "--local-sgd", "2"], ["--learners 1", "--local-sgd 2"]),
           (["--sma-alpha", "0.5"], ["--sma-alpha", "--learners"])]
    dc.check_all_rejected(args.meshtrain, init_path, data_path, args.workdir, bad, checks)
    checks.finish()


if __name__ == "__main__":
    main()
