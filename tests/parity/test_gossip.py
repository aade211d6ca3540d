"""Decentralized training at the CLI (`--sync gossip`, `--sync decentralized-lowprec`, train/gossip_sync.h):
the complete graph reproduces exact data parallelism, every method trains, the bytes each rank sends follow
from the graph, the consensus distance is reported where and as often as asked, and bad combinations are
refused naming both flags.

Legend: dp data-parallel degree (= --nproc), Psi parameter count (28544), comm_bytes rank 0's bytes per step
(metrics rows; the consensus measurement and the final averaging are not counted in them).

The problem is dp_common.py's tiny GPT (L=2, H=2, C=32, V=64, Tmax=32, B=12, T=16, Markov tokens), 20 steps,
AdamW lr 1e-3 -> 1e-4 (warmup 3, cosine), wd 0.1, clip 2.5, unless a check says otherwise. Checks:
  1. dp=2 with SGD (--optimizer sgd --grad-clip 0 --lr 0.3; momentum 0 and 0.9), --gossip-mix params: the ring at 2 ranks is the
     complete graph, W = J/2, and gossip steps each replica on its own share's mean gradient and then averages
     the models: mean_r (p - lr g_r) = p - lr mean_r g_r, exact data parallelism up to float32 rounding
     (momentum: each rank's buffer is linear in its gradients, so the mean of the buffers is exact DP's buffer).
     Tolerances as for --local-sgd 1 in test_comm_efficient.py: every step's loss 1e-5 abs, final weights 1e-5
     abs. --gossip-graph exp at 2 ranks is the same graph: the same check. Every row has consensus_distance
     (--consensus-every 1) and it is exactly 0 (both ranks compute 0.5 a + 0.5 b: the same bits). comm_bytes is
     4 Psi per step (one model to the one neighbour). The drift a real bug would cause (no mixing at all) is
     measured and printed: it must be far above the tolerance.
  1b. --gossip-mix grads (ring) and both (ring, exp) at dp=2, with AdamW (the default flags) and with SGD
     (momentum 0, lr 0.3, no clipping): the gradient mix with W = J/2 hands every rank exact DP's reduced gradient
     (0.5 (2 a) + 0.5 (2 b) = a + b), so from one seed every rank takes exact DP's step whatever the optimizer:
     losses and final weights within 1e-5 of exact DP's (measured 0: the same bits), consensus_distance 0 on
     every row, comm_bytes 4 Psi (grads) or 8 Psi (both: a gradient and a model per step). The gap a missing
     gradient mix would leave under AdamW (--gossip-mix params: each rank's own AdamW state) is measured and
     printed: it must be far above the tolerance (measured 3.1e-2).
  2. dp=4, AdamW: gossip ring, gossip exp and decentralized-lowprec train (last-5 mean loss at least 0.08 below
     an lr=0 control's, as in test_comm_efficient.py); comm_bytes per step: ring 2 x 4 Psi (both neighbours),
     exp 4 Psi (one peer), lowprec 2 (8 ceil(Psi/512) + Psi) (8-bit codes plus two floats per block of 512,
     to both neighbours); --consensus-every 5: rows 4, 9, 14, 19 carry consensus_distance, finite and > 0, the
     others none, and the --summary's "decentralized" section has the last one and the largest. The same for
     --gossip-mix grads (ring: 8 Psi, the gradients only), both (ring: 16 Psi; exp: 8 Psi), and for no
     --gossip-mix at all (the default, both: ring 16 Psi). gossip ring and exp in this list are --gossip-mix params.
  3. bad combinations exit non-zero before training, naming both flags (train_config.cpp kRefused).
  4. the MPI backend (mpirun -np 4, point-to-point over MPI): gossip ring (--gossip-mix params and both) and
     decentralized-lowprec give the shm
     runs of 2. step for step: loss within 1e-6 abs (the mixing arithmetic is the same; only the per-step loss
     sum's reduction order may differ: measured 3.2e-7), the same comm_bytes, consensus distance within 1e-6
     relative. Without mpirun on PATH the test fails (scripts/setup.sh installs it), as test_dp_mpirun.py does.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dp_common as dc  # noqa: E402
from parity_harness import parse_args  # noqa: E402
from test_comm_efficient import (MIN_IMPROVEMENT, SGD_LR, STEPS, TOL_SGD_LOSS, TOL_SGD_W, Runner,  # noqa: E402
                                 losses, override)

PSI = dc.PSI
BLOCK = 512  # gossip.h LowPrecisionGossip::kBlock


def lowprec_payload(n: int) -> int:
    return 8 * math.ceil(n / BLOCK) + n


def bytes_per_step(checks: dc.Tally, tag: str, rows, want: int) -> None:
    got = [r.get("comm_bytes") for r in rows]
    checks.check(all(g == want for g in got), f"{tag}: comm_bytes per step {sorted(set(got))[:4]} != {want}")


def same_as_exact(checks: dc.Tally, tag: str, rows, exact_rows, saved: str, exact_w, payload: int) -> None:
    """A gossip run that must take exact DP's steps: its losses and (saved) final weights within the SGD
    tolerances of the exact run's, consensus distance 0 on every row, and payload bytes per step."""
    dl = float(np.max(np.abs(losses(rows) - losses(exact_rows))))
    print(f"{tag}: worst |loss - exact| {dl:.2e}")
    checks.check(dl <= TOL_SGD_LOSS, f"{tag}: loss differs from exact DP by {dl:.2e} > {TOL_SGD_LOSS:g}")
    wg = dc.load_saved(saved, checks, tag)
    if exact_w is not None and wg is not None:
        dw = max(float(np.max(np.abs(wg[k] - exact_w[k]))) for k in exact_w)
        print(f"{tag}: final weights max |diff| {dw:.2e}")
        checks.check(dw <= TOL_SGD_W, f"{tag}: final weights differ from exact DP by {dw:.2e} > {TOL_SGD_W:g}")
    xi = [r.get("consensus_distance") for r in rows]
    checks.check(all(x == 0 for x in xi), f"{tag}: consensus_distance must be 0 on every row, got "
                 f"{sorted(set(map(str, xi)))[:4]}")
    bytes_per_step(checks, tag, rows, payload)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    checks = dc.Tally("test_gossip")
    t0 = time.monotonic()
    rn = Runner(args, checks)
    dp2, dp4 = ["--nproc", 2, "--dp", 2], ["--nproc", 4, "--dp", 4]

    # ---- 1. the complete graph with SGD is exact data parallelism
    for momentum in (0, 0.9):
        sgd = dp2 + ["--optimizer", "sgd", "--momentum", momentum, "--grad-clip", 0, "--lr", SGD_LR]
        exact = rn.run(f"sgd{momentum}_exact", sgd, save=True)
        if exact is None:
            continue
        we = dc.load_saved(rn.path(f"sgd{momentum}_exact", "safetensors"), checks, "exact SGD")
        for graph in ("ring", "exp"):
            tag = f"--sync gossip --gossip-graph {graph} at dp=2 (SGD, momentum {momentum})"
            name = f"sgd{momentum}_gossip_{graph}"
            rows = rn.run(name, sgd + ["--sync", "gossip", "--gossip-mix", "params", "--gossip-graph", graph,
                                       "--consensus-every", 1], save=True)
            if rows is None:
                continue
            same_as_exact(checks, tag, rows, exact, rn.path(name, "safetensors"), we, 4 * PSI)
        if momentum == 0:
            # What a broken exchange would give: each replica alone (no mixing) -- --local-sgd 1000 never syncs
            # within 20 steps, the same local steps gossip takes before mixing.
            alone = rn.run("sgd0_alone", sgd + ["--local-sgd", 1000])
            if alone is not None:
                drift = float(np.max(np.abs(losses(alone) - losses(exact))))
                print(f"replicas that never mix: worst |loss - exact| {drift:.2e}")
                checks.check(drift > 100 * TOL_SGD_LOSS, f"test setup: unmixed replicas differ from exact DP by "
                             f"only {drift:.2e}: the equality check would not see a missing exchange")

    # ---- 1b. --gossip-mix grads | both at 2 ranks: the gradient mix with W = J/2 gives every rank exact DP's
    # reduced gradient (0.5 (2 a) + 0.5 (2 b) = a + b), so with identical starting replicas each rank takes exact
    # DP's step whatever the optimizer -- AdamW too, where --gossip-mix params (each rank's own AdamW state on
    # its own share) does not: that run is measured and printed as the gap the check would see.
    adam_exact = rn.run("adam_exact", dp2, save=True)
    wa = dc.load_saved(rn.path("adam_exact", "safetensors"), checks, "exact AdamW") if adam_exact else None
    sgd_exact = rn.run("sgd0_exact_b", dp2 + ["--optimizer", "sgd", "--grad-clip", 0, "--lr", SGD_LR], save=True)
    ws = dc.load_saved(rn.path("sgd0_exact_b", "safetensors"), checks, "exact SGD") if sgd_exact else None
    for opt, ref, wref, extra in (("adamw", adam_exact, wa, []),
                                  ("sgd", sgd_exact, ws, ["--optimizer", "sgd", "--grad-clip", 0, "--lr", SGD_LR])):
        for mix, graph in (("grads", "ring"), ("both", "ring"), ("both", "exp")):
            tag = f"--sync gossip --gossip-mix {mix} --gossip-graph {graph} at dp=2 ({opt})"
            name = f"{opt}_mix_{mix}_{graph}"
            rows = rn.run(name, dp2 + extra + ["--sync", "gossip", "--gossip-graph", graph, "--gossip-mix", mix,
                                               "--consensus-every", 1], save=True)
            if rows is None or ref is None:
                continue
            same_as_exact(checks, tag, rows, ref, rn.path(name, "safetensors"), wref,
                          (2 if mix == "both" else 1) * 4 * PSI)
    if adam_exact is not None:
        own = rn.run("adam_mix_params", dp2 + ["--sync", "gossip", "--gossip-mix", "params"])
        if own is not None:
            gap = float(np.max(np.abs(losses(own) - losses(adam_exact))))
            print(f"--gossip-mix params at dp=2 (AdamW, each rank's own state): worst |loss - exact| {gap:.2e}")
            checks.check(gap > 100 * TOL_SGD_LOSS, f"test setup: models-only mixing under AdamW differs from exact "
                         f"DP by only {gap:.2e}: the check above would not see a missing gradient mix")

    # ---- 2. dp=4 with AdamW: each method trains; bytes from the graph; consensus every 5 steps
    control = rn.run("control_lr0", dp2 + ["--lr", 0, "--min-lr", 0])
    base = float(losses(control)[-5:].mean()) if control is not None else None
    cases = [("gossip ring", ["--sync", "gossip", "--gossip-mix", "params"], 2 * 4 * PSI),
             ("gossip exp", ["--sync", "gossip", "--gossip-mix", "params", "--gossip-graph", "exp"], 4 * PSI),
             ("decentralized-lowprec", ["--sync", "decentralized-lowprec"], 2 * lowprec_payload(PSI)),
             ("gossip ring mix grads", ["--sync", "gossip", "--gossip-mix", "grads"], 2 * 4 * PSI),
             ("gossip ring mix both", ["--sync", "gossip", "--gossip-mix", "both"], 2 * 2 * 4 * PSI),
             ("gossip exp mix both", ["--sync", "gossip", "--gossip-graph", "exp", "--gossip-mix", "both"], 2 * 4 * PSI),
             ("gossip ring default mix", ["--sync", "gossip"], 2 * 2 * 4 * PSI)]  # no --gossip-mix: both
    for tag, flags, want in cases:
        name = "dp4_" + tag.replace(" ", "_")
        summ = rn.path(name, "summary.json")
        rows = rn.run(name, dp4 + flags + ["--consensus-every", 5], summary=True)
        if rows is None:
            continue
        if base is not None:
            imp = base - float(losses(rows)[-5:].mean())
            print(f"dp=4 {tag}: loss {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f}, improvement over lr=0 {imp:.3f}")
            checks.check(imp >= MIN_IMPROVEMENT, f"dp=4 {tag}: improves on the lr=0 control by only {imp:.3f}")
        bytes_per_step(checks, f"dp=4 {tag}", rows, want)
        measured = [r["step"] for r in rows if "consensus_distance" in r]
        checks.check(measured == [4, 9, 14, 19], f"dp=4 {tag}: consensus_distance on steps {measured}, want 4 9 14 19")
        xi = [r["consensus_distance"] for r in rows if "consensus_distance" in r]
        checks.check(all(math.isfinite(x) and x > 0 for x in xi), f"dp=4 {tag}: consensus distances {xi}")
        print(f"dp=4 {tag}: consensus distance at steps 4, 9, 14, 19: {', '.join(f'{x:.3e}' for x in xi)}")
        try:
            with open(summ) as f:
                sec = json.load(f).get("decentralized", {})
        except (OSError, json.JSONDecodeError) as e:
            sec = {}
            checks.check(False, f"dp=4 {tag}: --summary unreadable: {e}")
        if xi:
            checks.check(sec.get("consensus_distance_last") == xi[-1] and sec.get("consensus_distance_max") == max(xi)
                         and sec.get("consensus_measurements") == len(xi),
                         f"dp=4 {tag}: summary section {sec} does not match the rows' {xi}")

    # ---- 4. the MPI backend gives the shm runs
    mpirun = shutil.which("mpirun")
    checks.check(mpirun is not None, "mpirun is not on PATH (install openmpi-bin: bash scripts/setup.sh)")
    os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_mpi_yield_when_idle="1")
    for tag, flags in (("gossip ring", ["--sync", "gossip", "--gossip-mix", "params"]),
                       ("gossip ring mix both", ["--sync", "gossip", "--gossip-mix", "both"]),
                       ("decentralized-lowprec", ["--sync", "decentralized-lowprec"])):
        if mpirun is None:
            break
        name = "dp4_" + tag.replace(" ", "_")
        shm = dc.read_metrics_range(rn.path(name, "jsonl"), 0, STEPS, checks, tag) \
            if os.path.exists(rn.path(name, "jsonl")) else None
        m = rn.path("mpi_" + name, "jsonl")
        dc.remove_stale(m)
        cmd = [mpirun, "--oversubscribe", "--bind-to", "none", "-np", "4"] + [str(x) for x in dc.train_cmd(
            args.meshtrain, rn.init_path, rn.data_path, STEPS, flags + ["--consensus-every", 5, "--metrics", m])]
        r = dc.run_group(cmd, 300, rn.path("mpi_" + name, "log"))
        if not checks.check(r.ok, dc.failure_text(r, f"mpirun -np 4 {tag}")) or shm is None:
            continue
        rows = dc.read_metrics_range(m, 0, STEPS, checks, f"mpi {tag}")
        if rows is None:
            continue
        dl = float(np.max(np.abs(losses(rows) - losses(shm))))
        print(f"mpirun -np 4 {tag}: worst |loss - shm| {dl:.2e}")
        checks.check(dl <= 1e-6, f"mpirun -np 4 {tag}: loss differs from the shm run by {dl:.2e} > 1e-6")
        checks.check([r.get("comm_bytes") for r in rows] == [r.get("comm_bytes") for r in shm],
                     f"mpirun -np 4 {tag}: comm_bytes differ from the shm run's")
        xa = [r.get("consensus_distance") for r in rows]
        xb = [r.get("consensus_distance") for r in shm]
        checks.check(all((a is None) == (b is None) and (a is None or abs(a - b) <= 1e-6 * b) for a, b in zip(xa, xb)),
                     f"mpirun -np 4 {tag}: consensus distances {xa} vs shm {xb}")

    # ---- 3. bad combinations
    g = ["--sync", "gossip"]
    bad_flags = [
        (dp2 + g + ["--zero", 1], ["--sync gossip", "--zero 1"]),
        (["--nproc", 4, "--tp", 2] + g, ["--sync gossip", "--tp 2"]),
        (dp2 + g + ["--compress", "topk:0.1"], ["--sync gossip", "--compress"]),
        (dp2 + g + ["--local-sgd", 2], ["--sync gossip", "--local-sgd"]),
        (dp2 + g + ["--optimizer", "lamb"], ["--sync gossip", "--optimizer lamb"]),
        (dp2 + g + ["--optimizer", "adafactor"], ["--sync gossip", "--optimizer adafactor"]),
        (dp2 + ["--sync", "decentralized-lowprec", "--gossip-graph", "exp"],
         ["--sync decentralized-lowprec", "--gossip-graph exp"]),
        (["--nproc", 1] + g, ["--sync gossip", "--nproc"]),
        (dp2 + g + ["--consensus-every", -1], ["--consensus-every"]),
        (dp2 + ["--gossip-mix", "grads"], ["--gossip-mix grads", "--sync exact"]),
        (dp2 + ["--gossip-mix", "params"], ["--gossip-mix params", "--sync exact"]),
        (dp2 + ["--sync", "decentralized-lowprec", "--gossip-mix", "both"], ["--gossip-mix both",
                                                                             "--sync decentralized-lowprec"]),
        (dp2 + g + ["--gossip-mix", "bogus"], ["--gossip-mix", "bogus"]),
        (dp2 + ["--sync", "bogus"], ["--sync", "bogus"]),
    ]
    for i, (extra, names) in enumerate(bad_flags):
        label = " ".join(str(x) for x in extra)
        cmd = override(dc.train_cmd(args.meshtrain, rn.init_path, rn.data_path, STEPS, []), [str(x) for x in extra])
        dc.check_rejected(cmd, rn.path(f"bad{i}", "jsonl"), rn.path(f"bad{i}", "log"), names, checks, f"`{label}`")

    print(f"total time {time.monotonic() - t0:.1f} s")
    checks.finish()


if __name__ == "__main__":
    main()
