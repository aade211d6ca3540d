"""--offload optimizer (docs/offload.md), end to end on a small GPT (L=2, C=32, V=64, B=8, T=16):
  1. The math does not change: each layout (nproc 1; dp 2 with ZeRO 0, 1, 2, 3; tp 2; pp 2; bf16 products;
     Local SGD averaging the optimizer state; SGD under ZeRO 2; an MoE model with experts over ep 2 and ZeRO 1;
     --delayed-update at nproc 1 and at dp 2 with ZeRO 1) trained with its optimizer state streamed from
     --offload-dir in 4 KiB tiles (many tiles per buffer, so segments are cut at tile boundaries) gives the
     same losses, gradient norms and final weights, bit for bit (the --save files byte-equal), as the same
     layout in memory.
  2. Checkpoints: an offloaded run saved at step 3 of 6 resumes in memory, and an in-memory one resumes
     offloaded, each ending with the uninterrupted in-memory run's final weights, byte-equal.
  3. Nothing is left in --offload-dir after any run, and --summary reports the state offloaded and the bytes
     read and written per step; --trace has reads and writes on an "io" track.
  4. The budget: for a wider model (C=512: 49 MiB of parameters and gradients, 49 MiB of AdamW state) a limit
     halfway between the offloaded plan and the in-memory plan (each read from the refusal a 1K limit gives)
     refuses the in-memory run at start, naming what it needs, and lets the offloaded run train with its
     measured peak RSS under the limit (--summary: within_memory_limit).
  5. A killed run (SIGTERM to a 2-rank job, SIGKILL to a single process) leaves nothing in --offload-dir: its
     space on a tmpfs (seen taken while the run trains) is given back.
  6. Bad input: a missing directory, a file, a read-only mount, a full one (a 1 MiB tmpfs), --offload without
     --offload-dir, --offload grads with --delayed-update, a --memory-limit below the plan: each exits non-zero naming the problem,
     and leaves the directory empty.
"""
from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_checks import FAILS, check, write_shard  # noqa: E402,F401





class Env:
    def __init__(self, meshtrain: str, workdir: str):
        self.bin, self.wd = meshtrain, workdir
        self.data = os.path.join(workdir, "data.bin")
        write_shard(self.data, 20000, 64)
        self.odir = os.path.join(workdir, "offload")
        os.makedirs(self.odir, exist_ok=True)

    def cmd(self, extra, steps=6):
        base = {"--data": self.data, "--n-layer": 2, "--n-head": 2, "--n-embd": 32, "--vocab-size": 64,
                "--seq-len": 16, "--batch-size": 8, "--steps": steps, "--lr": 3e-3, "--warmup-steps": 2,
                "--weight-decay": 0.1, "--grad-clip": 0.5, "--seed": 5, "--comm-timeout": 120}
        extra = [str(x) for x in extra]
        for k in [k for k in base if k in extra]:  # a value given in extra replaces the base one
            del base[k]
        return [self.bin, "train", "--quiet"] + [str(x) for kv in base.items() for x in kv] + extra

    def run(self, extra, steps=6, expect_ok=True):
        r = subprocess.run(self.cmd(extra, steps), capture_output=True, text=True, timeout=600)
        if expect_ok and r.returncode != 0:
            print(r.stdout, r.stderr)
        return r


def rows(path: str):
    with open(path) as f:
        return [{k: j[k] for k in ("step", "loss", "grad_norm", "lr") if k in j} for j in map(json.loads, f)]


def equality(e: Env) -> None:
    layouts = {
        "nproc1": ["--nproc", 1],
        "dp2_zero0": ["--nproc", 2, "--zero", 0],
        "dp2_zero1": ["--nproc", 2, "--zero", 1],
        "dp2_zero2": ["--nproc", 2, "--zero", 2],
        "dp2_zero3": ["--nproc", 2, "--zero", 3],
        "tp2": ["--nproc", 2, "--tp", 2],
        "pp2": ["--nproc", 2, "--pp", 2, "--micro-batch-size", 2],
        "bf16": ["--nproc", 1, "--precision", "bf16"],
        # Local SGD averages the optimizer state too: through the store's whole-buffer path (visit) when offloaded.
        "local_sgd_state": ["--nproc", 2, "--local-sgd", 2, "--local-sgd-state"],
        "sgd_zero2": ["--nproc", 2, "--zero", 2, "--optimizer", "sgd"],
        # Experts split over ep 2 (each rank's experts' state is its own), ZeRO 1 on the dense part.
        "moe_ep2_zero1": ["--nproc", 2, "--moe-every", 1, "--experts", 4, "--ep", 2, "--zero", 1],
        # The delayed parameter update (ZeRO-Offload's DPU, the delay-1 rule) with the state offloaded: the same
        # bits as the delayed run in memory, which tests/parity/test_delay_one.py holds to the serial reference.
        "delayed_nproc1": ["--nproc", 1, "--delayed-update"],
        "delayed_dp2_zero1": ["--nproc", 2, "--zero", 1, "--delayed-update"],
    }
    for name, flags in layouts.items():
        out = {}
        for mode in ("memory", "offload"):
            m = os.path.join(e.wd, f"{name}.{mode}.jsonl")
            w = os.path.join(e.wd, f"{name}.{mode}.safetensors")
            extra = flags + ["--metrics", m, "--save", w]
            if mode == "offload":
                extra += ["--offload", "optimizer", "--offload-dir", e.odir, "--offload-tile", "4096"]
            r = e.run(extra)
            check(r.returncode == 0, f"{name} {mode}: exit 0")
            out[mode] = (m, w)
            check(os.listdir(e.odir) == [], f"{name} {mode}: nothing left in --offload-dir")
        if all(os.path.exists(p) for p in out["memory"] + out["offload"]):
            a, b = rows(out["memory"][0]), rows(out["offload"][0])
            check(len(a) == 6 and a == b, f"{name}: losses, grad norms and lr equal bit for bit ({len(a)} steps)")
            check(filecmp.cmp(out["memory"][1], out["offload"][1], shallow=False),
                  f"{name}: final weights byte-equal")


