"""Data parallelism + ZeRO: every layout reproduces the single-process run (the central invariant).

The problem is the one of dp_common.py (L=2, H=2, C=32, V=64, B=12, T=16, 20 steps, warmup 3 + cosine,
wd 0.1, clip 2.5 active on steps 0-2 and 4). Runs, one at a time (the machine has 2 cores):
  0. the PyTorch reference (gpt_reference.train) and `meshtrain train --nproc 1`, the single-process
     run; they must agree as in test_gpt_parity.py: step-0 loss rel 1e-5, loss abs 2e-4, lr rel 1e-7,
     grad_norm rel 1e-3, weights 2e-4 (key-bias slice: sum(lr)). This anchors the matrix to the math.
  1. the matrix dp in {1,2,3,4} x zero in {0,1,2,3} x micro-batching off / on (--micro-batch-size 1),
     `--nproc dp --dp dp --zero z`; against the single-process run: step-0 loss rel 1e-5, every step's
     loss abs 2e-3, grad_norm rel 1e-3, lr rel 1e-6, final weights (one consolidated --save file) max abs
     5e-3, the key slice of attn.c_attn.bias within sum(lr) (why: dp_common.weight_diffs). Differences of
     correct layouts are float32 reduction order, ~1e-6 or less (micro-batching in the single-process
     binary: loss 3.5e-8, weights 6e-8, key-bias slice 7.5e-5); the tolerances are loose because
     a bug is large: a wrong window slice, a gradient scaled by dp or by the micro-batch count, a local
     clip norm or a stale ZeRO shard moves the loss by >= 1e-2 and weights by ~lr = 1e-3 per step.
     dp=3 splits Psi = 28544 unevenly (9514.67 per rank).
  2. each layout's --summary: ranks 0..dp-1 once each; per rank, for float32 + Adam, param/grad/optimizer
     bytes of stage 0: 4Psi, 4Psi, 8Psi; 1: 4Psi, 4Psi, 8Psi/N; 2: 4Psi, 4Psi/N, 8Psi/N; 3: 4Psi/N,
     4Psi/N, 8Psi/N, each within N*64 elements * 4 bytes (uneven shards, alignment); sharded quantities
     must add up to at least the full one over the ranks (every element has an owner); peak_rss_bytes at
     least the counted bytes; "tokens_per_s" > 0, "zero", "dp", "params" = Psi.
  3. --grad-comm-dtype bf16 at dp=2: changes the math (the flag's help says so), so it is judged by
     convergence: every step's loss within 5e-2 of the single-process run (bf16 keeps 8 bits of
     mantissa: ~4e-3 relative error per reduced gradient element, which moves Adam's normalized step by
     a few tenths of a percent; 5e-2 is ~10% of the 0.4 the loss falls over the run, far below what a
     broken reduction does). The measured deviation is printed. Its final weights must differ from the
     exact dp=2 run's, or the flag did nothing.
  4. bad splits fail at start with a message naming the three flags and their values: --batch-size 10
     --dp 4 --micro-batch-size 1 (10 % 4 != 0) and --batch-size 12 --dp 4 --micro-batch-size 2
     (12 % (4*2) != 0, though 12 % 4 == 0).
A table gives each layout's worst differences and time, and the total time is printed. Steps: 20 (the
single-process binary does a run in ~0.1 s, so even 4 ranks oversubscribed on 2 cores should take seconds;
if the real total passes ~4 minutes, STEPS = 12 keeps warmup, cosine and clipping active). Runs stop being
started after a 10-minute budget, which counts as a failure, and a run that times out has its whole
process group killed, so a hang cannot silently eat CTest's 900 s timeout or leave ranks spinning.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dp_common as dc  # noqa: E402
import gpt_reference as ref  # noqa: E402
from parity_harness import parse_args, rel_diff  # noqa: E402

STEPS = 20
RUN_TIMEOUT, BUDGET_S = 180.0, 600.0
TOL_REF = dict(loss0_rel=1e-5, loss_abs=2e-4, lr_rel=1e-7, gn_rel=1e-3, w_abs=2e-4)  # as test_gpt_parity
TOL_BF16_LOSS_ABS = 5e-2
MATRIX = [dc.Layout(dp, z, mb) for dp in (1, 2, 3, 4) for z in (0, 1, 2, 3) for mb in (0, 1)]
BAD_SPLITS = [dict(B=10, dp=4, M=1), dict(B=12, dp=4, M=2)]


def expected_bytes(zero: int, n: int) -> dict:
    """Per-rank bytes for float32 params and grads and Adam's two float32 moments."""
    full = {"param_bytes": 4 * dc.PSI, "grad_bytes": 4 * dc.PSI, "optimizer_bytes": 8 * dc.PSI}
    sharded = {"optimizer_bytes": zero >= 1, "grad_bytes": zero >= 2, "param_bytes": zero >= 3}
    return {k: (v / n if sharded[k] else v, sharded[k]) for k, v in full.items()}


