"""The data-parallel trainer under `mpirun` (OpenMPI, MPI backend) reproduces the single-process run:
2 ranks at ZeRO 0 and 3 ranks at ZeRO 3, every step's loss and grad_norm, and the consolidated final
weights, with the tolerances of test_dp_equality_matrix.py (dp_common); the parameter server at staleness 0
on 3 ranks (2 workers, 1 server) gives the 2-rank run's losses and norms exactly. Also: an MPI rank that
fails (a missing data file on every rank) makes mpirun exit non-zero with the error on stderr, not a hang.
Skipped checks do not exist here: without mpirun on PATH the test fails (scripts/setup.sh installs it)."""
from __future__ import annotations

import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dp_common as dpc  # noqa: E402
from parity_harness import parse_args, read_metrics  # noqa: E402

STEPS = 12


def main() -> None:
    args = parse_args(__doc__)
    checks = dpc.Tally("test_dp_mpirun")
    mpirun = shutil.which("mpirun")
    if not mpirun:
        checks.fatal("mpirun is not on PATH (install openmpi-bin: bash scripts/setup.sh)")
    init_path, data_path, _ = dpc.write_inputs(args.workdir)
    env_note = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
    os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_mpi_yield_when_idle="1")

    def out(tag: str, what: str) -> str:
        return os.path.join(args.workdir, f"{tag}.{what}")

    base = dpc.train_cmd(args.meshtrain, init_path, data_path, STEPS,
                         ["--metrics", out("single", "jsonl"), "--save", out("single", "safetensors")])
    dpc.remove_stale(out("single", "jsonl"), out("single", "safetensors"))
    r = dpc.run_group(base, 300, out("single", "log"))
    if not checks.check(r.returncode == 0, dpc.failure_text(r, "single-process run")):
        checks.finish()
    want = read_metrics(out("single", "jsonl"), STEPS, checks)
    want_w = dpc.load_saved(out("single", "safetensors"), checks, "single")

    # The parameter server at staleness 0 (2 workers + 1 server) is exact data parallelism: it must also
    # give mpi2_z0's losses bit for bit (the message protocol over MPI point-to-point).
    runs = {}
    for np_, flags, tag in ((2, ["--zero", 0], "mpi2_z0"), (3, ["--zero", 3], "mpi3_z3"),
                            (3, ["--async", "ps", "--staleness", 0], "mpi3_ps_k0")):
        dpc.remove_stale(out(tag, "jsonl"), out(tag, "safetensors"))
        cmd = [mpirun, "--oversubscribe", "--bind-to", "none", "-np", np_] + dpc.train_cmd(
            args.meshtrain, init_path, data_path, STEPS,
            flags + ["--metrics", out(tag, "jsonl"), "--save", out(tag, "safetensors")])
        r = dpc.run_group(cmd, 300, out(tag, "log"))
        if not checks.check(r.returncode == 0, dpc.failure_text(r, f"{tag} ({env_note})")):
            continue
        got = runs[tag] = read_metrics(out(tag, "jsonl"), STEPS, checks)
        if got and want:
            wl, wg = dpc.compare_steps(got, want, checks, tag)
            print(f"{tag}: worst loss diff {wl:.2e}, worst grad_norm rel diff {wg:.2e}")
        got_w = dpc.load_saved(out(tag, "safetensors"), checks, tag)
        if got_w and want_w:
            worst, where, worst_k = dpc.weight_diffs(got_w, want_w)
            checks.check(worst <= dpc.TOL_W_ABS, f"{tag}: final weights differ by {worst:.2e} in {where}")
            print(f"{tag}: worst weight diff {worst:.2e} ({where})")

    a, b = runs.get("mpi3_ps_k0"), runs.get("mpi2_z0")
    if a and b:
        diff = [x["step"] for x, y in zip(a, b) if (x["loss"], x["grad_norm"]) != (y["loss"], y["grad_norm"])]
        checks.check(not diff, f"mpi3_ps_k0: loss/grad_norm differ from mpi2_z0's on steps {diff} (expected equal)")

    bad = [mpirun, "--oversubscribe", "--bind-to", "none", "-np", 2, args.meshtrain, "train", "--data",
           os.path.join(args.workdir, "no_such_file.bin"), "--steps", 2, "--quiet"]
    r = dpc.run_group(bad, 120, out("missing", "log"))
    checks.check(not r.timed_out and r.returncode not in (0, None),
                 f"mpirun with a missing data file: exit {r.returncode}, timed out {r.timed_out}")
    err = r.stderr.decode(errors="replace")
    checks.check("no_such_file.bin" in err, f"mpirun with a missing data file: stderr does not name it:\n{err[-800:]}")
    checks.finish()


if __name__ == "__main__":
    main()
