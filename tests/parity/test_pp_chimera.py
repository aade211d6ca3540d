"""Chimera (--schedule chimera --virtual-stages 2: two pipelines in opposite directions over the same ranks, every
stage held twice, even micro-batches down, odd ones up) reproduces the single-process run.

Model and tolerances as test_pp_zero_bubble.py (dp_common's): L=4, H=2, C=32, V=64, B=12, T=16, 20 steps with
warmup 3, cosine, weight decay 0.1, clipping active on some steps.
Layouts: pp 2 (M 2, 4, 12) and pp 4 (M 4, 12), dp 2 x pp 2, tp 2 x pp 2 (also with --sequence-parallel),
dp 2 x pp 2 with ZeRO 1, --recompute; MoE with --ep 2 is in test_moe_layouts.py.
Equal to float32 rounding, not bit for bit to 1F1B: each stage's two copies add up their own pipeline's
micro-batches (the even ones, the odd ones) in ascending order and the two parts are summed over the pair of
ranks holding them (a + b: the same bits on both, whatever the schedule's order), where the single process adds
all micro-batches in one ascending sum. The tied wte on ranks 0 and p - 1 gets its two uses (lookup and logits)
in the list's order there, as zb-v's rank 0 does.
Also checked:
  - the two copies stay equal: the saved weights (from the copy that counts) equal the single run's, and the
    grad norm (each element counted once) equals it every step;
  - held-out loss (--val-data, --eval-every) equal to the single process (each micro-batch's loss and tokens
    counted once, on the rank ending its route);
  - weight memory per rank: the summary's param_bytes summed over the ranks of a pp 2 and a pp 4 chimera run
    is 2 x (the 1F1B run's sum - one wte), the whole model twice (1F1B holds the model once plus a second wte),
    and its pipeline.stage_copies is 2 (1 under 1F1B);
  - a checkpoint at step 5 of a pp 4 run resumes it bit for bit (loss and grad_norm of steps 5-19);
  - refused at start with both flags named: ZeRO 2 and 3, an odd --pp, an odd micro-batch count.
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
CHIMERA = ["--schedule", "chimera", "--virtual-stages", 2]


def param_bytes(lr: dpc.LayoutRunner, tag: str, flags) -> list:
    """The summary's per-rank param_bytes of a 2-step run."""
    summary = lr.out(tag, "summary.json")
    dpc.remove_stale(summary)
    cmd = dpc.train_cmd(lr.args.meshtrain, lr.init_path, lr.data_path, 2, list(flags) + ["--summary", summary], lr.hp)
    r = dpc.run_group(cmd, 300, lr.out(tag, "log"))
    if not lr.checks.check(r.returncode == 0, dpc.failure_text(r, tag)):
        return []
    with open(summary) as f:
        s = json.load(f)
    copies = s.get("pipeline", {}).get("stage_copies")
    want = 2 if "chimera" in flags else 1
    lr.checks.check(copies == want, f"{tag}: summary pipeline.stage_copies {copies}, want {want}")
    return [rank["param_bytes"] for rank in s["ranks"]]


