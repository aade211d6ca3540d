"""Shared setup of the data-parallel tests (test_dp_equality_matrix.py, test_dp_resume_reshard.py): the
small GPT and its data, the meshtrain command line of a layout, and the comparisons of a run against the
single-process run. Not a test itself (no test_ prefix, so CTest does not pick it up).

Legend: B global batch (windows), T sequence length, dp data-parallel degree (= --nproc here), z ZeRO
stage, M micro-batch size (0 = off), Psi parameter count (the tied wte once).

The problem: L=2, H=2, C=32, V=64, Tmax=32, B=12, T=16; lr 1e-3 -> min-lr 1e-4, warmup 3, cosine,
wd 0.1, clip 2.5. Init and data come from test_gpt_parity.py (its INIT_STD widths and its sparse Markov
token chain), so attention is not uniform and the loss falls (4.37 -> 3.95 over 20 steps in the
reference). With clip 2.5 the reference clips steps 0, 1, 2 and 4 and not 3 or 5.. (norms 2.98, 3.03,
3.12, 2.41, 2.63, then <= 2.1), none within 3% of the threshold, so float32 reduction-order differences
cannot flip a clip decision. The shard (3001 tokens) is shorter than a 20-step run (3841), so the last
windows wrap around its end: a rank that computes its window offsets differently from the global rule
reads other tokens there.
"""
from __future__ import annotations

import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_reference as ref  # noqa: E402
from parity_harness import Checks, Run, read_metrics, rel_diff, single_thread_env  # noqa: E402
from test_gpt_parity import INIT_STD, markov_tokens  # noqa: E402

CFG = ref.GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32)
B, T = 12, 16
HP = ref.HParams(lr=1e-3, min_lr=1e-4, warmup_steps=3, beta1=0.9, beta2=0.95, eps=1e-8,
                 weight_decay=0.1, grad_clip=2.5)
N_TOKENS = 3001
SEED_INIT, SEED_DATA = 1, 2
PSI = sum(int(np.prod(shape)) for _, shape in ref.param_shapes(CFG))  # 28544

# Layout vs single process. Expected differences are float32 reduction order, ~1e-6 or less (measured:
# --micro-batch-size 1 in the single-process binary, another summation order, gives loss 3.5e-8 and
# weights 6e-8 after 20 steps); the tolerances leave room for Adam amplifying rounding over 20 steps while a real bug (a rank reading the
# wrong windows, a gradient scaled by dp or by the micro-batch count, a missing clip, a stale shard) moves
# the loss by >= 1e-2 and weights by ~lr = 1e-3 per step (Adam's step size is ~lr whatever the gradient).
TOL_LOSS0_REL = 1e-5  # step 0 is one forward on identical weights: only summation order differs
TOL_LOSS_ABS = 2e-3
TOL_GN_REL = 1e-3     # float32 sums of squares in another order / over other shards
TOL_LR_REL = 1e-6     # the same float32 schedule in every layout
TOL_W_ABS = 5e-3


@dataclass(frozen=True)
class Layout:
    dp: int
    zero: int = 0
    mb: int = 0            # --micro-batch-size; 0 = not passed (micro-batching off)
    comm: str = "f32"      # --grad-comm-dtype; f32 = not passed

    def flags(self) -> List[str]:
        out = ["--nproc", str(self.dp), "--dp", str(self.dp), "--zero", str(self.zero)]
        if self.mb:
            out += ["--micro-batch-size", str(self.mb)]
        if self.comm != "f32":
            out += ["--grad-comm-dtype", self.comm]
        return out

    @property
    def name(self) -> str:
        return (f"dp={self.dp} zero={self.zero} mb={self.mb or 'off'}"
                + (f" comm={self.comm}" if self.comm != "f32" else ""))

    @property
    def tag(self) -> str:  # for file names
        return f"dp{self.dp}_z{self.zero}_mb{self.mb}_{self.comm}"


