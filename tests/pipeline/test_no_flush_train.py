"""PipeDream-2BW without a flush in a real training run (train/no_flush_steps.h), against the flushed run of the
same rule.

A tiny GPT on random tokens, 6 steps, AdamW with clipping, at P = 2 (m = 4), P = 4 (m = 4), dp 2 x pp 2 and
tp 2 x pp 2 (m = 4), P = 2 under --precision bf16 and dp 2 x pp 2 under --zero 1, run twice:
  --schedule pipedream-2bw              (the no-flush executor: windows of steps, the log says so)
  --schedule 1f1b --delayed-update      (the same delay-1 rule, flushed after every step)
Checked:
  - the 2BW run's log and --summary (pipeline.flush_between_steps) say it runs without a flush;
  - the flush is gone, as the trace recorded the order of the computations (not their times): on pipeline rank 0
    the forward of step t+1's first micro-batch ran before the backward of step t's last one, for every t; the
    flushed run's trace shows every step ending with its backwards (the check can fail);
  - same rule, same arithmetic: every metrics row's loss and grad_norm and the final weights are equal bit for
    bit between the two runs;
  - under --precision bf16 (the products read the bf16 mirror, which must be remade at every swap of the
    two weight versions inside the window) the same, bit for bit;
  - the 2BW runs at ZeRO 0 log that their reductions start after each rank's last backward (the split exchange,
    train/split_exchange.h: no blocking collective inside the window); at dp 2 x pp 2 under --zero 1 the run
    keeps its blocking updates inside the window (logged) and equals the flushed run all the same;
  - under mpirun (MPI backend, messages past the eager limit) the no-flush 2BW run ends and equals the shm run;
    under --zero 1 (blocking updates) it flushes between steps instead of stalling, and says so;
  - with --checkpoint-dir and --save-every 2 (windows of 2 steps: they end at every checkpoint) the no-flush run
    still equals the flushed one, and its checkpoint at step 4 holds the same tensors as the flushed run's.
"""
import json
import os
import shutil
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

    def train(tag, P, m, extra, layout=(), mpi=False):
        out = os.path.join(args.workdir, tag)
        nproc, dp = P, 1
        if layout:  # ("dp", 2) or ("tp", 2): twice the ranks
            nproc, dp = 2 * P, 2 if layout[0] == "dp" else 1
        ranks = ["--nproc", str(nproc)]
        if mpi:  # the ranks under mpirun (OpenMPI), the MPI backend
            ranks = ["--backend", "mpi", "--comm-timeout", "30"]
        cmd = [args.meshtrain, "train", "--data", data, "--seq-len", str(T), "--batch-size", str(B),
               "--steps", str(STEPS), "--threads", "1", "--n-layer", "4", "--n-head", "2", "--n-embd", "32",
               "--vocab-size", "64", "--n-positions", "32", *ranks, "--pp", str(P),
               *(["--tp", "2"] if layout and layout[0] == "tp" else []),
               "--micro-batch-size", str(B // dp // m), "--lr", "3e-3", "--grad-clip", "0.5", "--metrics", out + ".jsonl",
               "--save", out + ".safetensors", "--trace", out + ".trace.json", "--summary", out + ".summary.json",
               *extra]
        env = single_thread_env()
        if mpi:
            mpirun = shutil.which("mpirun")
            if not mpirun:
                raise SystemExit("mpirun is not on PATH (install openmpi-bin: bash scripts/setup.sh)")
            cmd = [mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(nproc)] + cmd
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_mpi_yield_when_idle="1")
        r = subprocess.run(cmd, env=env, timeout=300, capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout, r.stderr)
            raise SystemExit(f"{tag}: meshtrain exited {r.returncode}")
        with open(out + ".jsonl") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        rows = [x for x in rows if "loss" in x and "step" in x]
        with open(out + ".summary.json") as f:
            flush = json.load(f)["pipeline"].get("flush_between_steps")
        order = [c[0] for c in trace_computations(out + ".trace.json", 0)]
        return r.stderr, rows, tensor_bytes(out + ".safetensors"), order, flush

    cases = [(P, m, label, extra, ()) for P, m in ((2, 4), (4, 4))
             for label, extra in (("", []), ("_ckpt", ["--save-every", "2"]))]
    cases += [(2, 4, "_dp2", [], ("dp", 2)), (2, 4, "_tp2", [], ("tp", 2)),
              (2, 4, "_bf16", ["--precision", "bf16"], ()), (2, 4, "_dp2_zero1", ["--zero", "1"], ("dp", 2))]
    for P, m, label, extra_both, layout in cases:
        ck, runs = {}, {}
        saves = "--save-every" in extra_both
        for kind in ("2bw", "flushed"):
            extra = list(extra_both)
            if saves:
                ck[kind] = os.path.join(args.workdir, f"ckpt_{kind}_{P}")
                extra += ["--checkpoint-dir", ck[kind], "--overwrite-checkpoints"]
            extra += (["--schedule", "pipedream-2bw"] if kind == "2bw"
                      else ["--schedule", "1f1b", "--delayed-update"])
            runs[kind] = train(f"{kind}_P{P}{label}", P, m, extra, layout)
        err_a, rows_a, w_a, seq_a, flush_a = runs["2bw"]
        _, rows_b, w_b, seq_b, flush_b = runs["flushed"]
        name = f"P={P} m={m}{label}"
        check("pipedream-2bw without a flush" in err_a and flush_a is False and flush_b is True,
              f"{name}: the 2BW run says it runs without a flush (log, summary's flush_between_steps "
              f"{flush_a}; the flushed run's {flush_b})")
        # The flush is gone: window numbering i = t m + k in the 2BW trace.
        # With --save-every 2 a window is 2 steps (its numbering starts over); without, the whole run.
        span = 2 if saves else STEPS
        windows = [seq_a[2 * m * span * w:2 * m * span * (w + 1)] for w in range(STEPS // span)]
        order_ok = len(seq_a) == 2 * m * STEPS and all(
            win.index(f"F{(t + 1) * m}") < win.index(f"B{(t + 1) * m - 1}")
            for win in windows for t in range(span - 1))
        check(order_ok, f"{name}: rank 0 ran step t+1's first forward before step t's last backward, every t "
                        f"inside a window of {span} steps (first computations {' '.join(seq_a[:3 * m])})")
        # The flushed run: each step's 2m computations end with B(m-1).
        steps_b = [seq_b[2 * m * t:2 * m * (t + 1)] for t in range(STEPS)]
        check(len(seq_b) == 2 * m * STEPS and all(s[-1] == f"B{m - 1}" for s in steps_b),
              f"{name}: the flushed run ends every step with its last backward")
        same_rows = len(rows_a) == len(rows_b) == STEPS and all(
            a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"] for a, b in zip(rows_a, rows_b))
        check(same_rows, f"{name}: losses and grad norms bit for bit (2BW {[r['loss'] for r in rows_a][:3]}..., "
                         f"flushed {[r['loss'] for r in rows_b][:3]}...)")
        check(w_a == w_b and len(w_a) > 0, f"{name}: final weights bit for bit ({len(w_a)} tensors)")
        if "--zero" not in extra_both:
            check("reductions start after each rank's last backward" in err_a,
                  f"{name}: the 2BW run's reductions are split (no blocking collective inside the window)")
        else:  # ZeRO 1 keeps the blocking update inside the window (train/split_exchange.h), with the same bits
            check("the updates run blocking collectives inside the window: --zero 1" in err_a,
                  f"{name}: the 2BW run logs that its updates stay blocking under --zero 1")
        if saves:
            a4 = os.path.join(ck["2bw"], "step_00000004", "model.safetensors")
            b4 = os.path.join(ck["flushed"], "step_00000004", "model.safetensors")
            both = os.path.exists(a4) and os.path.exists(b4)
            check(both and tensor_bytes(a4) == tensor_bytes(b4),
                  f"{name}: the checkpoints at step 4 hold the same tensors")
    # Under mpirun (MPI backend): each activation message here is 4104 bytes, past OpenMPI's eager limit, so a send
    # completes only once the receiver has posted its receive. The split exchange's updates leave the list's sends
    # in flight (an update that first waited for them would wait for a peer waiting in its own update).
    _, rows_m, w_m, _, _ = train("2bw_P2_mpi", 2, 4, ["--schedule", "pipedream-2bw"], mpi=True)
    _, rows_s, w_s, _, _ = train("2bw_P2_shm", 2, 4, ["--schedule", "pipedream-2bw"])
    check(len(rows_m) == STEPS and [(r["loss"], r["grad_norm"]) for r in rows_m] ==
          [(r["loss"], r["grad_norm"]) for r in rows_s] and w_m == w_s and len(w_m) > 0,
          "P=2 m=4 under mpirun: the no-flush 2BW run ends and equals the shm run bit for bit (losses, norms, weights)")
    # ZeRO 1 keeps blocking updates, which would stall the window under MPI: that run flushes (logged) and ends.
    err_z, rows_z, _, _, flush_z = train("2bw_P2_dp2_zero1_mpi", 2, 4, ["--schedule", "pipedream-2bw", "--zero", "1"],
                                         layout=("dp", 2), mpi=True)
    check(len(rows_z) == STEPS and flush_z is True and "flushes between steps here: the MPI backend" in err_z,
          f"dp 2 x pp 2, --zero 1 under mpirun: the 2BW run flushes between steps (logged) and ends "
          f"({len(rows_z)} rows, flush_between_steps {flush_z})")
    print(f"test_no_flush_train: {checks - fails} passed, {fails} failed")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
