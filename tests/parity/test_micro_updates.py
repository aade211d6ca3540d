"""--schedule pipedream (weight stashing, --vertical-sync) and pipemare against an independent reference.

The rule (docs/parallelism.md, "PipeDream and PipeMare"): the run is cut into windows of steps (one ends
after every evaluation, checkpoint, stop, the last step, 64 steps at most; every step when m < p, where the run
flushes); 1F1B's order over each window's K m micro-batches on every stage (no flush between the window's
steps) with an update of the stage right after each micro-batch's backward; a forward reads its stage's newest
version (vertical sync: stage 0's); a backward reads its forward's version (pipedream) or the newest
(pipemare); update n = s m + i applies micro-batch i's mean-loss gradient over all stages, clipped by its own
global norm, AdamW t = n + 1, lr of step s; the row of step s: the mean of the m losses and pre-clip norms.
micro_update_reference.py simulates it serially in PyTorch from that text, on gpt_reference.py's model.

Problem: test_delay_one's (L=4, H=2, C=32, V=64, B=12, T=16, 12 steps, AdamW lr 1e-3 -> 1e-4, warmup 3,
clip 2.5; --stage-layers given so the reference's split is the run's). Clipping acts on some micro-batch
updates and not others (asserted from the reference).
meshtrain runs, each compared with the reference of its rule: pipedream at pp 2 (m 2, m 4) and pp 4 (m 4),
pipedream --vertical-sync at pp 4, pipemare at pp 2 and 4, pipedream at dp 2 x pp 2 (m 2), pipemare at
tp 2 x pp 2 (m 2), pipedream with --zero 1 --recompute at dp 2 x pp 2 (m 2).
Tolerances: loss 2e-4 abs, grad_norm 1e-3 rel, lr 1e-6 rel, final weights 2e-4 abs (test_delay_one's).
Every layout above has m >= p, so it runs without a flush: one window of the 12 steps; pipedream at pp 4 with
m 2 (< p) flushes after every step (the one-step windows of the reference). --summary's
pipeline.flush_between_steps is false without the flush, true with it; the trace of pp 2 m 2 shows rank 0's
first forward of step t+1 before step t's last backward for every t, that of the flushed run every step ending
with its last backward.
The comparison can fail: at pp 4 the three rules (stash, vertical sync, newest) and the exact 1F1B run are
asserted to differ pairwise in the reference by more than 20x the loss tolerance or 10x the weight tolerance,
and the no-flush rule from the flushed one (pp 2 m 4 and pp 4 m 4, both stash and newest).
Stash depth: `--summary`'s pipeline section reports the most versions each rank held (instrumented by the
stash); without a flush it equals, per rank, the schedule's in-flight count of the window's list (printed by
`meshtrain simulate --schedule pipedream --steps 12`, from the C++ list) and the reference's count: p - j on
rank j (pp 4 m 4: 4, 3, 2, 1; pp 2 m 4: 2, 1); flushed (pp 4 m 2) the reference's one-step count; pipemare 1
everywhere.
Evaluation: pipedream at pp 2 with --eval-every 4 follows the reference of windows of 4 steps (asserted to
differ from one window of 12).
Checkpoint: pipedream at pp 2 with --save-every 3 (windows of 3 steps) stopped at step 6 and resumed (one
window of steps 6..11) continues the reference's trajectory.
Bad input (refused naming both flags): pipedream with --zero 2, --vertical-sync with pipemare, pipemare with
--recompute, pipedream with --delayed-update, pipedream at --pp 1.
--help: --schedule's text says pipedream and pipemare CHANGE THE MATH.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dp_common as dpc  # noqa: E402
import gpt_reference as ref  # noqa: E402
import micro_update_reference as mr  # noqa: E402
from parity_harness import parse_args  # noqa: E402
from run_files import trace_computations  # noqa: E402

CFG = ref.GPTConfig(n_layer=4, n_head=2, n_embd=32, vocab_size=64, n_positions=32)
STEPS = 12
TOL_LOSS_ABS, TOL_W_ABS = 2e-4, 2e-4
SPLITS = {2: [2, 2], 4: [1, 1, 1, 1]}
# One micro-batch's gradient norm (3.5-8 here) is larger than the step's: dp_common's clip 2.5 would clip
# every update; 5.0 clips some and not others (asserted).
HP = dataclasses.replace(dpc.HP, grad_clip=5.0)


def max_weight_diff(a, b) -> float:
    return max(float(np.abs(a[n].astype(np.float64) - b[n].astype(np.float64)).max()) for n in b)


def main() -> None:
    args = parse_args(__doc__)
    torch.set_num_threads(1)
    checks = dpc.Tally("test_micro_updates")
    lr = dpc.LayoutRunner(args, checks, CFG, 31, 32, STEPS, HP)
    out = lr.out
    refs = {}

    one_window = tuple(mr.window_lengths(STEPS))  # no evaluation or checkpoint: the 12 steps in one window
    flushed = tuple(mr.window_lengths(STEPS, flush=True))

    def reference(p, m, mode, vsync=False, dp=1, B=dpc.B, windows=one_window):
        key = (p, m, mode, vsync, dp, B, windows)
        if key not in refs:
            refs[key] = mr.train_micro(lr.init_path, lr.data_path, B, dpc.T, STEPS, HP, p, m, SPLITS[p],
                                       mode, vsync, dp, windows=windows)
        return refs[key]

    # --- the reference: clipping acts sometimes, and the rules differ from each other and from the exact run
    hist, W, facts = reference(4, 4, "stash")
    n_upd = STEPS * 4
    checks.check(0 < facts["clipped_updates"] < n_upd,
                 f"test setup: clipping acts on {facts['clipped_updates']} of {n_upd} updates (want some, not all)")
    near = [round(x, 3) for x in facts["norms"] if abs(x / HP.grad_clip - 1) < 1e-2]
    checks.check(not near, f"test setup: update norms {near} within 1% of the clip threshold")
    print("pp 4 m 4 versions read (stash), first 8 of the window per stage: fwd", [f[:8] for f in facts["fwd"]],
          "bwd", [b[:8] for b in facts["bwd"]])
    others = {"vsync": reference(4, 4, "stash", True), "newest": reference(4, 4, "newest")}
    for name, (h2, W2, _) in others.items():
        dl = max(abs(a["loss"] - b["loss"]) for a, b in zip(hist, h2))
        dw = max_weight_diff(W2, W)
        print(f"reference pp 4: stash vs {name}: max |dloss| {dl:.3e}, max |dw| {dw:.3e}")
        checks.check(dl > 20 * TOL_LOSS_ABS or dw > 10 * TOL_W_ABS,
                     f"test setup: {name} too close to stash (loss {dl:.2e}, weights {dw:.2e})")
    # the no-flush rule differs from the flushed one (else the runs could flush and pass)
    for key in ((2, 4, "stash"), (4, 4, "stash"), (4, 4, "newest")):
        h1, W1, _ = reference(*key)
        h2, W2, _ = reference(*key, windows=flushed)
        dl = max(abs(a["loss"] - b["loss"]) for a, b in zip(h1, h2))
        dw = max_weight_diff(W1, W2)
        print(f"reference {key}: no flush vs flushed: max |dloss| {dl:.3e}, max |dw| {dw:.3e}")
        checks.check(dl > 20 * TOL_LOSS_ABS or dw > 10 * TOL_W_ABS,
                     f"test setup: {key} no-flush rule too close to the flushed one (loss {dl:.2e}, weights {dw:.2e})")
    h_v, W_v, _ = others["vsync"]
    h_n, W_n, _ = others["newest"]
    dl = max(abs(a["loss"] - b["loss"]) for a, b in zip(h_v, h_n))
    dw = max_weight_diff(W_v, W_n)
    print(f"reference pp 4: vsync vs newest: max |dloss| {dl:.3e}, max |dw| {dw:.3e}")
    checks.check(dl > 20 * TOL_LOSS_ABS or dw > 10 * TOL_W_ABS, "test setup: vsync too close to newest")

    def compare(tag, key, got, got_w, first=0, windows=one_window):
        h, Wr, _ = reference(*key, windows=windows)
        wl, wg = dpc.compare_steps(got, h[first:], checks, tag, loss_abs=TOL_LOSS_ABS,
                                   against=f"the reference {key}")
        dw = float("nan")
        if got_w is not None:
            dw, where, dk = dpc.weight_diffs(got_w, Wr, CFG)
            k_tol = sum(x["lr"] for x in h) * key[1]
            checks.check(dw <= TOL_W_ABS, f"{tag}: final weights differ from the reference by {dw:.2e} in {where}")
            checks.check(dk <= k_tol, f"{tag}: key-bias slice differs by {dk:.2e} > sum(lr) {k_tol:.2e}")
        print(f"{tag:<30}{wl:>12.2e}{wg:>10.2e}{dw:>10.2e}")

    def pp_flags(p, sched, mb, extra=(), ranks_per_stage=1):
        return ["--nproc", p * ranks_per_stage, "--pp", p, "--schedule", sched,
                "--micro-batch-size", mb, "--stage-layers", ",".join(map(str, SPLITS[p]))] + list(extra)

    layouts = [
        ("pp2_pipedream_m2", (2, 2, "stash"), pp_flags(2, "pipedream", 6)),
        ("pp2_pipedream_m4", (2, 4, "stash"), pp_flags(2, "pipedream", 3)),
        ("pp4_pipedream_m4", (4, 4, "stash"), pp_flags(4, "pipedream", 3)),
        ("pp4_pipedream_vsync_m4", (4, 4, "stash", True), pp_flags(4, "pipedream", 3, ["--vertical-sync"])),
        ("pp2_pipemare_m4", (2, 4, "newest"), pp_flags(2, "pipemare", 3)),
        ("pp4_pipemare_m4", (4, 4, "newest"), pp_flags(4, "pipemare", 3)),
        ("dp2_pp2_pipedream_m2", (2, 2, "stash", False, 2), pp_flags(2, "pipedream", 3, ranks_per_stage=2)),
        ("tp2_pp2_pipemare_m2", (2, 2, "newest"), pp_flags(2, "pipemare", 6, ["--tp", 2], 2)),
        ("dp2_pp2_pipedream_z1_recompute", (2, 2, "stash", False, 2),
         pp_flags(2, "pipedream", 3, ["--zero", 1, "--recompute"], 2)),
    ]
    layouts.append(("pp4_pipedream_m2_flushed", (4, 2, "stash"), pp_flags(4, "pipedream", 6)))

    def in_flight(p, m, sched="pipedream"):
        """The schedule's in-flight count per rank of the window's list, as `meshtrain simulate` prints it."""
        r = subprocess.run([args.meshtrain, "simulate", "--schedule", sched, "--stages", str(p), "--micro-batches",
                            str(m), "--steps", str(STEPS)], capture_output=True, text=True, timeout=120)
        hit = re.search(r"in flight per rank: \[([0-9, ]+)\]", r.stdout)
        checks.check(r.returncode == 0 and hit is not None, f"simulate --steps for {sched} p {p} m {m}: {r.stdout}{r.stderr}")
        return [int(x) for x in hit.group(1).split(",")] if hit else None

    print(f"\n{'layout':<30}{'max|dloss|':>12}{'gn rel':>10}{'max|dw|':>10}")
    for tag, key, extra in layouts:
        flush = tag.endswith("_flushed")
        t0 = time.time()
        summary = out(tag, "summary.json")
        traced = tag in ("pp2_pipedream_m2", "pp4_pipedream_m2_flushed")
        got, got_w = lr.run(tag, extra + ["--summary", summary] + (["--trace", out(tag, "trace.json")] if traced else []))
        if got is None:
            continue
        compare(tag, key, got, got_w, windows=flushed if flush else one_window)
        with open(summary) as f:
            pipe = json.load(f).get("pipeline", {})
        checks.check(pipe.get("flush_between_steps") is flush,
                     f"{tag}: summary flush_between_steps {pipe.get('flush_between_steps')}, want {flush}")
        sim = pipe.get("bubble_simulated_window")  # only without a flush: the window's replay at measured costs
        checks.check((sim is None) == flush and (sim is None or 0 <= sim < 1),
                     f"{tag}: summary bubble_simulated_window {sim} (flushed: {flush})")
        if traced:  # the order rank 0 ran its computations in (the trace records it; not their times)
            seq, m = [c[0] for c in trace_computations(out(tag, "trace.json"), 0)], key[1]
            if flush:  # every step's 2m computations (numbered 0..m-1) end with its last backward
                ok = len(seq) == 2 * m * STEPS and all(seq[2 * m * (t + 1) - 1] == f"B{m - 1}" for t in range(STEPS))
                checks.check(ok, f"{tag}: the flushed run ends every step with its last backward: {seq[:4 * m]}")
            else:  # one window: step t+1's first forward before step t's last backward, every t
                ok = len(seq) == 2 * m * STEPS and all(
                    seq.index(f"F{(t + 1) * m}") < seq.index(f"B{(t + 1) * m - 1}") for t in range(STEPS - 1))
                checks.check(ok, f"{tag}: rank 0 ran step t+1's first forward before step t's last backward, "
                                 f"every t (first computations {' '.join(seq[:3 * m])})")
        if tag in ("pp4_pipedream_m4", "pp4_pipemare_m4", "pp2_pipedream_m4", "pp4_pipedream_m2_flushed"):
            depth = pipe.get("stash_versions")
            want = mr.stash_depth(key[0], key[1] * (1 if flush else STEPS), key[2])
            checks.check(depth == want, f"{tag}: summary stash_versions {depth}, want {want} (the reference's)")
            print(f"  stash versions per rank {depth} (reference {want})")
            if key[2] == "stash" and not flush:
                flying = in_flight(key[0], key[1])
                checks.check(want == [key[0] - j for j in range(key[0])], f"{tag}: reference depth {want}, want p - j")
                checks.check(depth == flying, f"{tag}: stash_versions {depth} != the schedule's in-flight count {flying}")
                print(f"  the schedule's in-flight count per rank {flying}")
        print(f"  ({time.time() - t0:.1f} s)")

    # --- stash depth where 1F1B's steady state is reached on every stage (m >= 2 (p - 1) + 1): B = 16, m = 8
    tag, key = "pp4_pipedream_m8_B16", (4, 8, "stash", False, 1, 16)
    cmd = dpc.train_cmd(args.meshtrain, lr.init_path, lr.data_path, STEPS,
                        pp_flags(4, "pipedream", 2) + ["--summary", out(tag, "summary.json"),
                                                      "--metrics", out(tag, "jsonl"), "--save", out(tag, "safetensors")],
                        HP)
    cmd[cmd.index("--batch-size") + 1] = 16
    dpc.remove_stale(out(tag, "jsonl"), out(tag, "safetensors"))
    r = dpc.run_group(cmd, 300, out(tag, "log"))
    if checks.check(r.returncode == 0, dpc.failure_text(r, tag)):
        got = dpc.read_metrics_range(out(tag, "jsonl"), 0, STEPS, checks, tag)
        compare(tag, key, got, dpc.load_saved(out(tag, "safetensors"), checks, tag, CFG))
        with open(out(tag, "summary.json")) as f:
            depth = json.load(f).get("pipeline", {}).get("stash_versions")
        want = mr.stash_depth(4, 8 * STEPS, "stash")
        checks.check(want == [4, 3, 2, 1], f"reference stash depth {want} at p 4, m 8, want p - j")
        checks.check(depth == want, f"{tag}: summary stash_versions {depth}, want {want}")
        print(f"  stash versions per rank {depth} (reference {want})")

    # --- a checkpoint holds the one version there is (every window ends flushed; --save-every 3 ends one every
    # 3 steps): stopped at step 6 and resumed, the run continues the reference's trajectory
    ck = out("ckpt_pipedream", "d")
    dpc.remove_stale(ck)
    flags = pp_flags(2, "pipedream", 3)
    saved, _ = lr.run("save_pp2_pipedream", flags + ["--checkpoint-dir", ck, "--save-every", 3,
                                                     "--stop-at-step", 6], end=6, save=False)
    # windows: the saved run's end after its checkpoints (steps 2 and 5, then it stops); the resumed run (no
    # --checkpoint-dir) keeps steps 6..11 in one
    threes = tuple(mr.window_lengths(STEPS, ends_after=(2, 5)))
    checks.check(threes == (3, 3, 6), f"test setup: windows {threes}")
    if saved is not None:
        compare("save_pp2_pipedream", (2, 4, "stash"), saved, None, windows=threes)
        got, got_w = lr.run("resume_pp2_pipedream", flags + ["--resume", ck], first=6)
        if got is not None:
            compare("resume_pp2_pipedream", (2, 4, "stash"), got, got_w, first=6, windows=threes)

    # --- an evaluation ends a window too: --eval-every 4 (validation on the training shard) cuts the 12 steps into
    # windows of 4; the training rows follow the reference of those windows
    fours = tuple(mr.window_lengths(STEPS, ends_after=(3, 7, 11)))
    checks.check(fours == (4, 4, 4), f"test setup: windows {fours}")
    got, got_w = lr.run("eval4_pp2_pipedream", pp_flags(2, "pipedream", 3, ["--val-data", lr.data_path,
                                                                           "--eval-every", 4, "--eval-batches", 1]))
    if got is not None:
        compare("eval4_pp2_pipedream", (2, 4, "stash"), got, got_w, windows=fours)
        h4, W4, _ = reference(2, 4, "stash", windows=fours)
        h12, W12, _ = reference(2, 4, "stash")
        dl = max(abs(a["loss"] - b["loss"]) for a, b in zip(h4, h12))
        dw = max_weight_diff(W4, W12)
        print(f"reference (2, 4, 'stash'): windows of 4 vs one of 12: max |dloss| {dl:.3e}, max |dw| {dw:.3e}")
        checks.check(dl > 5 * TOL_LOSS_ABS or dw > 5 * TOL_W_ABS,
                     f"test setup: windows of 4 too close to one window (loss {dl:.2e}, weights {dw:.2e})")

    # --- bad input
    for tag, extra, words in (
            ("bad_z2", ["--nproc", 4, "--pp", 2, "--schedule", "pipedream", "--zero", 2],
             ["--schedule pipedream", "--zero 2"]),
            ("bad_vsync", ["--nproc", 2, "--pp", 2, "--schedule", "pipemare", "--vertical-sync"],
             ["--vertical-sync", "--schedule pipemare"]),
            ("bad_recompute", ["--nproc", 2, "--pp", 2, "--schedule", "pipemare", "--recompute"],
             ["--schedule pipemare", "--recompute"]),
            ("bad_delayed", ["--nproc", 2, "--pp", 2, "--schedule", "pipedream", "--delayed-update"],
             ["--schedule pipedream", "--delayed-update"]),
            ("bad_pp1", ["--schedule", "pipedream"], ["--schedule pipedream", "--pp > 1"])):
        dpc.check_rejected(dpc.train_cmd(args.meshtrain, lr.init_path, lr.data_path, STEPS, extra),
                           out(tag, "jsonl"), out(tag, "log"), words, checks, " ".join(map(str, extra)))

    # --- --help says that both change the math (whitespace collapsed: the help wraps its lines)
    text = re.sub(r"\s+", " ", subprocess.run([args.meshtrain, "train", "--help"], capture_output=True, text=True,
                                               timeout=60).stdout)
    for want in ("pipedream and pipemare CHANGE THE MATH", "--vertical-sync --schedule pipedream:"):
        checks.check(want in text, f"meshtrain train --help does not say {want!r}")
    checks.finish()


if __name__ == "__main__":
    main()