class Tally(Checks):
    """Checks whose verdict ends with the line `N passed, M failed` (N, M count checks)."""

    def __init__(self, name: str):
        super().__init__(name)
        self.passed = 0

    def check(self, cond: bool, msg: str) -> bool:
        ok = super().check(cond, msg)
        self.passed += int(ok)
        return ok

    def fatal(self, msg: str) -> None:
        self.failures.append(msg)
        print(f"FAIL: {msg}", flush=True)
        self.finish()

    def finish(self) -> None:
        if self.passed == 0 and not self.failures:  # a test that checked nothing has not passed
            self.failures.append("no checks ran")
        if self.failures:
            print(f"\n{self.name}: FAILED")
            for m in self.failures:
                print(f"  - {m.splitlines()[0]}")
        else:
            print(f"\n{self.name}: PASSED")
        print(f"{self.passed} passed, {len(self.failures)} failed", flush=True)
        sys.exit(1 if self.failures else 0)


def write_inputs(workdir: str) -> Tuple[str, str, Dict[str, np.ndarray]]:
    """Writes init.safetensors and data.bin into workdir; returns their paths and the init tensors."""
    init_path, data_path = os.path.join(workdir, "init.safetensors"), os.path.join(workdir, "data.bin")
    init = ref.random_init(CFG, SEED_INIT, std_by_suffix=INIT_STD)
    ref.write_safetensors(init_path, init, CFG.metadata())
    ref.write_shard(data_path, markov_tokens(N_TOKENS, CFG.vocab_size, SEED_DATA))
    return init_path, data_path, init


def train_cmd(meshtrain: str, init_path: str, data_path: str, steps: int, extra: Sequence,
              hp: ref.HParams = HP) -> List[str]:
    """The single-process command line of the problem above (hyperparameters hp) plus `extra` (layout and
    output flags)."""
    return [meshtrain, "train", "--model", "gpt", "--init", init_path, "--data", data_path,
            "--batch-size", B, "--seq-len", T, "--steps", steps, "--lr", repr(hp.lr),
            "--min-lr", repr(hp.min_lr), "--warmup-steps", hp.warmup_steps, "--beta1", repr(hp.beta1),
            "--beta2", repr(hp.beta2), "--eps", repr(hp.eps), "--weight-decay", repr(hp.weight_decay),
            "--grad-clip", repr(hp.grad_clip), "--seed", 1234, "--threads", 1, "--quiet", *extra]


def run_group(cmd: Sequence, timeout: float, log_prefix: str) -> Run:
    """parity_harness.run for a launcher that forks workers: the command gets its own process group and,
    on timeout, the whole group is killed, so a hung rank does not outlive the test and eat the 2 cores of
    the next run. Never raises; stdout/stderr are kept as <log_prefix>.stdout / .stderr."""
    cmd = [str(c) for c in cmd]
    print(f"$ {shlex.join(cmd)}", flush=True)
    t0 = time.monotonic()
    timed_out = False
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=single_thread_env(),
                             start_new_session=True)
    except OSError as e:
        r = Run(cmd, 127, b"", str(e).encode(), time.monotonic() - t0, False)
    else:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the group this call created: the launcher and its ranks
            except ProcessLookupError:
                pass
            out, err = p.communicate()
        r = Run(cmd, None if timed_out else p.returncode, out, err, time.monotonic() - t0, timed_out)
    with open(log_prefix + ".stdout", "wb") as f:
        f.write(r.stdout)
    with open(log_prefix + ".stderr", "wb") as f:
        f.write(r.stderr)
    print(f"  -> {'timed out' if r.timed_out else f'exit {r.returncode}'} in {r.seconds:.1f}s", flush=True)
    return r


def remove_stale(*paths: str) -> None:
    """Never judge a file left by an earlier run."""
    for p in paths:
        if os.path.isfile(p):
            os.remove(p)
        elif os.path.isdir(p):
            for root, dirs, files in os.walk(p, topdown=False):
                for f in files:
                    os.remove(os.path.join(root, f))
                for d in dirs:
                    os.rmdir(os.path.join(root, d))
            os.rmdir(p)


