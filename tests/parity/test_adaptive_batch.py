"""--adaptive-batch at the CLI (train/adaptive_batch.h), on dp_common.py's tiny GPT (B0 = 12 windows x 16 tokens
= 192 tokens per data step, --micro-batch-size 3: 4 small batches per data step for the noise scale), --grad-clip 0
unless said.

Checks:
  1. --adaptive-batch-max 1 (k stays 1) equals the run without --adaptive-batch: every step's loss and
     grad_norm at rel 1e-6 (the same operations), every row batches_per_update 1 and updated.
  2. With the times pinned (MESHTRAIN_ADAPTIVE_BATCH_TIMES=1000,0,1000: a batch's compute and an optimizer
     step of 1 ms each, no exchange), the choice follows the noise scale alone:
     G(2)/G(1) = 4/3 (B_noise + B0)/(B_noise + 2 B0).
     a. A shard of one repeated token: every window is the same sequence, every small batch has the same
        gradient, tr(Sigma) ~ 0 and B_noise ~ 0: the gain is ~2/3 at every decision and k stays 1.
     b. Uniform random tokens (the gradient is mostly noise; B_noise measured ~1000-3000 tokens against
        B0 = 192): the gain at k = 1 is above 1 (B_noise > 2 B0 suffices), so the batch grows: k reaches 2.
  3. Every adaptive run's rows follow the rule: at every decision row the logged gain equals the rule
     recomputed here from the row's own inputs (goodput_noise, t_compute_s, t_exchange_s, t_update_s, k;
     rel 1e-9) with the goodput written from the issue's text (Pollux: statistical efficiency times
     throughput, the throughput of k batches per optimizer step T(k) = k B0 / (k t_compute + t_exchange +
     t_update): the exchange is paid once per optimizer step), k doubles
     exactly when the gain exceeds 1 (and 2k <= max), the following rows use the new k with lr_scale sqrt(k),
     and an optimizer step happens every k-th data step. Also a run with measured times (on this machine the
     optimizer step is ~0.2% of a data step, so the measured rule keeps k = 1 unless B_noise is hundreds of
     times B0: checked for consistency only).
  4. Refusals name both flags.
  5. The accumulated step against an independent PyTorch replay (float64, written from adaptive_batch.h's rule):
     dp 2, noisy data, times pinned to 1000,3000,0 (an exchange of 3 ms against 1 ms of compute), --grad-clip 0.05 (it clips most updates), --adaptive-batch-max 4. Following
     the rows' own k (checked by 3), the replay computes each data step's mean-loss gradient at its current
     weights, and at each `updated` row averages the k of them, clips by their global norm and takes one AdamW
     step (update count t) with lr_at(s) x sqrt(k). Every row's loss (abs 1e-4) and every updated row's
     grad_norm (the averaged gradient's, pre-clip; rel 1e-3) must match; measured below. The gradient is
     exchanged once per optimizer step: rows with `updated` false send only the loss's scalar (comm_bytes < 64),
     updated rows send at least the model's 4-byte gradient once.
     With these times the rule that charged the exchange once per batch (T(k) = k B0 / (k (t_compute +
     t_exchange) + t_update) = B0 / 4 ms for every k) never grows (its gain is E(2k B0) / E(k B0) < 1); the
     rule charging it once per update grows when B_noise > 2/3 B0: the run's batch must grow, and at least one
     decision must be one the old rule decides the other way.
  6. The ranks agree on the times: dp 2, noisy data, rank 0 pinned to 1000,0,0 (alone it never grows: T(2) =
     T(1)) and rank 1 to 1000,3000,0 (alone it grows). Each decision takes the largest of each time over the
     ranks, so both grow together: the run ends (exit 0, no mismatched collectives), its batch grows, and rank 0's
     decision rows log rank 1's 3 ms exchange.
"""
from __future__ import annotations

import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dp_common as dc  # noqa: E402
import gpt_reference as ref  # noqa: E402
from parity_harness import Checks, parse_args, read_metrics, rel_diff  # noqa: E402

HP = ref.HParams(lr=1e-3, min_lr=1e-4, warmup_steps=3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
                 grad_clip=0.0)
B0_TOKENS = dc.B * dc.T