def resume(e: Env) -> None:
    full = os.path.join(e.wd, "resume.full.safetensors")
    check(e.run(["--save", full]).returncode == 0, "uninterrupted in-memory run")
    off = ["--offload", "optimizer", "--offload-dir", e.odir, "--offload-tile", "4096"]
    for first, second, tag in ((off, [], "offloaded -> in memory"), ([], off, "in memory -> offloaded")):
        ck = os.path.join(e.wd, "ck_" + ("a" if first else "b"))
        shutil.rmtree(ck, ignore_errors=True)
        r = e.run(first + ["--checkpoint-dir", ck, "--save-every", 3, "--stop-at-step", 3])
        check(r.returncode == 0, f"{tag}: first half exit 0")
        w = os.path.join(e.wd, f"resume.{'a' if first else 'b'}.safetensors")
        r = e.run(second + ["--resume", ck, "--save", w])
        check(r.returncode == 0, f"{tag}: second half exit 0")
        check(os.path.exists(w) and filecmp.cmp(full, w, shallow=False), f"{tag}: final weights byte-equal to the "
              "uninterrupted run")
        check(os.listdir(e.odir) == [], f"{tag}: nothing left in --offload-dir")


def reports(e: Env) -> None:
    s, t = os.path.join(e.wd, "summary.json"), os.path.join(e.wd, "trace.json")
    r = e.run(["--nproc", 2, "--zero", 1, "--offload", "optimizer", "--offload-dir", e.odir, "--offload-tile", "4096",
               "--summary", s, "--trace", t, "--memory-limit", "4G"])
    check(r.returncode == 0, "summary run exit 0")
    if r.returncode != 0:
        return
    j = json.load(open(s))
    for rank in j["ranks"]:
        off = rank.get("optimizer_offloaded_bytes", 0)
        check(off > 0, f"rank {rank['rank']}: optimizer_offloaded_bytes {off} > 0")
        # A step reads and writes the whole file once (padded to whole tiles); reads also count the read-ahead
        # of the first tiles after the last update.
        check(rank["offload_written_bytes_per_step"] >= off, f"rank {rank['rank']}: written per step "
              f"{rank['offload_written_bytes_per_step']} >= state {off}")
        check(rank["offload_read_bytes_per_step"] >= off, f"rank {rank['rank']}: read per step "
              f"{rank['offload_read_bytes_per_step']} >= state {off}")
        check(rank.get("within_memory_limit") is True, f"rank {rank['rank']}: within the memory limit")
    check(j.get("memory_limit") == 4 * 2**30, "summary memory_limit is 4G")
    ev = json.load(open(t))["traceEvents"]
    io_tid = [x["tid"] for x in ev if x.get("ph") == "M" and x.get("args", {}).get("name") == "io"]
    io = [x for x in ev if x.get("ph") == "X" and io_tid and x["tid"] == io_tid[0]]
    check(any(x["name"].startswith("read") for x in io) and any(x["name"].startswith("write") for x in io),
          f"trace: reads and writes on the io track ({len(io)} events)")