def check_rejected(cmd: Sequence, metrics: str, log_prefix: str, names: Sequence[str], checks: Checks,
                   label: str) -> None:
    """Runs a command whose flags are bad: it must exit non-zero before training (no metrics file) with a
    message that names every string of `names`."""
    remove_stale(metrics)
    r = run_group(list(cmd) + ["--metrics", metrics], 60, log_prefix)
    text = (r.stderr + r.stdout).decode("utf-8", "replace")
    missing = [n for n in names if n not in text]
    checks.check(not r.timed_out and r.returncode not in (0, None) and not missing and not os.path.exists(metrics),
                 f"bad flags {label}: expected a non-zero exit before training with a message naming {list(names)}; "
                 f"got {'timeout' if r.timed_out else f'exit {r.returncode}'}, missing {missing}, metrics "
                 f"written: {os.path.exists(metrics)}; output: {text.strip()[:200]!r}")


def check_all_rejected(meshtrain: str, init_path: str, data_path: str, workdir: str,
                       bad: Sequence[Tuple[Sequence[str], Sequence[str]]], checks: Checks) -> None:
    """check_rejected for each (flags, names) of bad: a 2-step train_cmd run with those flags (files
    workdir/bad{i}.*), labelled by its flags."""
    for i, (flags, names) in enumerate(bad):
        metrics = os.path.join(workdir, f"bad{i}.jsonl")
        check_rejected(train_cmd(meshtrain, init_path, data_path, 2, flags), metrics,
                       os.path.join(workdir, f"bad{i}"), names, checks, " ".join(flags))


def single_process_run(meshtrain: str, wd: str, init_path: str, data_path: str, steps: int, timeout: float,
                       checks: Checks, what: str) -> Tuple[List[dict], Dict[str, np.ndarray]]:
    """The single-process run every layout is compared with (--nproc 1; wd/single.*): its metrics rows and final
    weights. A failed run, or unusable outputs, is fatal (what names the run)."""
    base_m, base_w = os.path.join(wd, "single.metrics.jsonl"), os.path.join(wd, "single.safetensors")
    remove_stale(base_m, base_w)
    r = run_group(train_cmd(meshtrain, init_path, data_path, steps,
                            ["--nproc", 1, "--metrics", base_m, "--save", base_w]),
                  timeout, log_prefix=os.path.join(wd, "single"))
    if not r.ok:
        checks.fatal(failure_text(r, what))
    base = read_metrics_range(base_m, 0, steps, checks, "single-process")
    base_final = load_saved(base_w, checks, "single-process")
    if base is None or base_final is None:
        checks.fatal("the single-process run's outputs are unusable; nothing to compare with")
    return base, base_final


def failure_text(r: Run, what: str) -> str:
    """The failure of a run that should have succeeded. The first line (the one the verdict lists) is
    short: the flags, how the run ended and the binary's own error line; a layout that the binary does not
    implement yet is named as such ("meshtrain rejected --nproc 2 ...: ... not supported yet")."""
    lines = [ln.strip() for ln in (r.stderr + r.stdout).decode("utf-8", "replace").splitlines() if ln.strip()]
    hit = next((ln for ln in lines if "not supported" in ln), None)
    if hit and not r.timed_out:
        return f"meshtrain rejected {what}: {hit}\n{r.describe()}"
    err = next((ln for ln in lines if "error" in ln.lower() or "not expected" in ln), lines[-1] if lines else "")
    how = f"timed out after {r.seconds:.0f} s" if r.timed_out else f"exited {r.returncode}"
    return f"{what}: meshtrain {how}" + (f": {err}" if err else "") + f"\n{r.describe()}"


def read_metrics_range(path: str, first: int, end: int, checks: Checks, label: str) -> Optional[List[dict]]:
    """The records of steps first..end-1 (parity_harness.read_metrics over a range, messages labelled)."""
    return read_metrics(path, end, checks, first=first, label=label)