def run(args, checks, tag, data, steps, extra, pinned=None, hp=HP):
    metrics = os.path.join(args.workdir, tag + ".jsonl")
    dc.remove_stale(metrics)
    os.environ.pop("MESHTRAIN_ADAPTIVE_BATCH_TIMES", None)
    if pinned:
        os.environ["MESHTRAIN_ADAPTIVE_BATCH_TIMES"] = pinned
    r = dc.run_group(dc.train_cmd(args.meshtrain, args.init, data, steps,
                                  ["--micro-batch-size", 3, *extra, "--metrics", metrics], hp=hp),
                     120, os.path.join(args.workdir, tag))
    if not checks.check(r.returncode == 0, dc.failure_text(r, tag)):
        return None
    return read_metrics(metrics, steps, checks, label=tag)


NO_EXCHANGE = "1000,0,1000"  # MESHTRAIN_ADAPTIVE_BATCH_TIMES: t_compute_us, t_exchange_us, t_update_us
SLOW_EXCHANGE = "1000,3000,0"


def efficiency(b_noise, k):
    return 1.0 if b_noise is None else (max(0.0, b_noise) + B0_TOKENS) / (max(0.0, b_noise) + k * B0_TOKENS)


def goodput(b_noise, k, t_compute, t_exchange, t_update):
    """Throughput with one exchange per optimizer step of k batches, times the statistical efficiency."""
    return k * B0_TOKENS / (k * t_compute + t_exchange + t_update) * efficiency(b_noise, k)


def goodput_exchange_per_batch(b_noise, k, t_compute, t_exchange, t_update):
    """The superseded rule (the exchange charged k times): only to show where the two decide differently."""
    return k * B0_TOKENS / (k * (t_compute + t_exchange) + t_update) * efficiency(b_noise, k)


def row_times(r):
    return r["t_compute_s"], r["t_exchange_s"], r["t_update_s"]


def follows_rule(rows, checks, tag, max_k):
    """Check 3 over one run's rows; returns the k of each row."""
    k, pending, bad = 1, 0, []
    for r in rows:
        if r["batches_per_update"] != k:
            bad.append(f"step {r['step']}: batches_per_update {r['batches_per_update']}, expected {k}")
        pending += 1
        if r["updated"] != (pending == k):
            bad.append(f"step {r['step']}: updated {r['updated']} with {pending} of {k} batches")
        if pending == k:
            pending = 0
        if abs(r["lr_scale"] - math.sqrt(k)) > 1e-6:
            bad.append(f"step {r['step']}: lr_scale {r['lr_scale']} for k {k}")
        if "goodput_gain" in r:
            want = (goodput(r.get("goodput_noise"), 2 * k, *row_times(r)) /
                    goodput(r.get("goodput_noise"), k, *row_times(r)))
            nxt = 2 * k if want > 1 and 2 * k <= max_k else k
            if rel_diff(r["goodput_gain"], want) > 1e-9 or r["batches_next"] != nxt:
                bad.append(f"step {r['step']}: gain {r['goodput_gain']} next {r['batches_next']}, rule gives "
                           f"{want} next {nxt}")
            k = r["batches_next"]
    print(f"{tag}: k per step", [r["batches_per_update"] for r in rows])
    print(f"{tag}: decisions (step, B_noise, gain)", [(r["step"], r.get("goodput_noise"), round(r["goodput_gain"], 4))
                                                      for r in rows if "goodput_gain" in r])
    checks.check(not bad, f"{tag}: {len(bad)} rows off the rule; first: {bad[0] if bad else ''}")
    checks.check(any("goodput_gain" in r for r in rows), f"{tag}: no decision was logged")
    return [r["batches_per_update"] for r in rows]


