"""Faults across hosts under mpirun: 2 "hosts" made by scripts/hosts.sh (network namespaces on a bridge, OpenMPI over
TCP through an rsh agent), 2 ranks on each, data parallel (--dp 4 --zero 1), checkpoints every 4 steps. While the
job runs (after its metrics show FAULT_AFTER steps, so checkpoints exist), one fault:

  kill   rank 3 (on host 1) gets SIGKILL
  stop   rank 3 gets SIGSTOP (a stalled rank: the others' deadline, --comm-timeout, ends the job)
  cut    host 1's link goes down (ip link set down): no rank dies, every cross-host wait hits its deadline, and
         mpirun cannot reach host 1's daemon (hosts.sh's watchdog ends what is left there); the verdict and the
         headline name the link ("the link between host ...-h0 and host ...-h1 is down or partitioned: ...")
  slow   host 1's link is limited to 20 Mbit/s each way (tc tbf) for the rest of the run
  disk   the checkpoint directory is a 1.5 MiB tmpfs, a checkpoint every step: a write fails with ENOSPC (no
         external fault; the rank that fails and its host are named in the gathered headline, with the
         directory and the cause)

For kill, stop, cut and disk, each checked:
  - the job ends non-zero within its bound after the fault: --comm-timeout + hosts.sh's grace + BOUND_MARGIN_S;
  - its stderr has the flight recorder's verdict (gathered by `meshtrain flight` after mpirun from every rank's
    ring file) naming the rank (kill, stop: rank 3; cut: a rank waiting across the link), its host, and an
    operation ("all_reduce #N on group world" and the like);
  - nothing is left behind: no process in any host's namespace, no new /dev/shm entry, no file in the hosts'
    temporary directories (OpenMPI's session directories), no per-rank ring file (gathered into M.flight.json,
    which holds every rank), no temporary in the checkpoint directory;
  - the newest checkpoint is complete and resumes: a run from it (shm launcher, the same layout, --stop-at-step
    two steps later) gives the rows of the single-process unbroken run for those steps (dp_common's tolerances).
For slow: the job finishes (exit 0) and its rows are those of the unbroken run of the same layout over the same
hosts, bit for bit (the same reductions in the same order; only the timing changed).

Skips (exit 77, which CTest reports as skipped) when namespaces cannot be made here (hosts.sh exits 3). Without
mpirun the test fails.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "parity"))
import dp_common as dpc  # noqa: E402
sys.path.insert(0, HERE)
from hosts_common import HOSTS_SH, hosts, on_two_hosts  # noqa: E402
from parity_harness import parse_args, single_thread_env  # noqa: E402

HOSTS_TMP = os.environ.get("MT_HOSTS_TMP", "/tmp/mt-hosts")
STEPS = 160            # long enough that every fault lands mid-run (a step takes ~10-300 ms here, loaded)
SAVE_EVERY = 4
FAULT_AFTER = 14       # metrics rows before the fault (checkpoints at steps 4, 8, 12 exist by then)
COMM_TIMEOUT_S = 10
GRACE_S = 15           # hosts.sh's MT_HOSTS_GRACE
BOUND_MARGIN_S = 45    # start-up is not in the bound; this covers the ranks' exit, the gather, the loaded machine
START_DEADLINE_S = 180
LAYOUT = ["--dp", 4, "--zero", 1]




def ns_pids(ns: str) -> list:
    out = subprocess.run(["ip", "netns", "pids", ns], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return [int(x) for x in out.stdout.split()]


def rank_pid(prefix: str, rank: int, per_host: int) -> int:
    """The pid of world rank `rank` (OMPI_COMM_WORLD_RANK in its environment), in its host's namespace."""
    for pid in ns_pids(f"{prefix}-h{rank // per_host}"):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            return pid
    return -1


def metrics_rows(path: str) -> int:
    try:
        with open(path) as f:
            return sum(1 for line in f if line.strip().startswith("{") and '"step"' in line)
    except OSError:
        return 0


def checkpoints(ck: str) -> list:
    return sorted(d for d in glob.glob(os.path.join(ck, "step_*")) if os.path.isdir(d))


def main() -> None:
    args = parse_args(__doc__)
    checks = dpc.Tally("test_hosts_faults")
    on_two_hosts("mf", checks, lambda prefix: run_faults(args, checks, prefix))


