"""The zero-bubble schedules (zb-h1, zb-h2, zb-v: the backward split in its input and weight halves) reproduce the
single-process run; zb-h1 and zb-h2 equal 1F1B under the same layout bit for bit.

Model and tolerances as test_pp_equality.py (dp_common's): L=4, H=2, C=32, V=64, B=12, T=16, 20 steps with warmup
3, cosine, weight decay 0.1, clipping active on some steps.
Layouts: zb-h1 and zb-h2 at pp 2 (M 2, 4, 12) and pp 4 (M 4, 12), dp 2 x pp 2, tp 2 x pp 2 (also with
--sequence-parallel), dp 2 x pp 2 with ZeRO 1, 2 and 3 (the store's hooks hear that a group's gradients are final
at its weight half), --recompute (the recomputed intermediates kept until the weight half), bf16 products.
Bit for bit: a split backward computes each parameter gradient with the kernels of the whole one, and every
schedule adds the micro-batches' contributions in ascending order, so a zero-bubble run and the 1F1B run of the
same layout write the same metrics (loss, grad_norm) at every step and save the same weights, byte for byte.
zb-v (--virtual-stages 2, rank j holding stages j and 2p - 1 - j; pp 4 puts 4 blocks on 8 stages, some empty)
runs every layout but ZeRO 2 and 3 (refused with it) against the single process only: both ends are on rank 0,
where the tied wte's two uses add to one gradient in the schedule's order, not 1F1B's (a sum of two copies).
(MoE with --ep 2 under the zero-bubble schedules is in test_moe_layouts.py.)
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dp_common as dpc  # noqa: E402
import gpt_reference as ref  # noqa: E402
from parity_harness import parse_args  # noqa: E402

CFG = ref.GPTConfig(n_layer=4, n_head=2, n_embd=32, vocab_size=64, n_positions=32)
STEPS = 20


def same_bits(checks: dpc.Tally, tag: str, got, got_w, peer, peer_w) -> bool:
    """Every step's loss and grad_norm, and every saved tensor, identical to the peer run's."""
    rows = [(g["step"], g["loss"], g["grad_norm"]) for g in got]
    peer_rows = [(g["step"], g["loss"], g["grad_norm"]) for g in peer]
    diff = [(a, b) for a, b in zip(rows, peer_rows) if a != b]
    ok = checks.check(len(rows) == len(peer_rows) and not diff,
                      f"{tag}: metrics differ from 1f1b's at {len(diff)} steps, first {diff[:1]}")
    if got_w is None or peer_w is None:
        return False
    bad = [n for n in peer_w if not np.array_equal(got_w[n].view(np.uint32), peer_w[n].view(np.uint32))]
    return checks.check(not bad, f"{tag}: saved weights differ from 1f1b's in {len(bad)} tensors, e.g. {bad[:3]}") and ok


def main() -> None:
    args = parse_args(__doc__)
    checks = dpc.Tally("test_pp_zero_bubble")
    lr = dpc.LayoutRunner(args, checks, CFG, 41, 42, STEPS)

    want, want_w = lr.run("single", [])
    if want is None:
        checks.finish()
    # (tag, flags without --schedule, compare bit for bit with 1f1b under the same flags)
    layouts = [
        ("pp2_M2", ["--nproc", 2, "--pp", 2, "--micro-batch-size", 6], True),
        ("pp2_M4", ["--nproc", 2, "--pp", 2, "--micro-batch-size", 3], True),
        ("pp2_M12", ["--nproc", 2, "--pp", 2, "--micro-batch-size", 1], False),
        ("pp4_M4", ["--nproc", 4, "--pp", 4, "--micro-batch-size", 3], True),
        ("pp4_M12", ["--nproc", 4, "--pp", 4, "--micro-batch-size", 1], False),
        ("dp2_pp2_M2", ["--nproc", 4, "--pp", 2, "--micro-batch-size", 3], False),
        ("tp2_pp2_M4", ["--nproc", 4, "--tp", 2, "--pp", 2, "--micro-batch-size", 3], True),
        ("tp2_pp2_M4_sp", ["--nproc", 4, "--tp", 2, "--pp", 2, "--micro-batch-size", 3, "--sequence-parallel"], True),
        ("dp2_pp2_M3_z1", ["--nproc", 4, "--pp", 2, "--micro-batch-size", 2, "--zero", 1], False),
        ("dp2_pp2_M3_z2", ["--nproc", 4, "--pp", 2, "--micro-batch-size", 2, "--zero", 2], True),
        ("dp2_pp2_M3_z3", ["--nproc", 4, "--pp", 2, "--micro-batch-size", 2, "--zero", 3], True),
        ("pp2_M4_recompute", ["--nproc", 2, "--pp", 2, "--micro-batch-size", 3, "--recompute"], True),
        ("pp2_M4_bf16", ["--nproc", 2, "--pp", 2, "--micro-batch-size", 3, "--precision", "bf16"], True),
    ]
    print(f"\n{'layout':<30}{'max|dloss|':>12}{'gn rel':>10}{'max|dw|':>10}{'=1f1b':>7}{'s':>6}")
    for tag, flags, bitwise in layouts:
        peer = peer_w = None
        if bitwise:
            peer, peer_w = lr.run(f"{tag}_1f1b", flags + ["--schedule", "1f1b"])
        zero = flags[flags.index("--zero") + 1] if "--zero" in flags else 0
        for sched in ("zb-h1", "zb-h2") + (("zb-v",) if zero < 2 else ()):
            t0 = time.time()
            name = f"{tag}_{sched}"
            got, got_w = lr.run(name, flags + ["--schedule", sched]
                                + (["--virtual-stages", 2] if sched == "zb-v" else []))
            if got is None:
                continue
            if "--precision" in flags:  # bf16 products: the single process runs in float32; only 1f1b is a peer
                wl = wg = dw = float("nan")
            else:
                wl, wg, dw = lr.compare(name, got, got_w, want, want_w)
            equal = "-"
            if peer is not None and sched != "zb-v":
                equal = "yes" if same_bits(checks, name, got, got_w, peer, peer_w) else "NO"
            print(f"{name:<30}{wl:>12.2e}{wg:>10.2e}{dw:>10.2e}{equal:>7}{time.time() - t0:>6.1f}")
    checks.finish()


if __name__ == "__main__":
    main()