def main():
    args = parse_args(__doc__)
    checks = Checks("--adaptive-batch")
    args.init, markov, _ = dc.write_inputs(args.workdir)
    const = os.path.join(args.workdir, "const.bin")
    ref.write_shard(const, np.full(dc.N_TOKENS, 7, dtype=np.uint16))
    noisy = os.path.join(args.workdir, "noisy.bin")
    ref.write_shard(noisy, np.random.RandomState(5).randint(0, dc.CFG.vocab_size, dc.N_TOKENS).astype(np.uint16))

    # 1. k = 1 is the plain run
    plain = run(args, checks, "plain", markov, 10, [])
    k1 = run(args, checks, "adaptive_max1", markov, 10, ["--adaptive-batch", "--adaptive-batch-max", 1,
                                                          "--adaptive-batch-every", 2])
    if plain and k1:
        worst = max(max(rel_diff(a["loss"], b["loss"]), rel_diff(a["grad_norm"], b["grad_norm"]))
                    for a, b in zip(plain, k1))
        print(f"adaptive max 1 vs plain: worst rel {worst:.2e}")
        checks.check(worst <= 1e-6, f"--adaptive-batch-max 1 vs plain: worst rel {worst:.2e} > 1e-6")
        checks.check(all(r["batches_per_update"] == 1 and r["updated"] for r in k1),
                     "--adaptive-batch-max 1: every row should have batches_per_update 1 and updated")

    # 2a. no noise: never grows
    rows = run(args, checks, "const", const, 16, ["--adaptive-batch", "--adaptive-batch-every", 2],
               pinned=NO_EXCHANGE)
    if rows:
        follows_rule(rows, checks, "const", 8)
        gains = [r["goodput_gain"] for r in rows if "goodput_gain" in r]
        checks.check(len(gains) >= 4 and all(g < 1 for g in gains) and all(r["batches_per_update"] == 1 for r in rows),
                     f"const data (no gradient noise): k must stay 1 with every goodput_gain < 1; gains {gains}")

    # 2b. noise: grows
    rows = run(args, checks, "noisy", noisy, 24, ["--adaptive-batch", "--adaptive-batch-every", 2,
                                                   "--adaptive-batch-max", 4], pinned=NO_EXCHANGE)
    if rows:
        ks = follows_rule(rows, checks, "noisy", 4)
        checks.check(max(ks) >= 2, f"noisy data: the batch should grow (k reached {max(ks)})")

    # 3. measured times: consistency only
    rows = run(args, checks, "noisy_measured", noisy, 24, ["--adaptive-batch", "--adaptive-batch-every", 2,
                                                            "--adaptive-batch-max", 4])
    if rows:
        follows_rule(rows, checks, "noisy_measured", 4)
        bad = [r["step"] for r in rows if not (r["t_compute_s"] > 0 and r["t_exchange_s"] >= 0 and
                                               r["t_update_s"] > 0)]
        checks.check(not bad, f"noisy_measured: rows without measured times (t_compute_s > 0, t_exchange_s >= 0, "
                     f"t_update_s > 0): steps {bad}")

    # 4. refusals
    bad = [(["--adaptive-batch", "--micro-batch-size", "3", "--zero", "1", "--nproc", "2"],
            ["--adaptive-batch", "--zero 1"]),
           (["--adaptive-batch"], ["--adaptive-batch", "--micro-batch-size"]),
           (["--adaptive-batch-max", "4"], ["--adaptive-batch-max", "--adaptive-batch"])]
    for i, (flags, names) in enumerate(bad):
        metrics = os.path.join(args.workdir, f"bad{i}.jsonl")
        cmd = dc.train_cmd(args.meshtrain, args.init, markov, 2, flags, hp=HP)
        dc.check_rejected(cmd, metrics, os.path.join(args.workdir, f"bad{i}"), names, checks, " ".join(flags))

    # 5. the accumulated step: exchange once per optimizer step, clipping of the averaged gradient
    clip_hp = ref.HParams(**{**HP.__dict__, "grad_clip": CLIP})
    rows = run(args, checks, "noisy_dp2_clip", noisy, REPLAY_STEPS,
               ["--nproc", 2, "--adaptive-batch", "--adaptive-batch-every", 2, "--adaptive-batch-max", 4],
               pinned=SLOW_EXCHANGE, hp=clip_hp)
    if rows:
        ks = follows_rule(rows, checks, "noisy_dp2_clip", 4)
        checks.check(max(ks) >= 2, f"noisy dp2 clip: the batch should grow (k reached {max(ks)})")
        differ = 0
        for r in rows:
            if "goodput_gain" not in r:
                continue
            k, b = r["batches_per_update"], r.get("goodput_noise")
            old = goodput_exchange_per_batch(b, 2 * k, *row_times(r)) / goodput_exchange_per_batch(b, k, *row_times(r))
            differ += (old > 1) != (r["goodput_gain"] > 1) and 2 * k <= 4
        print(f"noisy_dp2_clip: {differ} decisions the exchange-per-batch rule takes the other way")
        checks.check(differ >= 1, "noisy dp2 clip: no decision where charging the exchange per batch would differ")
        replay(args, rows, noisy, clip_hp, checks)
        n_params = sum(int(np.prod(s)) for _, s in ref.param_shapes(dc.CFG))
        for r in rows:
            ok = r["comm_bytes"] >= 4 * n_params if r["updated"] else r["comm_bytes"] < 64
            checks.check(ok, f"step {r['step']}: comm_bytes {r['comm_bytes']} with updated {r['updated']} "
                         f"(the gradient ({4 * n_params} bytes) is exchanged on updated rows only)")
    # 6. the ranks decide with the same (largest) times
    rows = run(args, checks, "noisy_dp2_ranks", noisy, 16,
               ["--nproc", 2, "--adaptive-batch", "--adaptive-batch-every", 2, "--adaptive-batch-max", 4],
               pinned="1000,0,0;1000,3000,0")
    if rows:
        ks = follows_rule(rows, checks, "noisy_dp2_ranks", 4)
        checks.check(max(ks) >= 2, f"noisy dp2 ranks: the batch should grow (k reached {max(ks)})")
        ex = [r["t_exchange_s"] for r in rows if "goodput_gain" in r]
        checks.check(ex and all(abs(x - 3e-3) < 1e-9 for x in ex),
                     f"noisy dp2 ranks: decisions should use rank 1's exchange time 3 ms; got {ex}")
    checks.finish()


