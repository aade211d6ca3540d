"""Asynchronous data parallelism at the CLI: the parameter server (`--async ps --servers S --staleness K`) and
Hogwild (`--async hogwild`).

Legend: W workers, S servers (the last S of W + S ranks), K the staleness bound, Psi parameter count, dp2 the
exact data-parallel run on 2 ranks (itself checked against the single-process run and PyTorch by
test_dp_equality_matrix.py and test_gpt_parity.py).

GPT problem: dp_common.py's tiny GPT (L=2, H=2, C=32, V=64, B=12, T=16, AdamW with warm-up, cosine, weight
decay 0.1 and clipping at 2.5, which clips steps 0, 1, 2 and 4), 20 steps. Checks:
  1. K=0 is synchronous: with W=2 and S=1 or S=2 (a tensor then straddles the two servers' slices), every
     step's loss, grad_norm and lr equal dp2's exactly (==, not within a tolerance) and the --save files hold
     identical float32 weights: the servers sum the two workers' gradients in the ring's order, compute the
     global norm per tensor, clip and step, element for element like the data-parallel step. One exception,
     with S=2: the sum of squares of the tensor cut between the two servers is added up in two parts (in
     double), so the reported grad_norm may differ from dp2's in the last bits (measured 1.3e-16 relative);
     the float32 clip factor made from it is the same, as the identical losses and weights show. With W=3 (the
     servers add in worker order, the ring in its own) the run equals dp3 within dp_common's tolerances.
  2. Bytes: a worker sends each server a header of 8 floats (step, loss sum, ...) and its slice of the
     gradient, so rank 0's comm_bytes per step is 4 Psi + 32 S: every gradient byte is counted once.
  3. The staleness bound, instrumented: rank 1 sleeps 30 ms per step (--straggler 1:30), so worker 0 runs
     ahead as far as it is allowed. The summary's ps section reports max_ahead (how many steps a worker
     began ahead of the slowest worker's last gradient to reach the servers, from the servers' receive times
     and the workers' start times on one clock) and the per-step staleness (step minus the version of the
     parameters used). For K in {0, 1, 2}: max_ahead <= K and max_staleness <= K (never beyond the bound),
     and with the straggler the bound is reached (max_ahead == K, max_staleness == K: a gate that waited
     for more than it must would show less). Rank 0's metrics rows carry the same per-step staleness. The
     counts cover W x steps; K > 0 still trains (final loss within 0.1 of dp2's).
  4. Checkpoints: a K=0 run stopped at step 10 (--stop-at-step, checkpoint written) and resumed as dp2
     gives the uninterrupted dp2 run's losses on steps 10..19 exactly; the same the other way round (a dp2
     checkpoint resumed by the parameter server, S=2).
MLP problem (IDX files written here: 600 8x8 images, 10 classes, each a random class prototype plus noise), SGD momentum 0.9, weight decay 0.01:
  5. --async hogwild with one worker is the serial SGD run: same losses every step and same weights, exactly.
  6. Two workers (threads, no locks): every update lands (summary updates == 2 x steps, rows' updates_total
     reaches it), the loss falls like the serial run's, and validation accuracy is far above chance.
  7. Bad flags exit non-zero before training with a message naming the flag.
"""
from __future__ import annotations

import json
import os
import struct
import sys
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dp_common as dc  # noqa: E402
from parity_harness import parse_args  # noqa: E402

STEPS = 20
RUN_TIMEOUT = 180.0
STRAGGLER_MS = 30
HEADER_BYTES = 32            # param_server.h: gradient message = 8-float header + slice
K0_LOSS_TOL_STALE = 0.1      # K > 0 final loss vs dp2 (it trains, and not far from the synchronous run)
TOL_NORM_SPLIT = 1e-13       # S >= 2: the reported grad_norm of a tensor cut between servers (see check 1)
MLP_STEPS, MLP_B = 60, 32
MLP_N, MLP_SIDE, MLP_CLASSES = 600, 8, 10