def run_faults(args, checks: dpc.Tally, prefix: str) -> None:
    init_path, data_path, _ = dpc.write_inputs(args.workdir)
    per_host = 2
    only = [t for t in os.environ.get("MT_MULTIHOST_ONLY", "").split(",") if t]

    def out(tag: str, ext: str) -> str:
        return os.path.join(args.workdir, f"{tag}.{ext}")

    def cmd(tag: str, extra) -> list:
        return dpc.train_cmd(args.meshtrain, init_path, data_path, STEPS, list(extra) + ["--metrics", out(tag, "jsonl")])

    # The single-process unbroken run: what every resumed run must give.
    dpc.remove_stale(out("single", "jsonl"))
    r = dpc.run_group(cmd("single", []), 600, out("single", "log"))
    if not checks.check(r.returncode == 0, dpc.failure_text(r, "single")):
        return
    want = dpc.read_metrics_range(out("single", "jsonl"), 0, STEPS, checks, "single")
    if want is None:
        return
    launcher = ["bash", HOSTS_SH, "--prefix", prefix, "mpirun", per_host]
    env = dict(single_thread_env(), MT_HOSTS_GRACE=str(GRACE_S))

    def mpi_cmd(tag: str, extra) -> list:
        return [str(c) for c in launcher + cmd(tag, LAYOUT + ["--comm-timeout", COMM_TIMEOUT_S] + list(extra))]

    unbroken = None
    for fault in ["slow", "kill", "stop", "cut", "disk"]:
        if only and fault not in only:
            continue
        if fault == "slow" and unbroken is None:  # the same layout over the same hosts without a fault
            dpc.remove_stale(out("mpi_unbroken", "jsonl"))
            r = dpc.run_group(mpi_cmd("mpi_unbroken", []), 600, out("mpi_unbroken", "log"))
            if not checks.check(r.returncode == 0, dpc.failure_text(r, "mpi_unbroken")):
                continue
            unbroken = dpc.read_metrics_range(out("mpi_unbroken", "jsonl"), 0, STEPS, checks, "mpi_unbroken")
        if fault == "disk":
            disk_full(prefix, per_host, args, checks, out, mpi_cmd, env, want, init_path, data_path)
            continue
        run_fault(fault, prefix, per_host, args, checks, out, mpi_cmd, env, want, unbroken, init_path, data_path)
        hosts(prefix, "heal", 1, check=False)
        hosts(prefix, "rate", 1, "off", check=False)