def check_summary(path: str, lay: dc.Layout, checks: dc.Tally) -> bool:
    label = f"{lay.name}: --summary"
    if not checks.check(os.path.isfile(path), f"{label} file {path} was not written"):
        return False
    try:
        with open(path) as f:
            s = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        return checks.check(False, f"{label} file {path} is not JSON: {e}")
    if not checks.check(isinstance(s, dict) and isinstance(s.get("ranks"), list),
                        f"{label}: no \"ranks\" list in {str(s)[:200]}"):
        return False
    ok = True
    for key, want in (("zero", lay.zero), ("dp", lay.dp), ("params", dc.PSI)):
        ok &= checks.check(s.get(key) == want, f"{label}: \"{key}\" = {s.get(key)!r}, expected {want}")
    tps = s.get("tokens_per_s")
    ok &= checks.check(isinstance(tps, (int, float)) and math.isfinite(tps) and tps > 0,
                       f"{label}: \"tokens_per_s\" = {tps!r}, expected a positive number")
    ids = [r.get("rank") if isinstance(r, dict) else r for r in s["ranks"]]
    if not checks.check(sorted(ids, key=str) == list(range(lay.dp)),
                        f"{label}: ranks {ids}, expected each of 0..{lay.dp - 1} once"):
        return False
    n, slack = lay.dp, lay.dp * 64 * 4
    exp = expected_bytes(lay.zero, n)
    for r in s["ranks"]:
        vals = {k: r.get(k) for k in (*exp, "peak_rss_bytes")}
        if not checks.check(all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                and v >= 0 for v in vals.values()),
                            f"{label}: rank {r['rank']}: {vals} are not all non-negative numbers"):
            ok = False
            continue
        for k, (want, _) in exp.items():
            ok &= checks.check(abs(vals[k] - want) <= slack,
                               f"{label}: rank {r['rank']}: {k} = {vals[k]:.0f}, expected {want:.0f} +- {slack} "
                               f"(ZeRO-{lay.zero}, Psi {dc.PSI}, N {n})")
        counted = sum(vals[k] for k in exp)
        ok &= checks.check(vals["peak_rss_bytes"] >= counted,
                           f"{label}: rank {r['rank']}: peak_rss_bytes {vals['peak_rss_bytes']} is below the "
                           f"{counted:.0f} bytes of counted buffers")
    for k, (want, sharded) in exp.items():
        total = sum(r.get(k, 0) for r in s["ranks"] if isinstance(r.get(k), (int, float)))
        if sharded and n > 1:
            ok &= checks.check(total >= want * n, f"{label}: {k} over all ranks = {total:.0f} < {want * n:.0f}: "
                               f"some elements have no owner")
    return ok


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    torch.set_num_threads(1)
    checks = dc.Tally("test_dp_equality_matrix")
    wd, t_start = args.workdir, time.monotonic()
    init_path, data_path, _ = dc.write_inputs(wd)

    # --- 0. reference and single-process run
    hist, ref_final = ref.train(init_path, data_path, dc.B, dc.T, STEPS, dc.HP)
    clipped = [h["step"] for h in hist if h["clipped"]]
    checks.check(0 < len(clipped) < STEPS, f"test setup: clipping must trigger on some steps but not all; "
                 f"it triggered on {clipped}")
    near = [h["step"] for h in hist if abs(h["grad_norm"] / dc.HP.grad_clip - 1.0) < 1e-2]
    checks.check(not near, f"test setup: grad norms of steps {near} are within 1% of the clip threshold")
    checks.check(hist[-1]["loss"] < hist[0]["loss"] - 0.2,
                 f"test setup: reference loss did not fall ({hist[0]['loss']:.4f} -> {hist[-1]['loss']:.4f})")
    key_tol = sum(h["lr"] for h in hist)
    print(f"reference: loss {hist[0]['loss']:.4f} -> {hist[-1]['loss']:.4f}, clipped steps {clipped}, "
          f"Psi {dc.PSI}, key-bias tolerance sum(lr) = {key_tol:.2e}")

    base, base_final = dc.single_process_run(args.meshtrain, wd, init_path, data_path, STEPS, RUN_TIMEOUT, checks,
                                             "the single-process run (--nproc 1)")
    bad = []
    for h, m in zip(hist, base):
        s = h["step"]
        if s == 0 and rel_diff(m["loss"], h["loss"]) > TOL_REF["loss0_rel"]:
            bad.append(f"step 0 loss rel {rel_diff(m['loss'], h['loss']):.2e}")
        if abs(m["loss"] - h["loss"]) > TOL_REF["loss_abs"]:
            bad.append(f"step {s} loss {m['loss']:.6f} vs reference {h['loss']:.6f}")
        if rel_diff(m["lr"], h["lr"]) > TOL_REF["lr_rel"]:
            bad.append(f"step {s} lr {m['lr']!r} vs reference {h['lr']!r}")
        if rel_diff(m["grad_norm"], h["grad_norm"]) > TOL_REF["gn_rel"]:
            bad.append(f"step {s} grad_norm {m['grad_norm']:.6f} vs reference {h['grad_norm']:.6f}")
    w_ref, w_ref_at, k_ref = dc.weight_diffs(base_final, ref_final)
    checks.check(not bad, "single-process run vs PyTorch reference: " + "; ".join(bad[:4]))
    checks.check(w_ref <= TOL_REF["w_abs"], f"single-process run vs PyTorch reference: final {w_ref_at} max abs "
                 f"diff {w_ref:.2e} > {TOL_REF['w_abs']:g}")
    checks.check(k_ref <= key_tol, f"single-process run vs PyTorch reference: key-bias slice diff {k_ref:.2e} > "
                 f"{key_tol:.2e}")
    print(f"single-process vs PyTorch reference: worst loss diff "
          f"{max(abs(m['loss'] - h['loss']) for h, m in zip(hist, base)):.2e}, worst weight diff {w_ref:.2e} "
          f"({w_ref_at}), key-bias slice {k_ref:.2e}")

    # --- 1 + 2. the layout matrix, and 3. bf16 gradient communication
    rows, results = [], {}
    skipped = []
    for lay in MATRIX + [dc.Layout(2, 0, 0, "bf16")]:
        if time.monotonic() - t_start > BUDGET_S:
            skipped.append(lay.name)
            continue
        m_path, w_path, s_path = (os.path.join(wd, f"{lay.tag}.{x}") for x in
                                  ("metrics.jsonl", "safetensors", "summary.json"))
        dc.remove_stale(m_path, w_path, s_path)
        n_fail = len(checks.failures)
        r = dc.run_group(dc.train_cmd(args.meshtrain, init_path, data_path, STEPS,
                             lay.flags() + ["--metrics", m_path, "--save", w_path, "--summary", s_path]),
                RUN_TIMEOUT, log_prefix=os.path.join(wd, lay.tag))
        row = dict(name=lay.name, loss=math.nan, gn=math.nan, w=math.nan, k=math.nan, summary="-",
                   secs=r.seconds)
        if not checks.check(r.ok, dc.failure_text(r, " ".join(lay.flags()))):
            rows.append((row, False))
            continue
        got = dc.read_metrics_range(m_path, 0, STEPS, checks, lay.name)
        if got is not None:
            if lay.comm == "f32":
                row["loss"], row["gn"] = dc.compare_steps(got, base, checks, lay.name)
            else:
                row["loss"], row["gn"] = dc.compare_steps(got, base, checks, lay.name,
                                                          loss_abs=TOL_BF16_LOSS_ABS, check_gn_lr=False)
        final = dc.load_saved(w_path, checks, lay.name)
        if final is not None:
            results[lay] = final
            row["w"], at, row["k"] = dc.weight_diffs(final, base_final)
            if lay.comm == "f32":
                checks.check(row["w"] <= dc.TOL_W_ABS, f"{lay.name}: final {at} max abs diff {row['w']:.2e} > "
                             f"{dc.TOL_W_ABS:g}")
                checks.check(row["k"] <= key_tol, f"{lay.name}: key-bias slice max abs diff {row['k']:.2e} > "
                             f"sum(lr) {key_tol:.2e}")
        if lay.comm == "f32":
            row["summary"] = "ok" if check_summary(s_path, lay, checks) else "BAD"
        else:
            exact = results.get(dc.Layout(2, 0, 0))
            if final is not None and exact is not None:
                checks.check(any((final[n] != exact[n]).any() for n in exact),
                             f"{lay.name}: final weights are bit-identical to the float32 dp=2 run: "
                             f"--grad-comm-dtype bf16 changed nothing")
            print(f"bf16 gradient communication, dp=2: max |loss - single-process loss| over {STEPS} steps = "
                  f"{row['loss']:.3e} (tolerance {TOL_BF16_LOSS_ABS:g}); max weight diff {row['w']:.2e}")
        rows.append((row, len(checks.failures) == n_fail))
    checks.check(not skipped, f"time budget of {BUDGET_S:.0f} s used up; layouts not run: {', '.join(skipped)}")

    # --- 4. bad splits
    for bs in BAD_SPLITS:
        m_path = os.path.join(wd, f"badsplit_B{bs['B']}_dp{bs['dp']}_M{bs['M']}.metrics.jsonl")
        dc.remove_stale(m_path)
        cmd = dc.train_cmd(args.meshtrain, init_path, data_path, STEPS, [])
        cmd[cmd.index("--batch-size") + 1] = bs["B"]
        cmd += ["--nproc", bs["dp"], "--dp", bs["dp"], "--micro-batch-size", bs["M"], "--metrics", m_path]
        r = dc.run_group(cmd, 60.0, log_prefix=os.path.join(wd, f"badsplit_B{bs['B']}_M{bs['M']}"))
        text = (r.stderr + r.stdout).decode("utf-8", "replace")
        what = f"--batch-size {bs['B']} --dp {bs['dp']} --micro-batch-size {bs['M']}"
        if checks.check(not r.timed_out and r.returncode not in (0, None),
                        f"bad split {what}: expected a non-zero exit, but it "
                        f"{'timed out' if r.timed_out else 'exited 0'}\n{r.describe()}"):
            missing = dc.names_flag_values(text, {"--batch-size": bs["B"], "--dp": bs["dp"],
                                                  "--micro-batch-size": bs["M"]})
            checks.check(not missing, f"bad split {what}: the error does not name {', '.join(missing)}; "
                         f"it says: {text.strip()[-300:]!r}")
        checks.check(not os.path.exists(m_path) or os.path.getsize(m_path) == 0,
                     f"bad split {what}: metrics were written, so training ran")

    # --- the table
    print(f"\n{'layout':<30} {'max|dloss|':>10} {'gn rel':>9} {'max|dw|':>9} {'k-bias':>9} {'summary':>7} "
          f"{'seconds':>7}  verdict")
    for row, ok in rows:
        print(f"{row['name']:<30} {row['loss']:>10.2e} {row['gn']:>9.2e} {row['w']:>9.2e} {row['k']:>9.2e} "
              f"{row['summary']:>7} {row['secs']:>7.1f}  {'ok' if ok else 'FAIL'}")
    exact_rows = [row for row, _ in rows if "bf16" not in row["name"] and not math.isnan(row["loss"])]
    if exact_rows:
        print(f"worst over the exact layouts: loss {max(r['loss'] for r in exact_rows):.2e}, "
              f"weights {max((r['w'] for r in exact_rows if not math.isnan(r['w'])), default=math.nan):.2e}")
    print(f"total time {time.monotonic() - t_start:.1f} s ({STEPS} steps per run)")
    checks.finish()


if __name__ == "__main__":
    main()
