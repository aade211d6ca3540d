"""Pipeline parallelism reproduces the single-process run.

Model: L=4 (so 2 and 4 stages, and 2 stages x 2 chunks, hold whole blocks), H=2, C=32, V=64, B=12, T=16,
20 steps with warmup 3, cosine, weight decay 0.1 and clipping active on some steps (dp_common's problem
with more layers). Layouts: pp 2, 3, 4 with gpipe and 1f1b at M in {1, P, 2P} micro-batches where B allows,
interleaved (V=2) at M in {P, 2P}, --recompute, dp 2 x pp 2; ZeRO 2 and 3 (the stage runners pass the
store's hooks) with 1F1B and interleaved at pp 2 and pp 4 (and GPipe at pp 2), sharded over dp 2 where the
batch allows it.
Tolerances and their reasons are dp_common's (step-0 loss 1e-5 rel, loss 2e-3 abs, grad_norm 1e-3 rel,
weights 5e-3; key slice of c_attn bias apart).
Also: a checkpoint written under pp 2 resumes in a single process and continues the trajectory; one written
by dp 2 x pp 2 under ZeRO 3 resumes under the same layout and, resharded, under pp 4 with ZeRO 2.
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dp_common as dpc  # noqa: E402
import gpt_reference as ref  # noqa: E402
from parity_harness import parse_args  # noqa: E402

CFG = ref.GPTConfig(n_layer=4, n_head=2, n_embd=32, vocab_size=64, n_positions=32)
STEPS = 20


def check_memory(checks: dpc.Tally, paths: dict) -> None:
    """ZeRO 2 shards a stage's gradients over its dp pair, ZeRO 3 its parameters too: the pair's bytes add up to
    what each rank of the pair holds under ZeRO 0 (whole tensors of its stage)."""
    ranks = {}
    for z, path in paths.items():
        if not checks.check(os.path.isfile(path), f"ZeRO {z}: no --summary at {path}"):
            return
        with open(path) as f:
            ranks[z] = json.load(f)["ranks"]
        if not checks.check(len(ranks[z]) == 4, f"ZeRO {z}: {len(ranks[z])} ranks in the summary, want 4"):
            return
    for j in (0, 1):
        whole = {k: ranks[0][2 * j][k] for k in ("param_bytes", "grad_bytes")}
        checks.check(whole == {k: ranks[0][2 * j + 1][k] for k in whole}, f"ZeRO 0: stage {j}'s pair differs")
        for z, sharded in ((2, ("grad_bytes",)), (3, ("grad_bytes", "param_bytes"))):
            for k in whole:
                pair = ranks[z][2 * j][k] + ranks[z][2 * j + 1][k]
                want = whole[k] if k in sharded else 2 * whole[k]
                checks.check(pair == want, f"ZeRO {z}, stage {j}: {k} of the dp pair {pair}, want {want}")
        print(f"stage {j}: ZeRO 0 holds {whole}; ZeRO 3 pair "
              f"{[(r['param_bytes'], r['grad_bytes']) for r in ranks[3][2 * j:2 * j + 2]]}")


def main() -> None:
    args = parse_args(__doc__)
    checks = dpc.Tally("test_pp_equality")
    lr = dpc.LayoutRunner(args, checks, CFG, 21, 22, STEPS)
    run, out, init_path, data_path = lr.run, lr.out, lr.init_path, lr.data_path

    want, want_w = run("single", [])
    if want is None:
        checks.finish()
    layouts = []
    for p in (2, 3, 4):
        for sched in ("gpipe", "1f1b"):
            for m in sorted({1, p, 2 * p}):
                if dpc.B % m == 0:
                    layouts.append((f"pp{p}_{sched}_M{m}", ["--nproc", p, "--pp", p, "--schedule", sched,
                                                            "--micro-batch-size", dpc.B // m]))
        for m in (p, 2 * p):
            if dpc.B % m == 0:
                layouts.append((f"pp{p}_interleaved_V2_M{m}", ["--nproc", p, "--pp", p, "--schedule", "interleaved",
                                                               "--virtual-stages", 2, "--micro-batch-size", dpc.B // m]))
    layouts += [("pp2_1f1b_M4_recompute", ["--nproc", 2, "--pp", 2, "--micro-batch-size", 3, "--recompute"]),
                ("dp2_pp2_1f1b_M2", ["--nproc", 4, "--pp", 2, "--micro-batch-size", 3])]
    # ZeRO 2 and 3 under a pipeline. dp 2 x pp 4 with interleaving would need M a multiple of 4 in a share
    # of 6 windows, so interleaved pp 4 runs at dp 1 (every bucket alone: binding, gathers and the tie only).
    for z in (2, 3):
        layouts += [(f"dp2_pp2_1f1b_M3_z{z}", ["--nproc", 4, "--pp", 2, "--micro-batch-size", 2, "--zero", z]),
                    (f"dp2_pp2_gpipe_M3_z{z}", ["--nproc", 4, "--pp", 2, "--schedule", "gpipe",
                                                "--micro-batch-size", 2, "--zero", z]),
                    (f"dp2_pp2_interleaved_V2_M2_z{z}", ["--nproc", 4, "--pp", 2, "--schedule", "interleaved",
                                                         "--virtual-stages", 2, "--micro-batch-size", 3,
                                                         "--zero", z]),
                    (f"dp2_pp4_1f1b_M3_z{z}", ["--nproc", 8, "--pp", 4, "--micro-batch-size", 2, "--zero", z]),
                    (f"pp4_interleaved_V2_M4_z{z}", ["--nproc", 4, "--pp", 4, "--schedule", "interleaved",
                                                     "--virtual-stages", 2, "--micro-batch-size", 3, "--zero", z])]
    # Memory per rank (--summary) of dp 2 x pp 2 under ZeRO 0, 2 and 3, 1F1B: ranks 2j and 2j + 1 are stage j's
    # dp pair, whose shards tile the stage's tensors.
    summaries = {"dp2_pp2_1f1b_M2": 0, "dp2_pp2_1f1b_M3_z2": 2, "dp2_pp2_1f1b_M3_z3": 3}
    print(f"\n{'layout':<30}{'max|dloss|':>12}{'gn rel':>10}{'max|dw|':>10}{'s':>6}")
    for tag, extra in layouts:
        t0 = time.time()
        if tag in summaries:
            dpc.remove_stale(out(tag, "summary.json"))
            extra = extra + ["--summary", out(tag, "summary.json")]
        got, got_w = run(tag, extra)
        if got is None:
            continue
        wl, wg, dw = lr.compare(tag, got, got_w, want, want_w)
        print(f"{tag:<30}{wl:>12.2e}{wg:>10.2e}{dw:>10.2e}{time.time() - t0:>6.1f}")

    check_memory(checks, {z: out(tag, "summary.json") for tag, z in summaries.items()})

    ck = os.path.join(args.workdir, "ckpt_pp2")
    dpc.remove_stale(ck)
    saved, _ = run("save_pp2", ["--nproc", 2, "--pp", 2, "--micro-batch-size", 6, "--checkpoint-dir", ck,
                                "--save-every", 4, "--stop-at-step", 8], end=8, save=False)
    if saved is not None:
        got, got_w = run("resume_single", ["--resume", ck], first=8)
        if got is not None:
            wl, _, _ = lr.compare("resume_single", got, got_w, want[8:], want_w)
            print(f"{'pp2 -> single (resume)':<30}{wl:>12.2e}")

    # ZeRO 3 under a pipeline: parameter and state shards of each stage go to whole tensors and back.
    ck = os.path.join(args.workdir, "ckpt_dp2_pp2_z3")
    dpc.remove_stale(ck)
    z3 = ["--nproc", 4, "--pp", 2, "--micro-batch-size", 2, "--zero", 3]
    saved, _ = run("save_dp2_pp2_z3", z3 + ["--checkpoint-dir", ck, "--save-every", 4, "--stop-at-step", 8], end=8,
                   save=False)
    if saved is not None:
        for tag, extra in (("resume_dp2_pp2_z3", z3),
                           ("resume_pp4_z2", ["--nproc", 4, "--pp", 4, "--micro-batch-size", 3, "--zero", 2])):
            got, got_w = run(tag, extra + ["--resume", ck], first=8)
            if got is not None:
                wl, _, dw = lr.compare(tag, got, got_w, want[8:], want_w)
                print(f"{'dp2xpp2 z3 -> ' + tag[7:] + ' (resume)':<30}{wl:>12.2e}{'':>10}{dw:>10.2e}")
    checks.finish()


if __name__ == "__main__":
    main()
