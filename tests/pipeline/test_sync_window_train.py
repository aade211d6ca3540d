"""1f1b, zb-h1 and zb-h2 trained back to back (train/sync_window_steps.h), against the same run ending every
step with the update's reductions over all stages.

A tiny GPT (4 blocks, C 32, V 64; C 256 and T 64 where the trace's order is checked) on random tokens, 6 steps,
AdamW, each case run twice:
  --grad-clip 0      the back-to-back executor (no clipping: each stage updates once its own gradient, its dp
                     reduction and the tied wte's other copy are in)
  --grad-clip 1e9    the per-step path (clipping on, so every step's update waits for the global norm); the
                     threshold is never reached, so the arithmetic is the same: no gradient is ever scaled
Cases: zb-h2 at pp 2 (blocks 1,3: a heavy last stage) and pp 4 (m 4), zb-h1 at pp 2, 1f1b at pp 2, zb-h2 at
dp 2 x pp 2 (ZeRO 0 and 1) and tp 2 x pp 2 (also --sequence-parallel), zb-h1 with --recompute, zb-h2 with
--precision bf16, and zb-h2 at pp 2 with --save-every 2 (windows of 2 steps) and --eval-every 3.
Checked:
  - the log and --summary (pipeline.back_to_back, and flush_between_steps false only back to back) say which
    path ran;
  - every metrics row's fields but the timings (loss, grad_norm, lr, comm bytes, val_loss, and at dp 2 the noise
    scale's noise_*), the final weights, and (--save-every) the step-4 checkpoint are the same bits in both runs;
  - zb-h2 at pp 2 stopped after step 3 (--stop-at-step, a checkpoint) and resumed equals the uninterrupted run;
  - a diverging run (lr 1e4) stops with the same message, naming the same step, on both paths;
  - the barrier is gone (zb cases at pp 2 with the heavy last stage): in the back-to-back run, for some step t,
    rank 0's first forward of step t+1 started before the last rank's last computation of step t (a deferred W)
    ended; in the per-step run never, for any t (rank 0's update waits for that W through the norm's
    reduction), so this check fails when the window path is not taken. Steps are told apart by counting each
    rank's computations in time order (2m per step for 1f1b, 3m for zb-h1 / zb-h2).
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"))
from parity_harness import parse_args, single_thread_env  # noqa: E402
from run_files import tensor_bytes, trace_computations, write_random_shard  # noqa: E402

B, T, STEPS = 8, 16, 6


def main():
    args = parse_args(__doc__)
    data = os.path.join(args.workdir, "data.bin")
    write_random_shard(data, 20000, 64)
    fails = checks = 0

    def check(ok, msg):
        nonlocal fails, checks
        checks += 1
        print(("ok   " if ok else "FAIL ") + msg, flush=True)
        fails += not ok

    def train(tag, P, m, clip, extra, layout=(), wide=False):
        out = os.path.join(args.workdir, tag)
        nproc, dp = P, 1
        if layout:  # ("dp", 2) or ("tp", 2): twice the ranks
            nproc, dp = 2 * P, 2 if layout[0] == "dp" else 1
        # wide: computations of milliseconds (C 256, T 64), so that a W outlasts a message between ranks
        C, H, Tn = (256, 4, 64) if wide else (32, 2, T)
        cmd = [args.meshtrain, "train", "--data", data, "--seq-len", str(Tn), "--batch-size", str(B),
               "--steps", str(STEPS), "--threads", "1", "--n-layer", "4", "--n-head", str(H), "--n-embd", str(C),
               "--vocab-size", "64", "--n-positions", str(max(32, Tn)), "--nproc", str(nproc), "--pp", str(P),
               *(["--tp", "2"] if layout and layout[0] == "tp" else []),
               "--micro-batch-size", str(B // dp // m), "--lr", "3e-3", "--grad-clip", clip,
               "--metrics", out + ".jsonl", "--save", out + ".safetensors", "--trace", out + ".trace.json",
               "--summary", out + ".summary.json", *extra]
        r = subprocess.run(cmd, env=single_thread_env(), timeout=300, capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout, r.stderr)
            raise SystemExit(f"{tag}: meshtrain exited {r.returncode}")
        with open(out + ".jsonl") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        rows = [x for x in rows if "loss" in x and "step" in x]
        with open(out + ".summary.json") as f:
            pipe = json.load(f)["pipeline"]
        b2b, flush = pipe.get("back_to_back"), pipe.get("flush_between_steps")
        return r.stderr, rows, tensor_bytes(out + ".safetensors"), out + ".trace.json", (b2b, flush)

    def overtakes(trace, sched, P, m):
        """Steps t at which rank 0's first forward of t+1 started before rank P-1's last computation of t ended."""
        n = 2 * m if sched == "1f1b" else 3 * m
        first, last = trace_computations(trace, 0), trace_computations(trace, P - 1)
        if len(first) != n * STEPS or len(last) != n * STEPS:
            return None
        return [t for t in range(STEPS - 1) if first[n * (t + 1)][1] < last[n * (t + 1) - 1][2]]

    cases = [  # (tag, schedule, P, m, extra flags, layout, check the overtaking)
        ("zbh2_P2", "zb-h2", 2, 4, ["--stage-layers", "1,3"], (), True),
        ("zbh1_P2", "zb-h1", 2, 4, ["--stage-layers", "1,3"], (), True),
        ("1f1b_P2", "1f1b", 2, 4, [], (), False),
        ("zbh2_P4", "zb-h2", 4, 4, [], (), False),
        ("zbh2_dp2", "zb-h2", 2, 2, [], ("dp", 2), False),
        ("zbh2_tp2", "zb-h2", 2, 4, [], ("tp", 2), False),
        ("zbh2_dp2_z1", "zb-h2", 2, 2, ["--zero", "1"], ("dp", 2), False),
        ("zbh1_P2_recompute", "zb-h1", 2, 4, ["--recompute"], (), False),
        ("zbh2_P2_bf16", "zb-h2", 2, 4, ["--precision", "bf16"], (), False),
        ("zbh2_tp2_sp", "zb-h2", 2, 4, ["--sequence-parallel"], ("tp", 2), False),
        ("zbh2_P2_ckpt", "zb-h2", 2, 4,
         ["--save-every", "2", "--eval-every", "3", "--val-data", "DATA", "--eval-batches", "1"], (), False),
    ]
    for tag, sched, P, m, extra_both, layout, overtaking in cases:
        runs, ck = {}, {}
        for kind, clip in (("b2b", "0"), ("step", "1e9")):
            extra = [data if x == "DATA" else x for x in extra_both] + ["--schedule", sched]
            if "--save-every" in extra_both:
                ck[kind] = os.path.join(args.workdir, f"ckpt_{tag}_{kind}")
                extra += ["--checkpoint-dir", ck[kind], "--overwrite-checkpoints"]
            runs[kind] = train(f"{tag}_{kind}", P, m, clip, extra, layout, wide=overtaking)
        err_a, rows_a, w_a, trace_a, (b2b_a, flush_a) = runs["b2b"]
        err_b, rows_b, w_b, trace_b, (b2b_b, flush_b) = runs["step"]
        check(f"{sched} back to back" in err_a and b2b_a is True and b2b_b is False
              and "not back to back: --grad-clip" in err_b and flush_a is False and flush_b is True,
              f"{tag}: the log and the summary say which path ran (back_to_back {b2b_a} / {b2b_b}, "
              f"flush_between_steps {flush_a} / {flush_b})")
        # Every field but the timings: loss, grad_norm, lr, comm bytes, val_loss, noise_* (dp 2 cases).
        def fields(r):
            return {k: v for k, v in r.items() if k not in ("step_time_s", "tokens_per_s")}
        same_rows = len(rows_a) == len(rows_b) == STEPS and all(fields(a) == fields(b) for a, b in zip(rows_a, rows_b))
        keys = sorted(fields(rows_a[0])) if rows_a else []
        check(same_rows, f"{tag}: every row's {keys} bit for bit (back to back "
                         f"{[r['loss'] for r in rows_a][:3]}..., per step {[r['loss'] for r in rows_b][:3]}...)")
        check(w_a == w_b and len(w_a) > 0, f"{tag}: final weights bit for bit ({len(w_a)} tensors)")
        if ck:
            a4 = os.path.join(ck["b2b"], "step_00000004", "model.safetensors")
            b4 = os.path.join(ck["step"], "step_00000004", "model.safetensors")
            both = os.path.exists(a4) and os.path.exists(b4)
            check(both and tensor_bytes(a4) == tensor_bytes(b4),
                  f"{tag}: the checkpoints at step 4 hold the same tensors")
            va = [r.get("val_loss") for r in rows_a if "val_loss" in r]
            vb = [r.get("val_loss") for r in rows_b if "val_loss" in r]
            check(len(va) == 2 and va == vb, f"{tag}: evaluations after steps 3 and 6 equal ({va} / {vb})")
        if overtaking:
            oa, ob = overtakes(trace_a, sched, P, m), overtakes(trace_b, sched, P, m)
            check(oa is not None and ob is not None and len(oa) >= 1 and ob == [],
                  f"{tag}: rank 0 started step t+1 before rank {P - 1} ended step t at steps {oa} back to back, "
                  f"at {ob} per step")
    # Stopped and resumed: --stop-at-step 3 ends the window there (with a checkpoint), --resume continues in a new
    # window; rows and final weights equal the uninterrupted back-to-back run's.
    base = [args.meshtrain, "train", "--data", data, "--seq-len", str(T), "--batch-size", str(B), "--steps", str(STEPS),
            "--threads", "1", "--n-layer", "4", "--n-head", "2", "--n-embd", "32", "--vocab-size", "64",
            "--n-positions", "32", "--nproc", "2", "--pp", "2", "--micro-batch-size", "2", "--lr", "3e-3",
            "--grad-clip", "0", "--schedule", "zb-h2", "--quiet"]
    rdir = os.path.join(args.workdir, "resume")
    ck = os.path.join(rdir, "ck")
    os.makedirs(rdir, exist_ok=True)
    legs = [("full", []), ("part", ["--stop-at-step", "3", "--checkpoint-dir", ck, "--save-every", "2",
                                    "--overwrite-checkpoints"]),
            ("rest", ["--checkpoint-dir", ck, "--save-every", "2", "--resume", ck])]
    ok_runs = same = w_same = True
    for leg, extra in legs:
        out = os.path.join(rdir, leg)
        r = subprocess.run(base + extra + ["--metrics", out + ".jsonl", "--save", out + ".safetensors"],
                           env=single_thread_env(), timeout=300, capture_output=True, text=True)
        ok_runs = ok_runs and r.returncode == 0
        if r.returncode != 0:
            print(r.stderr[-2000:])
    if ok_runs:
        rows = {}
        for leg in ("full", "part", "rest"):
            with open(os.path.join(rdir, leg + ".jsonl")) as f:
                rows[leg] = [json.loads(x) for x in f if x.strip()]
        got = rows["part"] + rows["rest"]
        same = [x["step"] for x in got] == list(range(STEPS)) and all(
            (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"]) for a, b in zip(got, rows["full"]))
        w_same = (tensor_bytes(os.path.join(rdir, "full.safetensors"))
                  == tensor_bytes(os.path.join(rdir, "rest.safetensors")))
    check(ok_runs and same and w_same, "stopped after step 3 and resumed: rows and final weights equal the "
                                       "uninterrupted back-to-back run's")
    # A step that diverges: both paths stop naming the same step (the window at its end, after its later updates).
    stops = {}
    for kind, clip in (("b2b", "0"), ("step", "1e9")):
        cmd = [args.meshtrain, "train", "--data", data, "--seq-len", str(T), "--batch-size", str(B), "--steps", "12",
               "--threads", "1", "--n-layer", "4", "--n-head", "2", "--n-embd", "32", "--vocab-size", "64",
               "--n-positions", "32", "--nproc", "2", "--pp", "2", "--micro-batch-size", "2", "--lr", "1e4",
               "--warmup-steps", "0", "--grad-clip", clip, "--schedule", "zb-h2", "--quiet"]
        r = subprocess.run(cmd, env=single_thread_env(), timeout=300, capture_output=True, text=True)
        lines = [x.split("failed: ", 1)[1] for x in r.stderr.splitlines() if "failed: " in x]
        stops[kind] = (r.returncode, lines[0] if lines else r.stderr[-300:])
    check(stops["b2b"][0] == stops["step"][0] == 1 and " at step " in stops["b2b"][1]
          and stops["b2b"][1] == stops["step"][1],
          f"diverging run: both stop with the same message ({stops['b2b']} / {stops['step']})")
    print(f"test_sync_window_train: {checks - fails} passed, {fails} failed")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
