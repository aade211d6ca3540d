"""Communication-efficient data parallelism at the CLI: `--compress`, `--compress-adaptive` and `--local-sgd`
train, reproduce exact data parallelism where the math says they must, and send the bytes their formulas say.

Legend: dp data-parallel degree (= --nproc), Psi parameter count (tied wte once), G the bytes rank 0 sends for
one exact all-reduce of the Psi float32 gradients, K --local-sgd-warmup, H --local-sgd, R ratio/rank/bits of
a --compress spec. comm_bytes is read from rank 0's metrics rows (the lead writes them).

The problem is dp_common.py's tiny GPT (L=2, H=2, C=32, V=64, Tmax=32, B=12, T=16, Markov tokens), 20 steps,
AdamW lr 1e-3 -> 1e-4 (warmup 3, cosine), wd 0.1, clip 2.5, unless a check says otherwise. One run takes
~0.1 s, so the whole test takes seconds. Checks:
  1. every method trains at dp=2 (topk:0.01, randk:0.1, qsgd:4, nuqsgd:2, powersgd:2, powersgd:16, sign,
     topk:0.01 + --compress-adaptive, --local-sgd 4 --local-sgd-warmup 3): every loss finite, step 0's loss
     equal to the exact run's (rel 1e-6: the same forward on the same weights, before any exchange), and
     the mean loss of the last 5 steps at least 0.08 below that of a control run with --lr 0 (the same
     windows, so batch-to-batch noise cancels). Measured improvements: exact 0.34, the weakest method here
     (nuqsgd:2) 0.15; a method whose exchanged gradient is useless gets ~0 or worse.
  2. --local-sgd 1 with plain SGD (--optimizer sgd --momentum 0 --grad-clip 0, lr 0.3) equals exact data
     parallelism: p - lr (mean_r g_r + wd p) = mean_r (p - lr (g_r + wd p)) because the update is linear in
     the gradient; only float32 rounding differs (the parameters are averaged, ~1 ulp per step, instead of
     the gradients). Measured: loss 3e-7, final weights 8e-7 (|w| <= 1.24, i.e. ~7 ulp). Tolerances: every
     step's loss 1e-5 abs, final weights 1e-5 abs (10-30x the measured drift); not averaging (--local-sgd 4)
     moves them by 9e-2 and 2e-2. Clipping is off because Local SGD clips each rank's own gradient norm.
  3. --local-sgd 4 --local-sgd-warmup 3 (AdamW): the losses of steps 0..K (step K's loss is computed on the
     weights after K exact steps) equal the exact run's at rel 1e-6 (the warm-up all-reduce sums the same two
     float32 shares as the bucketed one: expected bit-identical), and some later step differs (the flag did
     something); `synced` is true on steps < K and on steps s >= K with (s + 1 - K) % H == 0; comm_bytes is G
     on exactly those steps and 0 elsewhere, so after the warm-up rank 0 sends floor((20 - K) / H) G = 4 G
     against exact DP's 17 G (4.25x fewer; H x when H divides the local steps). With --local-sgd-state each
     sync also averages AdamW's m and v: 3 G.
  4. exact DP per step: rank 0 sends 2 (S - S_0) bytes, S = 4 Psi, S_0 = rank 0's block of the balanced
     partition (src/comm/communicator.h: the bandwidth-optimal all-reduce, 2 (n-1)/n S when n divides S);
     the 8 MiB default bucket holds the whole model, so one all-reduce. The per-step loss all-reduce (one
     float) costs rank 0 nothing under that convention (it owns the one element). Checked at dp=2 and dp=3
     (uneven partition: 28544 = 9515 + 9515 + 9514). Psi comes from the GPT-2 shapes below, written out here
     independently of gpt_reference, and must match the --summary's "params" and the --save file's tensors.
  5. compressed DP per step: the per-tensor payloads of src/parallel/compress/codec.h (topk/randk 8 k with
     k = max(1, ceil(R n)); qsgd/nuqsgd 4 ceil(n/512) + ceil(n B/8); sign 4 + ceil(n/8)) concatenated into
     one u8 all_gather: rank 0 sends (n-1)/n of the gathered bytes, i.e. (dp - 1) x its payload. PowerSGD
     all-reduces P (rows x R per matrix, plus every tensor sent exactly: vectors, and matrices where
     R (rows + cols) >= rows cols, e.g. the 32x32 ones at R=16) and then Q (cols x R per matrix).
  6. --compress-adaptive (topk:0.01, every 4): each row has compress_levels (one 0/1 per layer: embeddings,
     blocks, ln_f) and compress_light (their mean); all light for the first 2K = 8 steps; levels change only
     at multiples of K; comm_bytes follows the levels (light = topk:0.04 on that layer's tensors).
  7. bad flag combinations exit non-zero before training (no metrics file) with a message naming the flag
     (the combinations still refused: train_config.cpp kRefused).
  8. with --tp and --pp: see split_section.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dp_common as dc  # noqa: E402
import gpt_reference as ref  # noqa: E402
from parity_harness import parse_args, rel_diff  # noqa: E402

STEPS = 20
RUN_TIMEOUT = 120.0
QUANT_BUCKET = 512            # codec.h kQuantBucket
TOL_STEP0_REL = 1e-6          # step-0 loss of any method vs exact (same forward)
MIN_IMPROVEMENT = 0.08        # last-5 mean loss below the lr=0 control's, for "trains"
TOL_SGD_LOSS, TOL_SGD_W = 1e-5, 1e-5
TOL_WARMUP_REL = 1e-6
SGD_LR = 0.3
LOCAL_H, LOCAL_K = 4, 3
ADAPT_EVERY = 4
TRAIN_METHODS = ["topk:0.01", "randk:0.1", "qsgd:4", "nuqsgd:2", "powersgd:2", "powersgd:16", "sign"]


# ---------------------------------------------------------------- model shapes and byte formulas

def gpt2_tensors(L: int, C: int, V: int, Tmax: int) -> List[Tuple[str, Tuple[int, ...], int]]:
    """(name, shape, layer group) of every GPT-2 parameter as meshtrain registers it (HF orientation:
    Conv1D weights are [in, out]); groups: 0 embeddings, 1..L blocks, L+1 ln_f. The lm head is the tied wte."""
    out = [("wte.weight", (V, C), 0), ("wpe.weight", (Tmax, C), 0)]
    for l in range(L):
        h, g = f"h.{l}.", l + 1
        out += [(h + "ln_1.weight", (C,), g), (h + "ln_1.bias", (C,), g),
                (h + "attn.c_attn.weight", (C, 3 * C), g), (h + "attn.c_attn.bias", (3 * C,), g),
                (h + "attn.c_proj.weight", (C, C), g), (h + "attn.c_proj.bias", (C,), g),
                (h + "ln_2.weight", (C,), g), (h + "ln_2.bias", (C,), g),
                (h + "mlp.c_fc.weight", (C, 4 * C), g), (h + "mlp.c_fc.bias", (4 * C,), g),
                (h + "mlp.c_proj.weight", (4 * C, C), g), (h + "mlp.c_proj.bias", (C,), g)]
    out += [("ln_f.weight", (C,), L + 1), ("ln_f.bias", (C,), L + 1)]
    return out


TENSORS = gpt2_tensors(dc.CFG.n_layer, dc.CFG.n_embd, dc.CFG.vocab_size, dc.CFG.n_positions)
PSI = sum(math.prod(s) for _, s, _ in TENSORS)
N_GROUPS = dc.CFG.n_layer + 2


def shard(count: int, n: int, r: int = 0) -> int:
    """Elements of rank r's block in the balanced partition (the first count % n ranks own one more)."""
    base, extra = divmod(count, n)
    return base + (1 if r < extra else 0)