CLIP = 0.05
REPLAY_STEPS = 24


def replay(args, rows, data, hp, checks):
    """Check 5's reference: the rows' k schedule replayed in float64."""
    cfg, p = ref.load_model(args.init, dtype=torch.float64)
    tokens = ref.read_shard(data)
    opt = ref.AdamW(p, hp.beta1, hp.beta2, hp.eps, hp.weight_decay)
    names = list(p)
    acc, n_acc, t, worst_loss, worst_gn, clipped = None, 0, 0, 0.0, 0.0, 0
    for r in rows:
        s = r["step"]
        x, y = (torch.from_numpy(a) for a in ref.get_batch(tokens, s, dc.B, dc.T))
        q = {n: v.clone().requires_grad_(True) for n, v in p.items()}
        loss = ref.gpt_loss(q, x, y, cfg)
        grads = torch.autograd.grad(loss, [q[n] for n in names])
        worst_loss = max(worst_loss, abs(float(loss) - r["loss"]))
        acc = list(grads) if acc is None else [a + g for a, g in zip(acc, grads)]
        n_acc += 1
        if not r["updated"]:
            continue
        k = r["batches_per_update"]
        checks.check(n_acc == k, f"replay step {s}: {n_acc} data steps accumulated for k {k}")
        g = [a / k for a in acc]
        norm = ref.global_grad_norm(g)
        worst_gn = max(worst_gn, rel_diff(r["grad_norm"], norm))
        scale = ref.clip_scale(norm, hp.grad_clip)
        clipped += scale < 1.0
        g = [x * scale for x in g] if scale < 1.0 else g
        lr = ref.lr_at(s, hp.lr, hp.min_lr, hp.warmup_steps, len(rows)) * math.sqrt(k)
        t += 1
        opt.step(p, dict(zip(names, g)), t, lr)
        acc, n_acc = None, 0
    print(f"replay: worst loss abs {worst_loss:.2e}, worst grad_norm rel {worst_gn:.2e}, {t} updates, "
          f"{clipped} clipped")
    checks.check(worst_loss <= 1e-4, f"replay: loss differs by {worst_loss:.2e} > 1e-4")
    checks.check(worst_gn <= 1e-3, f"replay: grad_norm differs by rel {worst_gn:.2e} > 1e-3")
    checks.check(clipped >= t // 2, f"replay: clipping should act on most updates ({clipped} of {t})")


if __name__ == "__main__":
    main()