def bad_input(e: Env) -> None:
    def refused(extra, want, what, steps=2):
        r = e.run(extra, steps, expect_ok=False)
        msg = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
        ok = r.returncode != 0 and all(w in r.stderr for w in want)
        check(ok, f"{what}: refused naming {want} (exit {r.returncode}: {msg[:300]})")

    missing = os.path.join(e.wd, "no_such_dir")
    refused(["--offload", "optimizer", "--offload-dir", missing], [missing, "create the directory"], "missing dir")
    plain = os.path.join(e.wd, "plain_file")
    open(plain, "w").close()
    refused(["--offload", "optimizer", "--offload-dir", plain], [plain, "not a directory"], "a file as dir")
    refused(["--offload", "optimizer"], ["--offload-dir"], "--offload without --offload-dir")
    refused(["--offload-dir", e.odir], ["--offload optimizer"], "--offload-dir without --offload")
    refused(["--zero", 1, "--offload", "grads", "--offload-dir", e.odir, "--delayed-update"],
            ["--offload grads with --delayed-update"], "--offload grads with --delayed-update")
    refused(["--offload", "optimizer", "--offload-dir", e.odir, "--offload-tile", "1000"], ["--offload-tile"],
            "tile not a multiple of 4096")
    refused(["--memory-limit", "1M"], ["--memory-limit", "needs", "parameters", "--offload optimizer"],
            "a limit below the plan")
    refused(["--memory-limit", "12Q"], ["--memory-limit", "12Q"], "a malformed limit")
    # Mounts (root): a read-only directory, and a 1 MiB one too small for the state of a wider model.
    for kind, opts, want, extra in (
            ("ro", "ro,size=1M", ["not writable"], []),
            ("full", "size=1M", ["no room", "No space left"], ["--n-embd", "256"])):
        mnt = os.path.join(e.wd, "mnt_" + kind)
        os.makedirs(mnt, exist_ok=True)
        m = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", mnt], capture_output=True, text=True)
        check(m.returncode == 0, f"mount a {kind} tmpfs ({m.stderr.strip()})")
        if m.returncode != 0:
            continue
        try:
            refused(["--offload", "optimizer", "--offload-dir", mnt] + extra, [mnt] + want, f"{kind} tmpfs")
            check(os.listdir(mnt) == [], f"{kind} tmpfs: nothing left")
        finally:
            subprocess.run(["umount", mnt])


def budget(e: Env) -> None:
    import re
    wide = ["--n-embd", 512, "--n-head", 4, "--batch-size", 4]
    off = ["--offload", "optimizer", "--offload-dir", e.odir, "--offload-tile", "64K"]
    totals = {}
    for mode, extra in (("memory", []), ("offload", off)):
        r = e.run(wide + extra + ["--memory-limit", "1K"], steps=3, expect_ok=False)
        m = re.search(r"= ([0-9.]+) MiB", r.stderr)
        check(r.returncode != 0 and m is not None, f"budget: the {mode} plan's total in the refusal ({r.stderr[-200:]})")
        if m:
            totals[mode] = float(m.group(1))
    if len(totals) < 2:
        return
    limit = int((totals["memory"] + totals["offload"]) / 2 * 2**20)
    check(totals["memory"] - totals["offload"] > 20, f"budget: offloading saves {totals['memory'] - totals['offload']:.1f} MiB")
    r = e.run(wide + ["--memory-limit", limit], steps=3, expect_ok=False)
    check(r.returncode != 0 and "needs" in r.stderr and "--offload optimizer" in r.stderr,
          f"budget: in memory refused under --memory-limit {limit} ({r.stderr.strip()[-250:]})")
    s = os.path.join(e.wd, "budget.json")
    r = e.run(wide + off + ["--memory-limit", limit, "--summary", s], steps=3)
    check(r.returncode == 0, f"budget: offloaded run trains under --memory-limit {limit}")
    if r.returncode == 0:
        rank = json.load(open(s))["ranks"][0]
        check(rank.get("within_memory_limit") is True, f"budget: measured peak RSS {rank['peak_rss_bytes'] / 2**20:.1f} "
              f"MiB under the limit {limit / 2**20:.1f} MiB (plans: memory {totals['memory']}, offload {totals['offload']})")


def used_bytes(path: str) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def killed(e: Env) -> None:
    import signal
    import time
    mnt = os.path.join(e.wd, "mnt_kill")
    os.makedirs(mnt, exist_ok=True)
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64M", "tmpfs", mnt], capture_output=True, text=True)
    check(m.returncode == 0, f"mount a tmpfs for the killed runs ({m.stderr.strip()})")
    if m.returncode != 0:
        return
    try:
        for nproc, sig in ((2, signal.SIGTERM), (1, signal.SIGKILL)):
            base = used_bytes(mnt)
            p = subprocess.Popen(e.cmd(["--nproc", nproc, "--offload", "optimizer", "--offload-dir", mnt,
                                        "--n-embd", 128], steps=100000),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + 120
            while used_bytes(mnt) <= base and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            taken = used_bytes(mnt) - base
            check(taken > 0, f"nproc {nproc}: the state's file takes {taken} bytes on the tmpfs while the run trains")
            os.killpg(p.pid, sig) if sig == signal.SIGKILL else p.send_signal(sig)
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                check(False, f"nproc {nproc}: {sig.name} did not stop the run within 120 s")
            deadline = time.monotonic() + 60  # the kernel frees an unnamed file once its last descriptor closes
            while used_bytes(mnt) > base and time.monotonic() < deadline:
                time.sleep(0.05)
            check(os.listdir(mnt) == [] and used_bytes(mnt) <= base,
                  f"nproc {nproc} after {sig.name} (exit {p.returncode}): nothing left ({used_bytes(mnt) - base} bytes)")
    finally:
        subprocess.run(["umount", mnt])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    e = Env(a.meshtrain, a.workdir)
    for part in (equality, resume, reports, budget, killed, bad_input):
        if not a.only or a.only == part.__name__:
            part(e)
    print(f"{len(FAILS)} failed" if FAILS else "all passed")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