def all_reduce_sent(count: int, elem: int, n: int, r: int = 0) -> int:
    """Counter convention of src/comm: all_reduce sends 2 (S - S_r) bytes (reduce-scatter + all-gather)."""
    return 2 * elem * (count - shard(count, n, r))


def all_gather_sent(per_rank_bytes: int, n: int, r: int = 0) -> int:
    """all_gather of n equal u8 payloads: S = n x payload, sent S - S_r = (n - 1) x payload."""
    total = per_rank_bytes * n
    return total - shard(total, n, r)


def parse_spec(text: str) -> Tuple[str, float]:
    name, _, value = text.partition(":")
    return name, (float(value) if value else 0.0)


def light(spec: Tuple[str, float]) -> Tuple[str, float]:
    """Accordion's light setting (spec.h): 4x entries, +4 bits (<= 8), 4x rank, sign -> exact."""
    m, v = spec
    return {"topk": (m, min(1.0, 4 * v)), "randk": (m, min(1.0, 4 * v)), "qsgd": (m, min(8, v + 4)),
            "nuqsgd": (m, min(8, v + 4)), "powersgd": (m, 4 * v), "sign": ("none", 0.0)}[m]


def payload(spec: Tuple[str, float], n: int) -> int:
    """codec.h payload bytes of one tensor of n elements."""
    m, v = spec
    if m == "none":
        return 4 * n
    if m in ("topk", "randk"):
        return 8 * min(n, max(1, math.ceil(v * n - 1e-9)))
    if m in ("qsgd", "nuqsgd"):
        return 4 * math.ceil(n / QUANT_BUCKET) + math.ceil(n * int(v) / 8)
    if m == "sign":
        return 4 + math.ceil(n / 8)
    raise ValueError(m)


def codec_step_bytes(spec: Tuple[str, float], n: int, levels: Optional[Sequence[int]] = None,
                     tensors=TENSORS) -> int:
    """Rank 0's bytes of one compressed exchange (levels: per group 1 = light setting)."""
    per_rank = sum(payload(light(spec) if levels and levels[g] else spec, math.prod(s)) for _, s, g in tensors)
    return all_gather_sent(per_rank, n)


