"""Pipeline parallelism in hybrids reproduces the single-process run, and what it reports is measured.

Model: L=4, H=2, C=32, V=63 (odd: the vocabulary-parallel wte, held by the first and the last stage, is split
unevenly by tp 2), B=12, T=16, 20 steps with warmup 3, cosine, weight decay 0.1 and clipping active on some
steps; every run also evaluates on the training shard every 5 steps (--eval-every 5 --eval-batches 2).
Tolerances and their reasons are dp_common's (step-0 loss 1e-5 rel, loss 2e-3 abs, grad_norm 1e-3 rel,
weights 5e-3, the key slice of each c_attn bias apart); validation losses within 1e-4 relative (one forward on
weights that differ by float32 rounding).

Layouts: tp 2 x pp 2 with each schedule; dp 2 x pp 2 with ZeRO 1; dp 2 x tp 2 x pp 2 (8 ranks) with ZeRO 1,
with ZeRO 3 (1F1B and interleaved: parameters gathered per layer inside the stages, also for evaluation), with
ZeRO 0 and --recompute, and with --sequence-parallel (stages pass half the rows); --stage-layers splits with an
empty stage and with virtual stages.
Also: a checkpoint written by dp 2 x tp 2 x pp 2 resumes under tp 2 x pp 2 and continues the trajectory;
1F1B holds fewer micro-batches of activations than GPipe on the first stage (measured peak, --summary);
the --summary pipeline section's ideal bubble is (p - 1) / (m + p - 1); --trace has every computation, send
and receive of every rank.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dp_common as dpc  # noqa: E402
import gpt_reference as ref  # noqa: E402
from parity_harness import parse_args, rel_diff  # noqa: E402

CFG = ref.GPTConfig(n_layer=4, n_head=2, n_embd=32, vocab_size=63, n_positions=32)
STEPS = 20
EVAL = ["--eval-every", 5, "--eval-batches", 2]
TOL_VAL_REL = 1e-4


def main() -> None:
    args = parse_args(__doc__)
    checks = dpc.Tally("test_pp_hybrid")
    lr = dpc.LayoutRunner(args, checks, CFG, 31, 32, STEPS)
    ev = EVAL + ["--val-data", lr.data_path]

    want, want_w = lr.run("single", ev)
    if want is None:
        checks.finish()
    want_val = {r["step"]: r["val_loss"] for r in want if "val_loss" in r}
    checks.check(sorted(want_val) == [4, 9, 14, 19], f"single: val_loss at steps {sorted(want_val)}")

    layouts = [
        ("tp2_pp2_1f1b_M4", ["--nproc", 4, "--tp", 2, "--pp", 2, "--micro-batch-size", 3]),
        ("tp2_pp2_gpipe_M2", ["--nproc", 4, "--tp", 2, "--pp", 2, "--schedule", "gpipe", "--micro-batch-size", 6]),
        ("tp2_pp2_interleaved_M4", ["--nproc", 4, "--tp", 2, "--pp", 2, "--schedule", "interleaved",
                                    "--virtual-stages", 2, "--micro-batch-size", 3]),
        ("dp2_pp2_z1_M2", ["--nproc", 4, "--pp", 2, "--zero", 1, "--micro-batch-size", 3]),
        ("dp2_tp2_pp2_z1_M2", ["--nproc", 8, "--tp", 2, "--pp", 2, "--zero", 1, "--micro-batch-size", 3]),
        ("dp2_tp2_pp2_z3_M2", ["--nproc", 8, "--tp", 2, "--pp", 2, "--zero", 3, "--micro-batch-size", 3]),
        ("dp2_tp2_pp2_z3_interleaved_M2", ["--nproc", 8, "--tp", 2, "--pp", 2, "--zero", 3, "--schedule",
                                           "interleaved", "--virtual-stages", 2, "--micro-batch-size", 3]),
        ("dp2_tp2_pp2_z0_recompute", ["--nproc", 8, "--tp", 2, "--pp", 2, "--micro-batch-size", 2, "--recompute"]),
        ("dp2_tp2_pp2_z1_sp", ["--nproc", 8, "--tp", 2, "--pp", 2, "--zero", 1, "--micro-batch-size", 3,
                               "--sequence-parallel"]),
        ("pp2_stage_layers_1_3", ["--nproc", 2, "--pp", 2, "--stage-layers", "1,3", "--micro-batch-size", 4]),
        ("pp3_stage_layers_2_0_2", ["--nproc", 3, "--pp", 3, "--stage-layers", "2,0,2", "--micro-batch-size", 2]),
        ("pp2_V2_stage_layers_2_1_0_1", ["--nproc", 2, "--pp", 2, "--schedule", "interleaved", "--virtual-stages", 2,
                                         "--stage-layers", "2,1,0,1", "--micro-batch-size", 3]),
    ]
    print(f"\n{'layout':<32}{'max|dloss|':>12}{'gn rel':>10}{'max|dw|':>10}{'val rel':>10}{'s':>6}")
    for tag, extra in layouts:
        t0 = time.time()
        got, got_w = lr.run(tag, extra + ev)
        if got is None:
            continue
        wl, wg, dw = lr.compare(tag, got, got_w, want, want_w)
        got_val = {r["step"]: r["val_loss"] for r in got if "val_loss" in r}
        worst_val = 0.0
        if checks.check(sorted(got_val) == sorted(want_val), f"{tag}: val_loss at steps {sorted(got_val)}"):
            worst_val = max(rel_diff(got_val[s], want_val[s]) for s in want_val)
            checks.check(worst_val <= TOL_VAL_REL, f"{tag}: validation loss differs by {worst_val:.2e} (relative)")
        print(f"{tag:<32}{wl:>12.2e}{wg:>10.2e}{dw:>10.2e}{worst_val:>10.2e}{time.time() - t0:>6.1f}")

    # A checkpoint of the 3-D layout resumes under another layout.
    ck = os.path.join(args.workdir, "ckpt_3d")
    dpc.remove_stale(ck)
    saved, _ = lr.run("save_3d", ["--nproc", 8, "--tp", 2, "--pp", 2, "--zero", 1, "--micro-batch-size", 3,
                                  "--checkpoint-dir", ck, "--save-every", 4, "--stop-at-step", 8], end=8, save=False)
    if saved is not None:
        got, got_w = lr.run("resume_tp2_pp2", ["--nproc", 4, "--tp", 2, "--pp", 2, "--micro-batch-size", 4,
                                               "--resume", ck], first=8)
        if got is not None:
            wl, _, dw = lr.compare("resume_tp2_pp2", got, got_w, want[8:], want_w)
            print(f"{'dp2xtp2xpp2 -> tp2xpp2 (resume)':<32}{wl:>12.2e}{'':>10}{dw:>10.2e}")

    # Activation memory: 12 micro-batches of one window on 2 stages. GPipe's first stage holds all 12 before
    # its first backward; 1F1B's at most 2 (p - j on rank j), plus the backward scratch both have.
    peaks = {}
    for sched in ("gpipe", "1f1b"):
        tag = f"mem_pp2_{sched}_M12"
        summary = lr.out(tag, "summary.json")
        dpc.remove_stale(summary)
        got, _ = lr.run(tag, ["--nproc", 2, "--pp", 2, "--schedule", sched, "--micro-batch-size", 1,
                              "--summary", summary], end=STEPS, save=False)
        if got is None or not checks.check(os.path.isfile(summary), f"{tag}: no --summary written"):
            continue
        with open(summary) as f:
            s = json.load(f)
        ranks = s.get("ranks", [])
        pipe = s.get("pipeline", {})
        if not checks.check(len(ranks) == 2 and all("activation_peak_bytes" in r for r in ranks) and pipe,
                            f"{tag}: summary lacks per-rank activation_peak_bytes or the pipeline section: {s}"):
            continue
        peaks[sched] = [r["activation_peak_bytes"] for r in ranks]
        ideal = (2 - 1) / (12 + 2 - 1)
        checks.check(abs(pipe.get("bubble_ideal", -1) - ideal) < 1e-9,
                     f"{tag}: bubble_ideal {pipe.get('bubble_ideal')} != (p-1)/(m+p-1) = {ideal}")
        for key in ("bubble_measured", "bubble_simulated"):
            v = pipe.get(key, -1)
            checks.check(0 <= v < 1, f"{tag}: {key} = {v} is not a fraction")
        checks.check(pipe.get("stage_layers") == [2, 2], f"{tag}: stage_layers {pipe.get('stage_layers')}")
        print(f"{tag}: activation peak per rank {[round(p / 1024) for p in peaks[sched]]} KiB, bubble measured "
              f"{pipe.get('bubble_measured', -1):.3f} simulated {pipe.get('bubble_simulated', -1):.3f} "
              f"ideal {ideal:.3f}")
    if len(peaks) == 2:
        g0, f0 = peaks["gpipe"][0], peaks["1f1b"][0]
        checks.check(f0 * 3 < g0, f"1F1B's first-stage activation peak {f0} is not below a third of GPipe's {g0}")
        checks.check(peaks["1f1b"][1] * 3 < peaks["gpipe"][1],
                     f"1F1B's last-stage activation peak {peaks['1f1b'][1]} vs GPipe's {peaks['gpipe'][1]}")

    # The trace: 3 steps of 1F1B, p = 2, m = 4: per rank and step 4 forwards, 4 backwards, 4 sends, 4 receives.
    tag = "trace_pp2_1f1b_M4"
    trace = lr.out(tag, "trace.json")
    dpc.remove_stale(trace)
    lr.steps = 3
    got, _ = lr.run(tag, ["--nproc", 2, "--pp", 2, "--micro-batch-size", 3, "--trace", trace], save=False)
    lr.steps = STEPS
    if got is not None and checks.check(os.path.isfile(trace), f"{tag}: no trace written"):
        with open(trace) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
        count = Counter((e["pid"], e["cat"], e["name"].split(" ")[0]) for e in events)
        for pid in (0, 1):
            got_f = sum(v for (p, c, n), v in count.items() if p == pid and c == "forward")
            got_b = sum(v for (p, c, n), v in count.items() if p == pid and c == "backward")
            sends = sum(v for (p, c, n), v in count.items() if p == pid and c == "p2p" and n == "send")
            recvs = sum(v for (p, c, n), v in count.items() if p == pid and c == "p2p" and n == "recv")
            checks.check((got_f, got_b, sends, recvs) == (12, 12, 12, 12),
                         f"{tag}: rank {pid} trace has {got_f} forwards, {got_b} backwards, {sends} sends, "
                         f"{recvs} receives; expected 12 of each")
    checks.finish()


if __name__ == "__main__":
    main()