def read_rows(path: str, checks: dc.Tally, label: str, steps: int, first: int = 0) -> Optional[List[dict]]:
    """Metrics rows of steps first..steps-1 in order (GPT or MLP rows), or None after a recorded failure."""
    if not checks.check(os.path.isfile(path), f"{label}: metrics file {path} was not written"):
        return None
    rows = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                obj = json.loads(line)
                if "step" in obj:
                    rows[obj["step"]] = obj
    if not checks.check(sorted(rows) == list(range(first, steps)),
                        f"{label}: metrics steps {sorted(rows)[:6]}... ({len(rows)}), expected {first}..{steps - 1}"):
        return None
    return [rows[s] for s in range(first, steps)]


def read_json(path: str, checks: dc.Tally, label: str) -> Optional[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        checks.check(False, f"{label}: summary {path} unreadable: {e}")
        return None


def exact_steps(checks: dc.Tally, label: str, got: Sequence[dict], want: Sequence[dict], norm_rel: float = 0.0) -> None:
    """loss and lr of every step equal (bit for bit, as printed by the JSON writer), grad_norm too unless
    norm_rel > 0 (then within that relative difference)."""
    def differs(k, a, b):
        return abs(a - b) > norm_rel * abs(b) if k == "grad_norm" and norm_rel > 0 else a != b
    bad = [(g["step"], k, g[k], w[k]) for g, w in zip(got, want) for k in ("loss", "grad_norm", "lr")
           if differs(k, g[k], w[k])]
    checks.check(len(got) == len(want) and not bad, f"{label}: {len(bad)} values differ from the reference run "
                 f"(first: step, key, got, want = {bad[0] if bad else None})")


def same_weights(checks: dc.Tally, label: str, a: Optional[Dict[str, np.ndarray]],
                 b: Optional[Dict[str, np.ndarray]]) -> None:
    if a is None or b is None:
        return
    diff = [n for n in b if not np.array_equal(a[n], b[n])]
    checks.check(set(a) == set(b) and not diff, f"{label}: final weights differ from the reference in {diff[:4]}")


def write_idx(workdir: str) -> Dict[str, str]:
    """IDX images (magic 2051) and labels (2049), big-endian headers: a learnable 10-class problem (each
    image is its class's random prototype plus noise)."""
    rng = np.random.RandomState(7)
    protos = rng.randint(0, 256, size=(MLP_CLASSES, MLP_SIDE * MLP_SIDE)).astype(np.float64)
    labels = (np.arange(MLP_N) % MLP_CLASSES).astype(np.uint8)
    noisy = protos[labels] + rng.normal(0, 60, size=(MLP_N, MLP_SIDE * MLP_SIDE))
    imgs = np.clip(np.rint(noisy), 0, 255).astype(np.uint8)
    paths = {"images": os.path.join(workdir, "mlp-images-idx3-ubyte"),
             "labels": os.path.join(workdir, "mlp-labels-idx1-ubyte")}
    with open(paths["images"], "wb") as f:
        f.write(struct.pack(">IIII", 2051, MLP_N, MLP_SIDE, MLP_SIDE) + imgs.tobytes())
    with open(paths["labels"], "wb") as f:
        f.write(struct.pack(">II", 2049, MLP_N) + labels.tobytes())
    return paths


class Runner:
    def __init__(self, args, checks: dc.Tally):
        self.args, self.checks = args, checks
        self.init_path, self.data_path, _ = dc.write_inputs(args.workdir)
        self.idx = write_idx(args.workdir)

    def path(self, tag: str, ext: str) -> str:
        return os.path.join(self.args.workdir, f"{tag}.{ext}")

    def gpt_cmd(self, extra: Sequence) -> List[str]:
        return dc.train_cmd(self.args.meshtrain, self.init_path, self.data_path, STEPS, list(extra))

    def mlp_cmd(self, extra: Sequence) -> List[str]:
        return [self.args.meshtrain, "train", "--model", "mlp", "--data", self.idx["images"], "--labels",
                self.idx["labels"], "--hidden", "32", "--batch-size", MLP_B, "--steps", MLP_STEPS, "--optimizer",
                "sgd", "--lr", "0.05", "--momentum", "0.9", "--weight-decay", "0.01", "--eval-every", MLP_STEPS,
                "--seed", 5, "--threads", 1, "--quiet", *extra]

    def run(self, tag: str, cmd: List, steps: int, first: int = 0, save: bool = True, summary: bool = False):
        """Runs cmd + --metrics (+ --save, --summary); returns (rows, weights or None, summary or None), or
        (None, None, None) after a recorded failure."""
        m, w, sm = self.path(tag, "jsonl"), self.path(tag, "safetensors"), self.path(tag, "summary.json")
        dc.remove_stale(m, w, sm)
        cmd = list(cmd) + ["--metrics", m] + (["--save", w] if save else []) + (["--summary", sm] if summary else [])
        r = dc.run_group(cmd, RUN_TIMEOUT, self.path(tag, "log"))
        if not self.checks.check(r.ok, dc.failure_text(r, tag)):
            return None, None, None
        rows = read_rows(m, self.checks, tag, steps, first)
        weights = None
        if save and self.checks.check(os.path.isfile(w), f"{tag}: --save file not written"):
            import gpt_reference as ref
            weights, _ = ref.read_safetensors(w)
        return rows, weights, read_json(sm, self.checks, tag) if summary else None


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    checks = dc.Tally("test_async")
    rn = Runner(args, checks)
    t0 = time.monotonic()
    psi = dc.PSI

    # ---- 1, 2. K = 0 equals exact data parallelism
    dp2, dp2_w, _ = rn.run("dp2", rn.gpt_cmd(["--nproc", 2]), STEPS)
    dp3, _, _ = rn.run("dp3", rn.gpt_cmd(["--nproc", 3]), STEPS, save=False)
    per_step = {}
    for S in (1, 2):
        tag = f"ps_w2_s{S}_k0"
        rows, w, summ = rn.run(tag, rn.gpt_cmd(["--nproc", 2 + S, "--async", "ps", "--servers", S, "--staleness", 0]),
                               STEPS, summary=True)
        if rows is None or dp2 is None:
            continue
        exact_steps(checks, f"{tag} vs dp2", rows, dp2, norm_rel=0.0 if S == 1 else TOL_NORM_SPLIT)
        same_weights(checks, f"{tag} vs dp2", w, dp2_w)
        cb = {r["comm_bytes"] for r in rows}
        checks.check(cb == {4 * psi + HEADER_BYTES * S}, f"{tag}: rank 0 comm_bytes per step {sorted(cb)}, expected "
                     f"4 Psi + {HEADER_BYTES} S = {4 * psi + HEADER_BYTES * S}")
        per_step[S] = cb
        if summ is not None:
            ps = summ.get("ps", {})
            checks.check(ps.get("workers") == 2 and ps.get("servers") == S and ps.get("staleness_bound") == 0
                         and ps.get("max_staleness") == 0 and ps.get("staleness_counts") == [2 * STEPS],
                         f"{tag}: summary ps section {ps} (expected 2 workers, {S} servers, bound 0, every one of "
                         f"the {2 * STEPS} worker steps at staleness 0)")
    rows, _, _ = rn.run("ps_w3_s1_k0", rn.gpt_cmd(["--nproc", 4, "--async", "ps", "--staleness", 0]), STEPS,
                        save=False)
    if rows is not None and dp3 is not None:
        dc.compare_steps(rows, dp3, checks, "ps_w3_s1_k0 vs dp3")

    # ---- 3. the staleness bound, with a straggler
    for K in (0, 1, 2):
        tag = f"ps_k{K}_straggler"
        rows, _, summ = rn.run(tag, rn.gpt_cmd(["--nproc", 3, "--async", "ps", "--staleness", K, "--straggler",
                                                f"1:{STRAGGLER_MS}"]), STEPS, save=False, summary=True)
        if rows is None or summ is None:
            continue
        ps = summ.get("ps", {})
        print(f"  K={K}: {json.dumps(ps)}")
        counts = ps.get("staleness_counts", [])
        checks.check(ps.get("max_ahead") == K, f"{tag}: max_ahead {ps.get('max_ahead')}, expected exactly K = {K} "
                     f"(never more; with a {STRAGGLER_MS} ms straggler the fast worker reaches the bound)")
        checks.check(ps.get("max_staleness") == K and len(counts) == K + 1 and sum(counts) == 2 * STEPS,
                     f"{tag}: max_staleness {ps.get('max_staleness')} / counts {counts}: expected K = {K} reached, "
                     f"K + 1 entries covering 2 x {STEPS} worker steps")
        row_st = [r.get("staleness") for r in rows]
        checks.check(all(isinstance(s, int) and 0 <= s <= K for s in row_st) and (K == 0 or max(row_st) == K),
                     f"{tag}: rank 0's per-step staleness {row_st} must stay within 0..{K} and reach {K}")
        if dp2 is not None:
            dl = abs(rows[-1]["loss"] - dp2[-1]["loss"])
            checks.check(dl <= K0_LOSS_TOL_STALE, f"{tag}: final loss {rows[-1]['loss']:.4f} vs dp2's "
                         f"{dp2[-1]['loss']:.4f} (|diff| {dl:.4f} > {K0_LOSS_TOL_STALE})")
            if K == 0:
                exact_steps(checks, f"{tag} vs dp2 (a straggler changes timing, not the math)", rows, dp2)

    # ---- 4. checkpoints across the two modes
    for first_mode, second_mode, tag in (
            (["--nproc", 3, "--async", "ps"], ["--nproc", 2], "ps_then_dp2"),
            (["--nproc", 2], ["--nproc", 4, "--async", "ps", "--servers", 2], "dp2_then_ps")):
        ck = rn.path(tag + "_ck", "d")
        dc.remove_stale(ck)
        a, _, _ = rn.run(tag + "_a", rn.gpt_cmd(first_mode + ["--checkpoint-dir", ck, "--save-every", 5,
                                                              "--stop-at-step", 10]), 10, save=False)
        b, _, _ = rn.run(tag + "_b", rn.gpt_cmd(second_mode + ["--resume", ck]), STEPS, first=10)
        if a is not None and dp2 is not None:
            exact_steps(checks, f"{tag}: steps 0..9 before the stop", a, dp2[:10])
        if b is not None and dp2 is not None:
            exact_steps(checks, f"{tag}: steps 10..19 after the resume", b, dp2[10:],
                        norm_rel=TOL_NORM_SPLIT if "--servers" in second_mode else 0.0)

    # ---- 5, 6. Hogwild on the MLP
    serial, serial_w, _ = rn.run("mlp_serial", rn.mlp_cmd(["--nproc", 1]), MLP_STEPS)
    hw1, hw1_w, _ = rn.run("mlp_hogwild1", rn.mlp_cmd(["--nproc", 1, "--async", "hogwild"]), MLP_STEPS)
    if serial is not None and hw1 is not None:
        exact_steps(checks, "hogwild W=1 vs serial SGD", hw1, serial)
        same_weights(checks, "hogwild W=1 vs serial SGD", hw1_w, serial_w)
        checks.check(hw1[-1].get("val_accuracy") == serial[-1].get("val_accuracy"),
                     f"hogwild W=1: val accuracy {hw1[-1].get('val_accuracy')} vs serial {serial[-1].get('val_accuracy')}")
    hw2, _, summ = rn.run("mlp_hogwild2", rn.mlp_cmd(["--nproc", 2, "--async", "hogwild"]), MLP_STEPS, summary=True)
    if hw2 is not None and summ is not None and serial is not None:
        checks.check(summ.get("updates") == 2 * MLP_STEPS and summ.get("workers") == 2
                     and hw2[-1].get("updates_total", 0) <= 2 * MLP_STEPS
                     and all(r.get("updates_total", 0) >= r["step"] + 1 for r in hw2),
                     f"hogwild W=2: summary updates {summ.get('updates')} (expected {2 * MLP_STEPS}), workers "
                     f"{summ.get('workers')}, rows' updates_total {[r.get('updates_total') for r in hw2][-3:]}")
        head = np.mean([r["loss"] for r in hw2[:10]])
        tail = np.mean([r["loss"] for r in hw2[-10:]])
        s_head = np.mean([r["loss"] for r in serial[:10]])
        s_tail = np.mean([r["loss"] for r in serial[-10:]])
        print(f"  MLP loss first/last 10 steps: serial {s_head:.3f} -> {s_tail:.3f}, hogwild W=2 {head:.3f} -> "
              f"{tail:.3f}; val accuracy serial {serial[-1].get('val_accuracy')}, W=2 {hw2[-1].get('val_accuracy')}")
        checks.check(s_head - s_tail > 0.5, f"test setup: the serial MLP does not train ({s_head:.3f} -> {s_tail:.3f})")
        # Measured from the common start (same init, so the serial run's first steps): W=2's own first rows are
        # taken after however many updates the other worker made meanwhile, which depends on scheduling.
        checks.check(s_head - tail >= 0.5 * (s_head - s_tail), f"hogwild W=2: loss falls to {tail:.3f} (its first "
                     f"rows {head:.3f}), less than half as far as the serial run's {s_head:.3f} -> {s_tail:.3f}")
        acc = hw2[-1].get("val_accuracy", 0)
        checks.check(acc >= 0.5, f"hogwild W=2: validation accuracy {acc} (chance is 0.1; serial "
                     f"{serial[-1].get('val_accuracy')})")

    # ---- 7. bad flags
    g, mlp = rn.gpt_cmd, rn.mlp_cmd
    bad = [
        (g(["--nproc", 2, "--servers", 1]), ["--servers", "--async ps"]),
        (g(["--nproc", 2, "--staleness", 1]), ["--staleness", "--async ps"]),
        (g(["--nproc", 1, "--async", "ps"]), ["--async ps", "--servers"]),
        (g(["--nproc", 2, "--async", "ps", "--servers", 2]), ["--servers"]),
        (g(["--nproc", 3, "--async", "ps", "--zero", 1]), ["--async", "--zero"]),
        (g(["--nproc", 3, "--async", "ps", "--compress", "qsgd:4"]), ["--async", "--compress"]),
        (g(["--nproc", 3, "--async", "ps", "--local-sgd", 2]), ["--async", "--local-sgd"]),
        (g(["--nproc", 3, "--async", "ps", "--staleness", -1]), ["--staleness"]),
        (g(["--nproc", 2, "--straggler", "one:30"]), ["--straggler"]),
        (g(["--nproc", 2, "--straggler", "5:30"]), ["--straggler", "5"]),
        (g(["--nproc", 2, "--async", "bogus"]), ["--async", "bogus"]),
        (g(["--nproc", 2, "--async", "hogwild"]), ["hogwild", "mlp"]),
        ([x if x != "sgd" else "adamw" for x in mlp(["--nproc", 2, "--async", "hogwild"])], ["hogwild", "sgd"]),
        (mlp(["--nproc", 2, "--async", "hogwild", "--checkpoint-dir", rn.path("hw_ck", "d")]),
         ["hogwild", "--checkpoint-dir"]),
    ]
    for i, (cmd, names) in enumerate(bad):
        dc.check_rejected(cmd, rn.path(f"bad{i}", "jsonl"), rn.path(f"bad{i}", "log"), names, checks, f"#{i}")

    print(f"total time {time.monotonic() - t0:.1f} s")
    checks.finish()


if __name__ == "__main__":
    main()
