"""Checkpoints reshard: a run saved under one (dp, zero) layout resumes under another and continues the
single-process loss trajectory.

The problem is the one of dp_common.py (L=2, H=2, C=32, V=64, B=12, T=16; warmup 3 + cosine over 12 steps,
wd 0.1, clip 2.5, which clips early steps). For each case:
  1. `--nproc a --dp a --zero x --checkpoint-dir D --save-every 3 --stop-at-step 6`: must exit 0, write
     metrics for exactly steps 0..5 and leave a checkpoint in D (at steps 3 and 6: resuming must take
     the newest);
  2. the same command line with `--nproc b --dp b --zero y --resume D` and --steps 12 (the total): its own
     metrics file must hold exactly steps 6..11 (a run that restarted from step 0 or from the older
     checkpoint fails here), and --save writes the final weights.
Both are compared with an uninterrupted `--nproc 1` 12-step run: step 0 loss rel 1e-5, every step's loss
abs 2e-3, grad_norm rel 1e-3, lr rel 1e-6, final weights max abs 5e-3 (the key slice of attn.c_attn.bias
within sum(lr), see dp_common.weight_diffs); a correct implementation differs by float32 reduction
order only, ~1e-6 or less (single-process save + resume is bit-identical today).
Why these catch a broken resume (measured with the PyTorch reference on this problem): Adam moments lost at
step 6 (m, v restart at zero, t kept) move the later losses by up to 9.4e-3 (4.7x the loss tolerance;
weights only by 2.9e-3, under 5e-3, so the loss check is the one that catches it); moments and step count
both lost: loss 2.7e-2. A wrong data position or a garbled optimizer shard (ZeRO-3 -> ZeRO-1
regathers what four ranks held) changes the batches or the updates outright, and a restart from step 0 or
from the step-3 checkpoint fails the exact-steps check. Cases: dp=4 zero=3 -> dp=2 zero=1 (every state
sharded four ways, read back two ways with parameters replicated) and dp=2 zero=2 -> dp=1 zero=0
(back to one process). --init is passed on resume too (the same command line a user would repeat), so a
resume that reloads the initial weights instead of the checkpoint's fails.
"""
from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dp_common as dc  # noqa: E402
from parity_harness import parse_args  # noqa: E402

STEPS, STOP, SAVE_EVERY = 12, 6, 3
RUN_TIMEOUT = 180.0
CASES = [(dc.Layout(4, 3), dc.Layout(2, 1)), (dc.Layout(2, 2), dc.Layout(1, 0))]


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    torch.set_num_threads(1)
    checks = dc.Tally("test_dp_resume_reshard")
    wd, t_start = args.workdir, time.monotonic()
    init_path, data_path, _ = dc.write_inputs(wd)

    base, base_final = dc.single_process_run(args.meshtrain, wd, init_path, data_path, STEPS, RUN_TIMEOUT, checks,
                                             "the uninterrupted single-process run (--nproc 1)")
    norms = [m["grad_norm"] for m in base]
    checks.check(max(norms[:STOP]) > dc.HP.grad_clip and min(norms) < dc.HP.grad_clip,
                 f"test setup: clipping must be active before the stop and inactive somewhere; norms {norms}")
    checks.check(base[-1]["loss"] < base[0]["loss"] - 0.1,
                 f"test setup: loss did not fall ({base[0]['loss']:.4f} -> {base[-1]['loss']:.4f})")
    key_tol = sum(m["lr"] for m in base)

    table = []
    for first, second in CASES:
        label = f"{first.name} -> {second.name}"
        tag = f"{first.tag}__{second.tag}"
        ckpt = os.path.join(wd, f"ckpt_{tag}")
        m1, m2, w2 = (os.path.join(wd, f"{tag}.{x}") for x in ("part1.metrics.jsonl", "part2.metrics.jsonl",
                                                               "final.safetensors"))
        dc.remove_stale(ckpt, m1, m2, w2)
        row = dict(label=label, loss=float("nan"), gn=float("nan"), w=float("nan"), k=float("nan"), secs=0.0)
        table.append(row)
        n_fail = len(checks.failures)

        r = dc.run_group(dc.train_cmd(args.meshtrain, init_path, data_path, STEPS,
                             first.flags() + ["--checkpoint-dir", ckpt, "--save-every", SAVE_EVERY,
                                              "--stop-at-step", STOP, "--metrics", m1]),
                RUN_TIMEOUT, log_prefix=os.path.join(wd, f"{tag}.part1"))
        row["secs"] += r.seconds
        if not checks.check(r.ok, dc.failure_text(r, f"{label}: save under {' '.join(first.flags())}")):
            row["ok"] = False
            continue
        got1 = dc.read_metrics_range(m1, 0, STOP, checks, f"{label}: part 1")
        if got1 is not None:
            l1, g1 = dc.compare_steps(got1, base[:STOP], checks, f"{label}: part 1")
            row["loss"], row["gn"] = l1, g1
        checks.check(os.path.isdir(ckpt) and any(os.scandir(ckpt)),
                     f"{label}: --checkpoint-dir {ckpt} is empty after --stop-at-step {STOP}")

        r = dc.run_group(dc.train_cmd(args.meshtrain, init_path, data_path, STEPS,
                             second.flags() + ["--checkpoint-dir", ckpt, "--save-every", SAVE_EVERY,
                                               "--resume", ckpt, "--metrics", m2, "--save", w2]),
                RUN_TIMEOUT, log_prefix=os.path.join(wd, f"{tag}.part2"))
        row["secs"] += r.seconds
        if not checks.check(r.ok, dc.failure_text(r, f"{label}: resume under {' '.join(second.flags())}")):
            row["ok"] = False
            continue
        got2 = dc.read_metrics_range(m2, STOP, STEPS, checks, f"{label}: part 2 (resumed)")
        if got2 is not None:
            l2, g2 = dc.compare_steps(got2, base[STOP:], checks, f"{label}: part 2 (resumed)")
            row["loss"], row["gn"] = (l2, g2) if got1 is None else (max(row["loss"], l2), max(row["gn"], g2))
        final = dc.load_saved(w2, checks, f"{label}: resumed run")
        if final is not None:
            row["w"], at, row["k"] = dc.weight_diffs(final, base_final)
            checks.check(row["w"] <= dc.TOL_W_ABS, f"{label}: final {at} max abs diff {row['w']:.2e} > "
                         f"{dc.TOL_W_ABS:g}")
            checks.check(row["k"] <= key_tol, f"{label}: key-bias slice max abs diff {row['k']:.2e} > sum(lr) "
                         f"{key_tol:.2e}")
        row["ok"] = len(checks.failures) == n_fail

    print(f"\n{'saved -> resumed':<40} {'max|dloss|':>10} {'gn rel':>9} {'max|dw|':>9} {'k-bias':>9} "
          f"{'seconds':>7}  verdict")
    for row in table:
        print(f"{row['label']:<40} {row['loss']:>10.2e} {row['gn']:>9.2e} {row['w']:>9.2e} {row['k']:>9.2e} "
              f"{row['secs']:>7.1f}  {'ok' if row.get('ok') else 'FAIL'}")
    print(f"total time {time.monotonic() - t_start:.1f} s")
    checks.finish()


if __name__ == "__main__":
    main()