def main() -> None:
    args = parse_args(__doc__)
    checks = dpc.Tally("test_pp_chimera")
    lr = dpc.LayoutRunner(args, checks, CFG, 41, 42, STEPS)

    want, want_w = lr.run("single", [])
    if want is None:
        checks.finish()
    layouts = [
        ("pp2_M2", ["--nproc", 2, "--pp", 2, "--micro-batch-size", 6]),
        ("pp2_M4", ["--nproc", 2, "--pp", 2, "--micro-batch-size", 3]),
        ("pp2_M12", ["--nproc", 2, "--pp", 2, "--micro-batch-size", 1]),
        ("pp4_M4", ["--nproc", 4, "--pp", 4, "--micro-batch-size", 3]),
        ("pp4_M12", ["--nproc", 4, "--pp", 4, "--micro-batch-size", 1]),
        ("dp2_pp2_M2", ["--nproc", 4, "--pp", 2, "--micro-batch-size", 3]),
        ("tp2_pp2_M4", ["--nproc", 4, "--tp", 2, "--pp", 2, "--micro-batch-size", 3]),
        ("tp2_pp2_M4_sp", ["--nproc", 4, "--tp", 2, "--pp", 2, "--micro-batch-size", 3, "--sequence-parallel"]),
        ("dp2_pp2_M2_z1", ["--nproc", 4, "--pp", 2, "--micro-batch-size", 3, "--zero", 1]),
        ("pp2_M4_recompute", ["--nproc", 2, "--pp", 2, "--micro-batch-size", 3, "--recompute"]),
    ]
    print(f"\n{'layout':<30}{'max|dloss|':>12}{'gn rel':>10}{'max|dw|':>10}{'s':>6}")
    for tag, flags in layouts:
        t0 = time.time()
        name = f"{tag}_chimera"
        got, got_w = lr.run(name, flags + CHIMERA)
        if got is None:
            continue
        wl, wg, dw = lr.compare(name, got, got_w, want, want_w)
        print(f"{name:<30}{wl:>12.2e}{wg:>10.2e}{dw:>10.2e}{time.time() - t0:>6.1f}")

    # Held-out loss: every micro-batch's loss and tokens counted once.
    val = ["--val-data", lr.data_path, "--eval-every", 10, "--eval-batches", 2]
    single_v, _ = lr.run("single_val", val, save=False)
    chim_v, _ = lr.run("pp2_M4_val_chimera", ["--nproc", 2, "--pp", 2, "--micro-batch-size", 3] + CHIMERA + val,
                       save=False)
    if single_v is not None and chim_v is not None:
        a = [(r["step"], r["val_loss"]) for r in single_v if "val_loss" in r]
        b = [(r["step"], r["val_loss"]) for r in chim_v if "val_loss" in r]
        worst = max((abs(x[1] - y[1]) for x, y in zip(a, b)), default=float("inf"))
        checks.check(len(a) == 2 and [x[0] for x in a] == [y[0] for y in b] and worst <= 1e-5,
                     f"held-out loss: chimera {b} against the single process {a}")
        print(f"val_loss rows {a} vs {b}: max diff {worst:.2e}")

    # Weight memory: the whole model twice over the ranks (1F1B: once, plus the last stage's wte copy).
    wte = 4 * CFG.vocab_size * CFG.n_embd
    for p in (2, 4):
        base = ["--nproc", p, "--pp", p, "--micro-batch-size", 3]
        one = param_bytes(lr, f"mem_pp{p}_1f1b", base + ["--schedule", "1f1b"])
        chim = param_bytes(lr, f"mem_pp{p}_chimera", base + CHIMERA)
        if one and chim:
            checks.check(sum(chim) == 2 * (sum(one) - wte),
                         f"pp {p}: chimera param_bytes per rank {chim} (sum {sum(chim)}) against 1f1b's {one}: "
                         f"want 2 x ({sum(one)} - {wte})")
            print(f"pp {p} param_bytes per rank: 1f1b {one}, chimera {chim} ({sum(chim) / (sum(one) - wte):.3f}x "
                  f"the model)")

    # A checkpoint taken at step 5 of a pp 4 chimera run resumes it bit for bit (both copies of every stage
    # saved and loaded by name on each of their ranks).
    ck = lr.out("resume_ck", "d")
    dpc.remove_stale(ck)
    flags = ["--nproc", 4, "--pp", 4, "--micro-batch-size", 3] + CHIMERA
    whole, _ = lr.run("resume_whole_chimera", flags, save=False)
    first, _ = lr.run("resume_first_chimera", flags + ["--checkpoint-dir", ck, "--stop-at-step", 5], end=5,
                      save=False)
    rest, _ = lr.run("resume_rest_chimera", flags + ["--checkpoint-dir", ck, "--resume", ck], first=5, save=False)
    if whole is not None and first is not None and rest is not None:
        a = [(r["step"], r["loss"], r["grad_norm"]) for r in whole if r["step"] >= 5]
        b = [(r["step"], r["loss"], r["grad_norm"]) for r in rest]
        checks.check(len(a) == STEPS - 5 and a == b, f"resumed chimera run: {b[:2]} against the whole run's {a[:2]}")
        print(f"resume at step 5 (pp 4): {sum(x == y for x, y in zip(a, b))} of {len(a)} rows bit-equal")

    # Refusals, at start, naming the flags.
    base = dpc.train_cmd(args.meshtrain, lr.init_path, lr.data_path, 2, [], lr.hp)
    for label, flags, names in [
        ("zero2", ["--nproc", 4, "--pp", 2, "--micro-batch-size", 3, "--zero", 2] + CHIMERA,
         ["--schedule chimera with --zero 2"]),
        ("zero3", ["--nproc", 4, "--pp", 2, "--micro-batch-size", 3, "--zero", 3] + CHIMERA,
         ["--schedule chimera with --zero 3"]),
        ("odd_pp", ["--nproc", 3, "--pp", 3, "--micro-batch-size", 3] + CHIMERA, ["(--pp), got 3"]),
        ("odd_m", ["--nproc", 2, "--pp", 2, "--micro-batch-size", 4] + CHIMERA,
         ["micro-batches per pipeline rank, got 3", "--batch-size", "--micro-batch-size"]),
        ("chunks", ["--nproc", 2, "--pp", 2, "--micro-batch-size", 3, "--schedule", "chimera"],
         ["--virtual-stages 2"]),
    ]:
        dpc.check_rejected(base + [str(x) for x in flags], lr.out(f"bad_{label}", "jsonl"),
                           lr.out(f"bad_{label}", "log"), names, checks, label)
    checks.finish()


if __name__ == "__main__":
    main()