def compare_steps(got: Sequence[dict], want: Sequence[dict], checks: Checks, label: str,
                  loss_abs: float = TOL_LOSS_ABS, check_gn_lr: bool = True,
                  against: str = "the single-process run") -> Tuple[float, float]:
    """Step by step against the single-process records, or those `against` names (same steps, in order): one
    check per run, naming how many steps differ and the first of them (every differing step is printed). Step
    0 (if present) has its loss compared at TOL_LOSS0_REL. Returns (worst |loss diff|, worst grad_norm rel diff)."""
    worst_loss = worst_gn = 0.0
    bad_steps = []
    for g, w in zip(got, want):
        s = w["step"]
        dl, gn = abs(g["loss"] - w["loss"]), rel_diff(g["grad_norm"], w["grad_norm"])
        worst_loss, worst_gn = max(worst_loss, dl), max(worst_gn, gn)
        bad = []
        if s == 0 and rel_diff(g["loss"], w["loss"]) > TOL_LOSS0_REL:
            bad.append(f"step-0 loss {g['loss']!r} vs {w['loss']!r}: rel {rel_diff(g['loss'], w['loss']):.2e}"
                       f" > {TOL_LOSS0_REL:g}")
        if dl > loss_abs:
            bad.append(f"loss {g['loss']:.6f} vs {w['loss']:.6f}: abs {dl:.2e} > {loss_abs:g}")
        if check_gn_lr and gn > TOL_GN_REL:
            bad.append(f"grad_norm {g['grad_norm']:.6f} vs {w['grad_norm']:.6f}: rel {gn:.2e} > {TOL_GN_REL:g}")
        if check_gn_lr and rel_diff(g["lr"], w["lr"]) > TOL_LR_REL:
            bad.append(f"lr {g['lr']!r} vs {w['lr']!r}: rel {rel_diff(g['lr'], w['lr']):.2e} > {TOL_LR_REL:g}")
        if bad:
            bad_steps.append((s, "; ".join(bad)))
            print(f"  {label}: step {s}: {bad_steps[-1][1]}")
    checks.check(not bad_steps, f"{label}: {len(bad_steps)} of {len(want)} steps differ from {against} "
                 f"(steps {[s for s, _ in bad_steps][:10]}); first: step {bad_steps[0][0]}: {bad_steps[0][1]}"
                 if bad_steps else "")
    return worst_loss, worst_gn


def load_saved(path: str, checks: Checks, label: str, cfg=CFG) -> Optional[Dict[str, np.ndarray]]:
    """A --save file as {name: float32 array}: must be float32 safetensors with exactly the parameters of
    CFG (HF GPT-2 names, full shapes: one consolidated file whatever the layout), or None after a failure."""
    if not checks.check(os.path.isfile(path), f"{label}: --save file {path} was not written"):
        return None
    try:
        tensors, _ = ref.read_safetensors(path)
        entries, _, _ = ref.read_safetensors_header(path)
    except (ref.FormatError, OSError, ValueError) as e:
        checks.check(False, f"{label}: --save file {path} is not valid safetensors: {e}")
        return None
    tensors = ref.normalize_names(tensors)
    want = dict(ref.param_shapes(cfg))
    problems = [f"{n} missing" for n in want if n not in tensors]
    problems += [f"{n} unexpected" for n in tensors if n not in want]
    problems += [f"{n} is {entries.get(n, entries.get('transformer.' + n, {})).get('dtype')} "
                 f"{list(tensors[n].shape)}, expected F32 {list(s)}"
                 for n, s in want.items() if n in tensors and (tensors[n].dtype != np.float32
                                                                or tuple(tensors[n].shape) != s)]
    if not checks.check(not problems, f"{label}: --save file {path}: " + "; ".join(problems[:5])):
        return None
    return tensors