def run_fault(fault, prefix, per_host, args, checks, out, mpi_cmd, env, want, unbroken, init_path, data_path):
    tag = f"fault_{fault}"
    ck = out(tag, "ck")
    shutil.rmtree(ck, ignore_errors=True)
    metrics = out(tag, "jsonl")
    dpc.remove_stale(metrics, metrics + ".flight.json")
    for f in glob.glob(metrics + ".flight.rank*.json"):
        os.remove(f)
    shm_before = set(os.listdir("/dev/shm"))
    c = mpi_cmd(tag, ["--checkpoint-dir", ck, "--save-every", SAVE_EVERY, "--keep-checkpoints", 0])
    print(f"$ {' '.join(c)}", flush=True)
    with open(out(tag, "stdout"), "wb") as so, open(out(tag, "stderr"), "wb") as se:
        p = subprocess.Popen(c, stdout=so, stderr=se, env=env, start_new_session=True)
        try:
            t0 = time.monotonic()
            # Wait for the event: the metrics show FAULT_AFTER steps (bounded; the job may end early on its own).
            while metrics_rows(metrics) < FAULT_AFTER and p.poll() is None and time.monotonic() - t0 < START_DEADLINE_S:
                time.sleep(0.05)
            started = metrics_rows(metrics) >= FAULT_AFTER and p.poll() is None
            if not checks.check(started, f"{tag}: the job reached {FAULT_AFTER} steps and still ran "
                                f"(rows {metrics_rows(metrics)}, exit {p.poll()}) within {START_DEADLINE_S} s"):
                return
            victim = 3
            if fault in ("kill", "stop"):
                pid = rank_pid(prefix, victim, per_host)
                if not checks.check(pid > 0, f"{tag}: found rank {victim}'s process on host 1"):
                    return
                os.kill(pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            elif fault == "cut":
                hosts(prefix, "cut", 1)
            else:
                hosts(prefix, "rate", 1, "20mbit")
            t_fault = time.monotonic()
            bound = COMM_TIMEOUT_S + GRACE_S + BOUND_MARGIN_S
            try:
                rc = p.wait(timeout=bound if fault != "slow" else 600)
            except subprocess.TimeoutExpired:
                rc = None
            took = time.monotonic() - t_fault
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    with open(out(tag, "stderr"), errors="replace") as f:
        err = f.read()
    print(f"{tag}: exit {rc} {took:.1f} s after the fault")
    if fault == "slow":
        checks.check(rc == 0, f"{tag}: the job on a slowed link finished (exit {rc}): {err[-600:]}")
        got = dpc.read_metrics_range(metrics, 0, STEPS, checks, tag) if rc == 0 else None
        if got is not None and unbroken is not None:
            same = [(a["loss"], a["grad_norm"], a["lr"]) for a in got] == \
                   [(a["loss"], a["grad_norm"], a["lr"]) for a in unbroken]
            checks.check(same, f"{tag}: rows equal the unbroken run's on the same hosts, bit for bit")
        check_nothing_left(prefix, tag, checks, shm_before, metrics, ck)
        return
    checks.check(rc is not None and rc != 0, f"{tag}: the job ended non-zero within {bound} s of the fault "
                 f"(exit {rc} after {took:.1f} s)")
    verdict = [line for line in err.splitlines() if "flight recorder:" in line and "this rank's ring" not in line]
    print(f"{tag}: verdict: {verdict[-1] if verdict else None}")
    checks.check(bool(verdict), f"{tag}: the flight recorder's verdict is printed: {err[-1500:]}")
    text = "\n".join(line for line in err.splitlines() if line.startswith("meshtrain:") or line.startswith("  "))
    op = re.search(r"(all_reduce|reduce_scatter|all_gather|broadcast|barrier|send|recv) #\d+ (on|to|from)", text)
    checks.check(op is not None, f"{tag}: an operation is named: {text[-800:]}")
    if fault in ("kill", "stop"):
        named = re.search(rf"rank {victim} \(host {prefix}-h1\b", text)
        checks.check(named is not None, f"{tag}: rank {victim} and its host {prefix}-h1 are named: {text[-800:]}")
    else:  # cut: some rank waited across the link; both hosts named; the verdict names the link itself
        named = re.search(rf"rank \d \(host {prefix}-h1\b", text)
        checks.check(named is not None and f"{prefix}-h0" in text,
                     f"{tag}: a rank on {prefix}-h1 and the host {prefix}-h0 are named: {text[-800:]}")
        link = f"the link between host {prefix}-h0 and host {prefix}-h1 is down or partitioned: "
        checks.check(bool(verdict) and verdict[-1].startswith(f"  flight recorder: {link}"),
                     f"{tag}: the verdict names the cut link ('{link}...'): {verdict[-1] if verdict else None}")
        head = [line for line in err.splitlines() if line.startswith("meshtrain: ")]
        checks.check(bool(head) and head[-1].startswith(f"meshtrain: {link}"),
                     f"{tag}: the gathered headline names the cut link: {head[-1] if head else None}")
    combined = metrics + ".flight.json"
    try:
        with open(combined) as f:
            ranks = json.load(f)["ranks"]
        checks.check([x["rank"] for x in ranks] == [0, 1, 2, 3], f"{tag}: {combined} holds every rank")
    except (OSError, ValueError, KeyError) as e:
        checks.check(False, f"{tag}: {combined} readable: {e}")
    check_nothing_left(prefix, tag, checks, shm_before, metrics, ck)
    # The newest checkpoint is complete and resumes to the unbroken run's rows.
    cks = checkpoints(ck)
    if not checks.check(bool(cks), f"{tag}: checkpoints were written before the fault ({ck})"):
        return
    resume_check(tag, cks, ck, args, checks, out, want, init_path, data_path)


def disk_full(prefix, per_host, args, checks, out, mpi_cmd, env, want, init_path, data_path):
    """The checkpoint directory on a 1.5 MiB tmpfs, a checkpoint every step: a rank's write fails with ENOSPC."""
    tag = "fault_disk"
    mnt = out(tag, "tmpfs")
    os.makedirs(mnt, exist_ok=True)
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1536k", "tmpfs", mnt], capture_output=True, text=True)
    if mount.returncode != 0:  # root is needed for the namespaces too, so this is not expected here
        checks.check(False, f"{tag}: cannot mount a tmpfs: {mount.stderr.strip()}")
        return
    try:
        ck, metrics = os.path.join(mnt, "ck"), out(tag, "jsonl")
        dpc.remove_stale(metrics, metrics + ".flight.json")
        shm_before = set(os.listdir("/dev/shm"))
        c = mpi_cmd(tag, ["--checkpoint-dir", ck, "--save-every", 1, "--keep-checkpoints", 0])
        r = dpc.run_group(c, START_DEADLINE_S + COMM_TIMEOUT_S + GRACE_S + BOUND_MARGIN_S, out(tag, "log"))
        err = r.stderr.decode(errors="replace")
        checks.check(r.returncode is not None and r.returncode != 0,
                     f"{tag}: a full checkpoint disk ends the job non-zero (exit {r.returncode}, {r.seconds:.1f} s)")
        checks.check(ck in err and "No space left on device" in err,
                     f"{tag}: the message names the checkpoint directory and the cause: {err[-800:]}")
        head = [line for line in err.splitlines() if line.startswith("meshtrain: rank")]
        print(f"{tag}: {head[-1] if head else None}")
        checks.check(bool(head) and re.search(rf"rank \d \(host {prefix}-h\d\)", head[-1]) is not None,
                     f"{tag}: the gathered headline names the rank and its host: {head}")
        verdict = [line for line in err.splitlines() if line.startswith("  flight recorder: ")
                   and "this rank's ring" not in line]
        checks.check(bool(verdict) and re.search(r"#\d+ (on|to|from)", verdict[-1]) is not None,
                     f"{tag}: the verdict names an operation: {verdict}")
        check_nothing_left(prefix, tag, checks, shm_before, metrics, ck)
        cks = checkpoints(ck)
        if checks.check(bool(cks), f"{tag}: checkpoints were written before the disk filled"):
            resume_check(tag, cks, ck, args, checks, out, want, init_path, data_path)
    finally:
        subprocess.run(["umount", mnt])


def resume_check(tag, cks, ck, args, checks, out, want, init_path, data_path):
    """The newest checkpoint resumes (shm launcher, the same layout, two steps) to the unbroken run's rows."""
    step = int(re.search(r"step_0*(\d+)", cks[-1]).group(1))
    res_ck, res_m = out(tag, "resume_ck"), out(tag, "resume.jsonl")
    shutil.rmtree(res_ck, ignore_errors=True)
    dpc.remove_stale(res_m)
    rr = dpc.run_group(dpc.train_cmd(args.meshtrain, init_path, data_path, STEPS, LAYOUT + [
        "--nproc", 4, "--resume", ck, "--checkpoint-dir", res_ck, "--stop-at-step", step + 2, "--metrics", res_m]),
        300, out(tag, "resume"))
    if checks.check(rr.returncode == 0, f"{tag}: the newest checkpoint {cks[-1]} resumes: " + dpc.failure_text(rr, tag)):
        got = dpc.read_metrics_range(res_m, step, step + 2, checks, f"{tag} resumed")
        if got is not None:
            dpc.compare_steps(got, want[step:step + 2], checks, f"{tag} resumed from step {step}")
            print(f"{tag}: resumed from {cks[-1]}: steps {step}..{step + 1} equal the unbroken run's")


def check_nothing_left(prefix, tag, checks, shm_before, metrics, ck):
    procs = {h: ns_pids(f"{prefix}-{h}") for h in ("h0", "h1", "net")}
    checks.check(not any(procs.values()), f"{tag}: no process left on the hosts or the launcher: {procs}")
    # /dev/shm: the machine is shared, so only entries that can be this job's count: meshtrain's segments
    # (/dev/shm/meshtrain-<creator pid>-<n>) whose creator is gone, and anything named after this set of hosts.
    # OpenMPI makes none here: hosts.sh loads no shared-memory transport (btl tcp,self) and osc/sm's backing file
    # lives in the session directory, checked below; other users' vader segments come and go meanwhile.
    new_shm = set(os.listdir("/dev/shm")) - shm_before
    def orphan(name: str) -> bool:
        m = re.match(r"meshtrain-(\d+)-", name)
        return m is not None and not os.path.exists(f"/proc/{m.group(1)}")
    ours = [x for x in new_shm if prefix in x or orphan(x)]
    checks.check(not ours, f"{tag}: nothing of this job's left in /dev/shm: {sorted(ours)}")
    tmp_left = []
    for h in ("h0", "h1", "net"):
        d = os.path.join(HOSTS_TMP, f"{prefix}-{h}")
        if os.path.isdir(d):
            tmp_left += [os.path.join(d, x) for x in os.listdir(d)]
    checks.check(not tmp_left, f"{tag}: the hosts' temporary directories are empty: {tmp_left}")
    rank_files = glob.glob(metrics + ".flight.rank*.json")
    checks.check(not rank_files, f"{tag}: no per-rank ring file left (gathered): {rank_files}")
    tmps = [n for _, dirs, files in os.walk(ck) for n in dirs + files if ".tmp" in n]
    checks.check(not tmps, f"{tag}: no temporaries in the checkpoint directory: {tmps}")


if __name__ == "__main__":
    main()