def powersgd_step_bytes(R: int, n: int, tensors=TENSORS) -> int:
    """Rank 0's bytes of one PowerSGD exchange: all_reduce(P + exact tensors), then all_reduce(Q)."""
    nx = nq = 0
    for _, s, _ in tensors:
        if len(s) == 2 and R * (s[0] + s[1]) < s[0] * s[1]:
            nx, nq = nx + s[0] * R, nq + s[1] * R
        else:
            nx += math.prod(s)
    return all_reduce_sent(nx, 4, n) + (all_reduce_sent(nq, 4, n) if nq else 0)


def expected_step_bytes(method: str, n: int, tensors=TENSORS) -> int:
    spec = parse_spec(method)
    if spec[0] == "powersgd":
        return powersgd_step_bytes(int(spec[1]), n, tensors)
    return codec_step_bytes(spec, n, tensors=tensors)


def rank0_tensors(tp: int, pp: int) -> List[Tuple[str, Tuple[int, ...], int]]:
    """(name, shape, group) of world rank 0's part of the replica under --tp tp --pp pp: tp rank 0's shard of
    each split tensor (Megatron: c_attn and c_fc by output columns, q/k/v each split; c_proj by input rows;
    wte by vocabulary rows; LayerNorms, wpe and c_proj biases whole) on the first stage (blocks
    [0, L / pp), wte and wpe; the last stage's ln_f and tied wte are not rank 0's). Written out here from the
    Megatron scheme, independently of src/model/gpt.cpp."""
    C, V, L = dc.CFG.n_embd, dc.CFG.vocab_size, dc.CFG.n_layer
    split = {"wte.weight": (0, V), "attn.c_attn.weight": (1, 3 * C), "attn.c_attn.bias": (0, 3 * C),
             "attn.c_proj.weight": (0, C), "mlp.c_fc.weight": (1, 4 * C), "mlp.c_fc.bias": (0, 4 * C),
             "mlp.c_proj.weight": (0, 4 * C)}
    out = []
    for name, shape, g in TENSORS:
        if name == "ln_f.weight" or name == "ln_f.bias":
            if pp > 1:
                continue
        elif name.startswith("h.") and int(name.split(".")[1]) >= L // pp:
            continue
        key = name if name.startswith("wte") else ".".join(name.split(".")[2:])
        if key in split and tp > 1:
            axis, full = split[key]
            shape = tuple(full // tp if a == axis else d for a, d in enumerate(shape))
        out.append((name, shape, g))
    return out


# ---------------------------------------------------------------- running

class Runner:
    def __init__(self, args, checks: dc.Tally):
        self.args, self.checks = args, checks
        self.init_path, self.data_path, _ = dc.write_inputs(args.workdir)

    def path(self, tag: str, ext: str) -> str:
        return os.path.join(self.args.workdir, f"{tag}.{ext}")

    def run(self, tag: str, extra: Sequence, save: bool = False, summary: bool = False) -> Optional[List[dict]]:
        """Trains STEPS steps with dp_common's flags, those `extra` names replaced by its values (override),
        plus --metrics (and --save / --summary); returns the metrics rows or None (failure recorded)."""
        m, w, sm = self.path(tag, "jsonl"), self.path(tag, "safetensors"), self.path(tag, "summary.json")
        dc.remove_stale(m, w, sm)
        cmd = dc.train_cmd(self.args.meshtrain, self.init_path, self.data_path, STEPS, [])
        cmd = override(cmd, [str(x) for x in extra]) + ["--metrics", m] + (["--save", w] if save else []) \
            + (["--summary", sm] if summary else [])
        r = dc.run_group(cmd, RUN_TIMEOUT, self.path(tag, "log"))
        if not self.checks.check(r.ok, dc.failure_text(r, tag)):
            return None
        return dc.read_metrics_range(m, 0, STEPS, self.checks, tag)


def override(cmd: List, extra: List[str]) -> List[str]:
    """cmd with every option that `extra` sets replaced by extra's value (so --lr 0.3 replaces --lr 1e-3);
    flags without a value (starting with -- and followed by another --flag or nothing) are appended."""
    cmd = [str(c) for c in cmd]
    out = list(cmd)
    i = 0
    while i < len(extra):
        flag = extra[i]
        has_value = i + 1 < len(extra) and not extra[i + 1].startswith("--")
        if has_value and flag in out:
            out[out.index(flag) + 1] = extra[i + 1]
        else:
            out += [flag] + ([extra[i + 1]] if has_value else [])
        i += 2 if has_value else 1
    return out


def losses(rows: Sequence[dict]) -> np.ndarray:
    return np.array([r["loss"] for r in rows], dtype=np.float64)


def check_bytes(checks: dc.Tally, tag: str, rows: Sequence[dict], want: Sequence[int]) -> None:
    """comm_bytes per step equals want[step] and comm_bytes_total is the running sum."""
    got = [r.get("comm_bytes") for r in rows]
    bad = [(r["step"], g, w) for r, g, w in zip(rows, got, want) if g != w]
    checks.check(not bad, f"{tag}: comm_bytes differs from the formula on {len(bad)} steps; first (step, got, "
                 f"expected): {bad[:3]}")
    tot, run = [r.get("comm_bytes_total") for r in rows], list(np.cumsum(want))
    checks.check(tot == [int(x) for x in run], f"{tag}: comm_bytes_total {tot[:4]}... is not the running sum of "
                 f"the expected comm_bytes {run[:4]}...")

# ---------------------------------------------------------------- 8. splits of the replica

SPLIT_LAYOUTS = [("dp2_tp2", 2, 1, ["--nproc", 4, "--dp", 2, "--tp", 2]),
                 ("dp2_pp2", 1, 2, ["--nproc", 4, "--dp", 2, "--pp", 2, "--micro-batch-size", 3]),
                 ("dp2_tp2_pp2", 2, 2, ["--nproc", 8, "--dp", 2, "--tp", 2, "--pp", 2, "--micro-batch-size", 3])]
LOSSLESS = ["topk:1", "powersgd:32"]  # everything kept; rank 32 >= every matrix's smaller side: sent exactly
LOSSY = ["topk:0.01", "qsgd:4", "powersgd:2"]
TOL_LOSSLESS = 1e-5                   # loss and weights against the exact run of the same layout
SGD_MOMENTUM = 0.9
TOL_GAP_SPLIT = 0.03                  # a lossy method's loss gap to exact, split replica vs tp 1 (measured <= 0.006)


def split_section(rn: Runner, checks: dc.Tally, exact_dp2: List[dict], trains) -> None:
    """8. --compress and --local-sgd over the dp group of each (tp, pp) coordinate (rank 0's part of the
    replica is rank0_tensors(tp, pp)):
      a. the lossless limits (topk:1, powersgd:32) equal the exact run of the same layout (losses and final
         weights within 1e-5, the key-bias slice apart as in dp_common.weight_diffs: the exchange sums the
         same two float32 shares; under pp the tied embedding's parts are summed over the tie group after the
         exchange instead of before, a rounding difference, which AdamW turns into steps of up to lr in that
         slice only: measured 5e-5 there, 6e-8 elsewhere), and
         the exact dp=2 run at the layout-equality tolerances of dp_common; bytes follow the formulas of 5.
         with rank 0's shard shapes;
      b. --local-sgd 1 --local-sgd-state with SGD (momentum 0.9, no clipping) equals exact data parallelism of
         the same layout (1e-5, as in 2.); each step sends the parameters and the momentum (2 all-reduces of
         rank 0's part);
      b'. --local-sgd 4 --local-sgd-warmup 3 (AdamW) trains, its steps 0..K equal the layout's exact run (rel
         1e-6), synced as in 3., and sends one all-reduce of rank 0's part on synced steps only;
      c. lossy methods train (as in 1.) and send their formula's bytes; their loss gap to the layout's exact
         run (last-5 mean) is within 0.03 of the same method's gap at tp 1 pp 1 (measured: within 0.006; the
         gaps themselves are 0.007 to 0.19); gaps and bytes ratios are printed beside the tp 1 rows'."""
    dp_w = dc.load_saved(rn.path("exact_dp2", "safetensors"), checks, "exact dp=2")
    figures, tp1_gap = [], {}
    for method in LOSSY:  # the same methods at tp 1, pp 1 (rows of 1.)
        rows = dc.read_metrics_range(rn.path(f"compress_{method.replace(':', '_')}", "jsonl"), 0, STEPS, checks,
                                     method)
        if rows is not None:
            tp1_gap[method] = float(losses(rows)[-5:].mean() - losses(exact_dp2)[-5:].mean())
            figures.append((f"dp2 --compress {method}", tp1_gap[method],
                            rows[-1]["comm_bytes"] / exact_dp2[-1]["comm_bytes"]))
    for name, tp, pp, layout in SPLIT_LAYOUTS:
        mine = rank0_tensors(tp, pp)
        numel = sum(math.prod(sh) for _, sh, _ in mine)
        ex = rn.run(f"{name}_exact", layout, save=True)
        if ex is None:
            continue
        ex_w = dc.load_saved(rn.path(f"{name}_exact", "safetensors"), checks, f"{name} exact")
        methods = LOSSLESS if pp == 1 or tp == 1 else LOSSLESS[:1]
        for method in methods:
            tag = f"{name} --compress {method}"
            rows = rn.run(f"{name}_{method.replace(':', '_')}", layout + ["--compress", method], save=True)
            if rows is None:
                continue
            dl = float(np.max(np.abs(losses(rows) - losses(ex))))
            checks.check(dl <= TOL_LOSSLESS, f"{tag}: loss differs from the exact {name} run by {dl:.2e} > "
                         f"{TOL_LOSSLESS:g} (a lossless exchange)")
            dc.compare_steps(rows, exact_dp2, checks, f"{tag} vs exact dp=2")
            w = dc.load_saved(rn.path(f"{name}_{method.replace(':', '_')}", "safetensors"), checks, tag)
            if w is not None and ex_w is not None and dp_w is not None:
                dw, where, key = dc.weight_diffs(w, ex_w)
                checks.check(dw <= TOL_LOSSLESS, f"{tag}: final weights differ from the exact {name} run by "
                             f"{dw:.2e} > {TOL_LOSSLESS:g} (in {where})")
                worst, where, _ = dc.weight_diffs(w, dp_w)
                checks.check(worst <= dc.TOL_W_ABS, f"{tag}: final weights differ from exact dp=2 by {worst:.2e} "
                             f"> {dc.TOL_W_ABS:g} (in {where})")
                print(f"{tag}: vs exact {name}: loss {dl:.1e}, weights {dw:.1e} (key-bias slice {key:.1e}); vs "
                      f"exact dp=2 weights {worst:.1e}")
            check_bytes(checks, tag, rows, [expected_step_bytes(method, 2, mine)] * STEPS)
        if tp > 1 and pp > 1:
            continue
        sgd = layout + ["--optimizer", "sgd", "--momentum", SGD_MOMENTUM, "--grad-clip", 0, "--lr", SGD_LR]
        a = rn.run(f"{name}_sgd_exact", sgd, save=True)
        b = rn.run(f"{name}_sgd_local1", sgd + ["--local-sgd", 1, "--local-sgd-state"], save=True)
        if a is not None and b is not None:
            tag = f"{name} --local-sgd 1 --local-sgd-state (SGD, momentum {SGD_MOMENTUM})"
            dl = float(np.max(np.abs(losses(a) - losses(b))))
            checks.check(a[-1]["loss"] < a[0]["loss"] - 0.2, f"test setup: {name} SGD does not train "
                         f"({a[0]['loss']:.4f} -> {a[-1]['loss']:.4f})")
            checks.check(dl <= TOL_SGD_LOSS, f"{tag}: loss differs from exact {name} by {dl:.2e} > {TOL_SGD_LOSS:g}")
            wa = dc.load_saved(rn.path(f"{name}_sgd_exact", "safetensors"), checks, f"{name} SGD exact")
            wb = dc.load_saved(rn.path(f"{name}_sgd_local1", "safetensors"), checks, tag)
            if wa is not None and wb is not None:
                dw = max(float(np.max(np.abs(wa[k].astype(np.float64) - wb[k]))) for k in wa)
                print(f"{tag}: worst |loss diff| {dl:.1e}, final weights {dw:.1e}")
                checks.check(dw <= TOL_SGD_W, f"{tag}: final weights differ from exact {name} by {dw:.2e} > "
                             f"{TOL_SGD_W:g}")
            check_bytes(checks, tag, b, [2 * all_reduce_sent(numel, 4, 2)] * STEPS)
        tag = f"{name} --local-sgd {LOCAL_H} --local-sgd-warmup {LOCAL_K}"
        rows = rn.run(f"{name}_local_h_k", layout + ["--local-sgd", LOCAL_H, "--local-sgd-warmup", LOCAL_K])
        if rows is not None:
            trains(tag, rows)
            bad = [s for s in range(LOCAL_K + 1) if rel_diff(rows[s]["loss"], ex[s]["loss"]) > TOL_WARMUP_REL]
            checks.check(not bad, f"{tag}: the losses of steps 0..K={LOCAL_K} must equal the exact {name} run's; "
                         f"steps {bad} differ")
            want_sync = [s < LOCAL_K or (s + 1 - LOCAL_K) % LOCAL_H == 0 for s in range(STEPS)]
            checks.check([r.get("synced") for r in rows] == want_sync, f"{tag}: synced flags differ from {want_sync}")
            check_bytes(checks, tag, rows, [all_reduce_sent(numel, 4, 2) if w else 0 for w in want_sync])
        lossy = LOSSY + (["adaptive"] if tp > 1 else [])
        for method in lossy:
            extra = ["--compress", "topk:0.01", "--compress-adaptive", "--compress-adaptive-every", ADAPT_EVERY] \
                if method == "adaptive" else ["--compress", method]
            tag = f"{name} --compress {method}"
            rows = rn.run(f"{name}_{method.replace(':', '_')}", layout + extra)
            if rows is None:
                continue
            trains(tag, rows)
            if method == "adaptive":
                want = [codec_step_bytes(("topk", 0.01), 2, r.get("compress_levels"), mine) for r in rows]
            else:
                want = [expected_step_bytes(method, 2, mine)] * STEPS
            check_bytes(checks, tag, rows, want)
            gap = float(losses(rows)[-5:].mean() - losses(ex)[-5:].mean())
            figures.append((tag, gap, rows[-1]["comm_bytes"] / ex[-1]["comm_bytes"]))
            if method in tp1_gap:
                checks.check(abs(gap - tp1_gap[method]) <= TOL_GAP_SPLIT, f"{tag}: last-5 loss gap to the exact "
                             f"{name} run {gap:+.4f}, at tp 1 pp 1 {tp1_gap[method]:+.4f}: more than "
                             f"{TOL_GAP_SPLIT} apart")
    print("\nlossy exchanges with a split replica: last-5 mean loss minus the layout's exact run's, bytes/step "
          "over exact's (rank 0)")
    for tag, gap, ratio in figures:
        print(f"  {tag:<36} {gap:+.4f}   {ratio:.4f}")


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    checks = dc.Tally("test_comm_efficient")
    t_start = time.monotonic()
    rn = Runner(args, checks)
    dp2 = ["--nproc", 2, "--dp", 2]
    G = all_reduce_sent(PSI, 4, 2)
    print(f"Psi {PSI} (python shapes), G = {G} bytes per exact all-reduce at dp=2")
    checks.check(PSI == dc.PSI, f"setup: Psi from the GPT-2 shapes {PSI} != dp_common.PSI {dc.PSI}")

    # ---- exact DP and the lr=0 control
    exact = rn.run("exact_dp2", dp2, save=True, summary=True)
    control = rn.run("control_lr0", dp2 + ["--lr", 0, "--min-lr", 0])
    if exact is None or control is None:
        checks.fatal("the exact dp=2 run or the lr=0 control failed: nothing to compare with")
    try:
        with open(rn.path("exact_dp2", "summary.json")) as f:
            summ = json.load(f)
        checks.check(summ.get("params") == PSI, f"exact dp=2 --summary: params {summ.get('params')} != Psi {PSI}")
    except (OSError, json.JSONDecodeError) as e:
        checks.check(False, f"exact dp=2 --summary unreadable: {e}")
    saved = dc.load_saved(rn.path("exact_dp2", "safetensors"), checks, "exact dp=2")
    if saved is not None:
        mine = {n: s for n, s, _ in TENSORS}
        theirs = {n: tuple(a.shape) for n, a in saved.items()}
        checks.check(mine == theirs, f"the --save file's tensors differ from the GPT-2 shapes used for the byte "
                     f"formulas: {sorted(set(mine.items()) ^ set(theirs.items()))[:4]}")
    check_bytes(checks, "exact dp=2", exact, [G] * STEPS)
    ring = 2 * (2 - 1) / 2 * 4 * PSI
    checks.check(abs(G - ring) <= 8, f"exact dp=2: G {G} is not the ring figure 2(n-1)/n S = {ring:.0f}")
    base_last5 = float(losses(control)[-5:].mean())
    improvement = base_last5 - float(losses(exact)[-5:].mean())
    print(f"exact dp=2: loss {exact[0]['loss']:.4f} -> {exact[-1]['loss']:.4f}; improvement over the lr=0 "
          f"control (last-5 mean) {improvement:.3f}")
    checks.check(improvement >= MIN_IMPROVEMENT, f"test setup: the exact run improves on the lr=0 control by "
                 f"only {improvement:.3f}")

    table = [("exact", improvement, exact[0]["comm_bytes"])]

    def trains(tag: str, rows: List[dict]) -> None:
        l = losses(rows)
        checks.check(bool(np.all(np.isfinite(l))), f"{tag}: non-finite loss at steps "
                     f"{[int(i) for i in np.flatnonzero(~np.isfinite(l))][:5]}")
        checks.check(rel_diff(rows[0]["loss"], exact[0]["loss"]) <= TOL_STEP0_REL,
                     f"{tag}: step-0 loss {rows[0]['loss']!r} != exact {exact[0]['loss']!r} (same forward)")
        imp = base_last5 - float(l[-5:].mean())
        checks.check(imp >= MIN_IMPROVEMENT, f"{tag}: does not train: last-5 mean loss {l[-5:].mean():.4f} is "
                     f"only {imp:.3f} below the lr=0 control's {base_last5:.4f} (need {MIN_IMPROVEMENT})")
        table.append((tag, imp, rows[-1].get("comm_bytes")))

    # ---- 1 + 5. each compression method trains and sends its payload formula's bytes
    for method in TRAIN_METHODS:
        rows = rn.run(f"compress_{method.replace(':', '_')}", dp2 + ["--compress", method])
        if rows is None:
            continue
        trains(method, rows)
        check_bytes(checks, f"--compress {method} dp=2", rows, [expected_step_bytes(method, 2)] * STEPS)

    # ---- 4 + 5 at dp=3: uneven all-reduce partition, all_gather sends (n-1) payloads
    for method in ("exact", "qsgd:4"):
        extra = ["--nproc", 3, "--dp", 3] + ([] if method == "exact" else ["--compress", method])
        rows = rn.run(f"dp3_{method.replace(':', '_')}", extra)
        if rows is None:
            continue
        want = all_reduce_sent(PSI, 4, 3) if method == "exact" else expected_step_bytes(method, 3)
        check_bytes(checks, f"{method} dp=3", rows, [want] * STEPS)
        if method == "exact":
            ring = 2 * (3 - 1) / 3 * 4 * PSI
            checks.check(abs(want - ring) <= 8, f"dp=3: counter formula {want} vs ring 2(n-1)/n S {ring:.0f}")

    # ---- 6. adaptive
    tag = "adaptive topk:0.01"
    rows = rn.run("adaptive_topk", dp2 + ["--compress", "topk:0.01", "--compress-adaptive",
                                          "--compress-adaptive-every", ADAPT_EVERY])
    if rows is not None:
        trains(tag, rows)
        levels = [r.get("compress_levels") for r in rows]
        ok = checks.check(all(isinstance(v, list) and len(v) == N_GROUPS and all(x in (0, 1) for x in v)
                              for v in levels),
                          f"{tag}: compress_levels must be a list of {N_GROUPS} 0/1 per row; got {levels[:3]}")
        if ok:
            fr = [r.get("compress_light") for r in rows]
            checks.check(all(isinstance(f, (int, float)) and abs(f - sum(v) / N_GROUPS) < 1e-9
                             for f, v in zip(fr, levels)),
                         f"{tag}: compress_light is not the mean of compress_levels: {list(zip(fr, levels))[:3]}")
            early = [s for s in range(2 * ADAPT_EVERY) if levels[s] != [1] * N_GROUPS]
            checks.check(not early, f"{tag}: not all light in the first 2K = {2 * ADAPT_EVERY} steps: steps {early}")
            moved = [s for s in range(1, STEPS) if s % ADAPT_EVERY and levels[s] != levels[s - 1]]
            checks.check(not moved, f"{tag}: levels changed off a multiple of K={ADAPT_EVERY}: steps {moved}")
            heavy_any = any(0 in v for v in levels)
            print(f"{tag}: levels every K steps {levels[::ADAPT_EVERY]} (some heavy later: {heavy_any})")
            check_bytes(checks, tag, rows, [codec_step_bytes(("topk", 0.01), 2, v) for v in levels])

    # ---- 3. Local SGD with warm-up (AdamW), and with optimizer-state averaging
    tag = f"--local-sgd {LOCAL_H} --local-sgd-warmup {LOCAL_K}"
    rows = rn.run("local_h_k", dp2 + ["--local-sgd", LOCAL_H, "--local-sgd-warmup", LOCAL_K], save=True)
    if rows is not None:
        trains(tag, rows)
        want_sync = [s < LOCAL_K or (s + 1 - LOCAL_K) % LOCAL_H == 0 for s in range(STEPS)]
        got_sync = [r.get("synced") for r in rows]
        checks.check(got_sync == want_sync, f"{tag}: synced on steps {[s for s, v in enumerate(got_sync) if v]}, "
                     f"expected {[s for s, v in enumerate(want_sync) if v]}")
        bad = [s for s in range(LOCAL_K + 1) if rel_diff(rows[s]["loss"], exact[s]["loss"]) > TOL_WARMUP_REL]
        checks.check(not bad, f"{tag}: the losses of steps 0..K={LOCAL_K} must equal exact DP's; steps {bad} "
                     f"differ: {[(rows[s]['loss'], exact[s]['loss']) for s in bad][:2]}")
        diff_after = max(abs(rows[s]["loss"] - exact[s]["loss"]) for s in range(LOCAL_K + 1, STEPS))
        checks.check(diff_after > 1e-4, f"{tag}: after the warm-up the losses still equal exact DP's (max diff "
                     f"{diff_after:.1e}): the local steps did not happen")
        check_bytes(checks, tag, rows, [G if w else 0 for w in want_sync])
        after_exact = (STEPS - LOCAL_K) * G
        after_local = sum(r["comm_bytes"] for r in rows[LOCAL_K:])
        n_sync = (STEPS - LOCAL_K) // LOCAL_H
        print(f"{tag}: after the warm-up {after_local} bytes vs exact {after_exact} "
              f"({after_exact / max(after_local, 1):.2f}x fewer; {n_sync} syncs in {STEPS - LOCAL_K} local steps)")
        checks.check(after_local == n_sync * G and LOCAL_H <= after_exact / max(after_local, 1) < LOCAL_H + 1,
                     f"{tag}: after the warm-up rank 0 sent {after_local} bytes, expected {n_sync} x G = "
                     f"{n_sync * G} (~{LOCAL_H}x fewer than exact's {after_exact})")
        dc.load_saved(rn.path("local_h_k", "safetensors"), checks, tag)
    tag = f"--local-sgd {LOCAL_H} --local-sgd-state"
    rows = rn.run("local_state", dp2 + ["--local-sgd", LOCAL_H, "--local-sgd-state"])
    if rows is not None:
        want_sync = [(s + 1) % LOCAL_H == 0 for s in range(STEPS)]
        checks.check([r.get("synced") for r in rows] == want_sync, f"{tag}: synced flags "
                     f"{[r.get('synced') for r in rows]} != {want_sync}")
        check_bytes(checks, tag + " (params + AdamW m, v per sync)", rows, [3 * G if w else 0 for w in want_sync])

    # ---- 2. --local-sgd 1 == exact DP for SGD without momentum
    sgd = dp2 + ["--optimizer", "sgd", "--momentum", 0, "--grad-clip", 0, "--lr", SGD_LR]
    a = rn.run("sgd_exact", sgd, save=True)
    b = rn.run("sgd_local1", sgd + ["--local-sgd", 1], save=True)
    if a is not None and b is not None:
        dl = float(np.max(np.abs(losses(a) - losses(b))))
        print(f"SGD: exact {a[0]['loss']:.4f} -> {a[-1]['loss']:.4f}; --local-sgd 1 worst |loss diff| {dl:.2e}")
        checks.check(a[-1]["loss"] < a[0]["loss"] - 0.2, f"test setup: SGD lr {SGD_LR} does not train "
                     f"({a[0]['loss']:.4f} -> {a[-1]['loss']:.4f})")
        checks.check(dl <= TOL_SGD_LOSS, f"--local-sgd 1 (SGD, momentum 0): loss differs from exact DP by {dl:.2e} "
                     f"> {TOL_SGD_LOSS:g}")
        checks.check(all(r.get("synced") is True for r in b), "--local-sgd 1: every step must be synced")
        check_bytes(checks, "--local-sgd 1", b, [G] * STEPS)
        wa = dc.load_saved(rn.path("sgd_exact", "safetensors"), checks, "SGD exact")
        wb = dc.load_saved(rn.path("sgd_local1", "safetensors"), checks, "SGD --local-sgd 1")
        if wa is not None and wb is not None:
            dw = max(float(np.max(np.abs(wa[k].astype(np.float64) - wb[k]))) for k in wa)
            print(f"SGD: --local-sgd 1 final weights max |diff| {dw:.2e}")
            checks.check(dw <= TOL_SGD_W, f"--local-sgd 1 (SGD, momentum 0): final weights differ from exact DP "
                         f"by {dw:.2e} > {TOL_SGD_W:g}")

    # ---- 8. every exchange with every split of the replica: dp 2 over each (tp, pp) coordinate
    split_section(rn, checks, exact, trains)

    # ---- 7. bad flags
    bad_flags = [
        (["--nproc", 1, "--compress", "topk:0.1"], ["--compress", "--nproc"]),
        (["--nproc", 1, "--local-sgd", 2], ["--local-sgd", "--nproc"]),
        (dp2 + ["--compress", "bogus"], ["--compress", "bogus"]),
        (dp2 + ["--compress", "topk:0"], ["--compress", "topk:0"]),
        (dp2 + ["--compress", "qsgd:9"], ["--compress", "qsgd:9"]),
        (dp2 + ["--compress", "powersgd:0"], ["--compress", "powersgd:0"]),
        (dp2 + ["--compress", "qsgd:4", "--zero", 1], ["--compress", "--zero"]),
        (dp2 + ["--local-sgd", 2, "--zero", 2], ["--local-sgd", "--zero", "replica"]),
        (["--nproc", 2, "--tp", 2, "--compress", "topk:0.1"], ["--compress", "--tp 2", "dp 1"]),
        (["--nproc", 4, "--pp", 2, "--micro-batch-size", 3, "--async", "ps"], ["--async ps", "--pp 2", "worker"]),
        (dp2 + ["--moe-every", 2, "--experts", 2, "--compress", "sign"], ["MoE", "--moe-every 2", "--compress sign"]),
        (dp2 + ["--compress", "qsgd:4", "--local-sgd", 4], ["--compress", "--local-sgd"]),
        (dp2 + ["--local-sgd-state"], ["--local-sgd-state"]),
        (dp2 + ["--local-sgd-warmup", 2], ["--local-sgd-warmup"]),
        (dp2 + ["--compress-adaptive"], ["--compress-adaptive"]),
        (dp2 + ["--compress", "sign", "--compress-adaptive", "--compress-adaptive-every", 0],
         ["--compress-adaptive-every"]),
    ]
    for i, (extra, names) in enumerate(bad_flags):
        label = " ".join(str(x) for x in extra)
        cmd = override(dc.train_cmd(args.meshtrain, rn.init_path, rn.data_path, STEPS, []), [str(x) for x in extra])
        dc.check_rejected(cmd, rn.path(f"bad{i}", "jsonl"), rn.path(f"bad{i}", "log"), names, checks, f"`{label}`")

    print("\nmethod                         improvement vs lr=0   comm_bytes/step (rank 0)")
    for name, imp, cb in table:
        print(f"  {name:<28} {imp:>10.3f}            {cb}")
    print(f"total time {time.monotonic() - t_start:.1f} s")
    checks.finish()


if __name__ == "__main__":
    main()