def weight_diffs(got: Dict[str, np.ndarray], want: Dict[str, np.ndarray], cfg=CFG) -> Tuple[float, str, float]:
    """Returns (worst max-abs diff over all weights except the key slice of each attn.c_attn.bias, the
    tensor where it is, worst max-abs diff over those key slices). Non-finite values count as inf.
    Why the key-bias slice [C, 2C) is apart: its true gradient is exactly zero (softmax ignores a constant
    added to every score of a query), so its float32 gradient is rounding noise that depends on the
    summation order, and Adam turns noise into steps of up to ~lr. Two correct layouts can therefore
    drift apart there by up to sum(lr) (see test_gpt_parity.py); nothing else can observe that slice."""
    C = cfg.n_embd
    worst, where, worst_k = 0.0, "", 0.0
    for name, w in want.items():
        err = np.abs(got[name].astype(np.float64) - w.astype(np.float64))
        err[~np.isfinite(err)] = np.inf
        if name.endswith("attn.c_attn.bias"):
            worst_k = max(worst_k, float(err[C:2 * C].max()))
            err = np.concatenate([err[:C], err[2 * C:]])
        m = float(err.max())
        if m > worst or not where:
            worst, where = m, name
    return worst, where, worst_k


def names_flag_values(text: str, values: Dict[str, int]) -> List[str]:
    """The flags of `values` whose value the message does not state next to the flag's name (e.g.
    `--dp 4`, `--dp=4`, `--dp (4)`, `--dp: 4`); empty when all are named."""
    return [f"{flag} {v}" for flag, v in values.items()
            if not re.search(re.escape(flag) + r"(?![\w-])\W{0,4}" + str(v) + r"(?!\d)", text)]


class LayoutRunner:
    """A problem of another model shape (cfg) for the layout-equality tests: writes its init and shard into
    workdir, then run(tag, extra) trains `steps` steps with the standard flags (hyperparameters hp) plus
    `extra` and returns (records of steps first..end-1, saved weights or None), or (None, None) after
    recording a failure."""

    def __init__(self, args, checks: Checks, cfg, seed_init: int, seed_data: int, steps: int,
                 hp: ref.HParams = HP):
        from test_gpt_parity import INIT_STD, markov_tokens
        self.args, self.checks, self.cfg, self.steps, self.hp = args, checks, cfg, steps, hp
        self.init_path = os.path.join(args.workdir, "init.safetensors")
        self.data_path = os.path.join(args.workdir, "data.bin")
        ref.write_safetensors(self.init_path, ref.random_init(cfg, seed_init, std_by_suffix=INIT_STD), cfg.metadata())
        ref.write_shard(self.data_path, markov_tokens(N_TOKENS, cfg.vocab_size, seed_data))

    def out(self, tag: str, ext: str) -> str:
        return os.path.join(self.args.workdir, f"{tag}.{ext}")

    def run(self, tag: str, extra, first: int = 0, end: Optional[int] = None, save: bool = True):
        end = self.steps if end is None else end
        files = [self.out(tag, "jsonl")] + ([self.out(tag, "safetensors")] if save else [])
        remove_stale(*files)
        cmd = train_cmd(self.args.meshtrain, self.init_path, self.data_path, self.steps,
                        list(extra) + ["--metrics", self.out(tag, "jsonl")]
                        + (["--save", self.out(tag, "safetensors")] if save else []), self.hp)
        r = run_group(cmd, 300, self.out(tag, "log"))
        if not self.checks.check(r.returncode == 0, failure_text(r, tag)):
            return None, None
        recs = read_metrics_range(self.out(tag, "jsonl"), first, end, self.checks, tag)
        return recs, load_saved(self.out(tag, "safetensors"), self.checks, tag, self.cfg) if save else None

    def compare(self, tag: str, got, got_w, want, want_w) -> Tuple[float, float, float]:
        """Every step against `want` (same steps) and the final weights against want_w (TOL_W_ABS, the key
        bias slice apart); returns (worst loss diff, worst grad_norm rel diff, worst weight diff or nan)."""
        wl, wg = compare_steps(got, want, self.checks, tag)
        dw = float("nan")
        if got_w is not None and want_w is not None:
            dw, where, _ = weight_diffs(got_w, want_w, self.cfg)
            self.checks.check(dw <= TOL_W_ABS, f"{tag}: final weights differ by {dw:.2e} in {where}")
        return wl, wg, dw
