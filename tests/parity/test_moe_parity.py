"""Parity: the MoE GPT of `meshtrain train` against the PyTorch reference (moe_reference.py), step by step
and tensor by tensor, plus evaluation, bit-identical resume and sampling of an MoE model.

The model: L=2, H=2, C=32, V=64, Tmax=32, --moe-every 2 (block 0 dense, block 1 MoE), E=4 experts of hidden
width 32. B=8 windows of T=16, 20 AdamW steps (lr 2e-3 -> min-lr 2e-4, warmup 3, cosine, wd 0.1, clip 2.0,
betas 0.9/0.95, eps 1e-8), --seed 1234 (the random second policy's draws are keyed by it). Init: the
test_gpt_parity widths plus a router of std 0.5, so that routing is uneven (one expert gets ~45% of the first
choices at step 0) and capacity drops choices on step 0 and on most later steps (the load-balancing loss
evens the routing out: top2 drops 17..58 of 256 choices per step). Data: test_gpt_parity's sparse Markov chain.
Cases (every one with G=2 windows per routing group, i.e. 2 groups of 32 tokens per step):
  top2   top-2, --capacity-factor 1.0 (capacity 16 of 32 tokens), policy all, aux 0.5, z 0.01
  rand   top-2, --capacity-factor 1.0, --moe-second-policy random, aux 0.5, z 0.01
  top1   top-1, --capacity-factor 1.25 (capacity 10), aux 0.5, z 0.01
Why alpha = 0.5 and beta = 0.01: the final weights are the only place the auxiliary gradients show (the
reported losses do not depend on them at step 0). At the default alpha 0.01 the load-balancing gradient
moves the router by less than the weight tolerance; the test checks (reference runs with alpha = 0 and with
beta = 0) that each term moves some final weight by more than 10x the tolerance, so leaving out either
gradient in meshtrain fails the weight comparison.
Compared, with the reason for each tolerance (rounding sources as in test_gpt_parity.py):
  loss       step 0 rel 1e-5 (one float32 forward), every step abs 2e-4 (Adam amplifies float32 rounding;
             a wrong gate or a dropped token that should pass moves it >= 1e-3).
  aux_loss, z_loss   step 0 rel 1e-5; every step rel 1e-3: they follow the weights' trajectory, whose
             rounding differences (~1e-6 rel) the softmax and logsumexp pass on unamplified; a wrong group
             size or mean over the wrong count changes them by a factor (>= 2x).
  moe_dropped exactly (abs 1e-12): drops are counts of discrete decisions. A decision could flip only if two
             router probabilities were within float32 rounding of each other or a second-choice gate within
             rounding of its uniform draw; the test reports every step's mismatch, so such a tie would show
             as one step, not a drift.
  lr         rel 1e-7 (float32 of the closed form); grad_norm rel 1e-3 (sums of squares in another order).
  weights    max abs diff 2e-4 per tensor after 20 steps (Adam moves each weight ~lr per step whatever its
             gradient, so one wrong step shows as >= 2e-4), except the key slice [C, 2C) of each
             attn.c_attn.bias, whose true gradient is zero (see test_gpt_parity.py): within sum(lr).
             An expert that no admitted token reached in a step gets a zero gradient from the task and
             only weight decay moves it, in both implementations.
Also checked on the top2 case (meshtrain only, each against a run of itself or of the reference):
  eval       --val-data with --eval-every 5: val_loss rows at steps 4, 9, 14, 19, finite, and the step-19
             val_loss equals the reference's cross-entropy of the final reference weights on the first
             --eval-batches windows of the val shard (abs 1e-3: the weights differ by <= 2e-4).
  resume     --checkpoint-dir/--save-every 5/--stop-at-step 10, then --resume: steps 10..19 of the
             resumed run equal the uninterrupted run's exactly (loss, aux_loss, z_loss, moe_dropped, lr,
             grad_norm as printed), and both final --save files are byte-for-byte equal in every tensor.
  sample     `meshtrain sample --init final --temperature 0` exits 0, twice with the same output, which
             has the prompt's length plus --max-new-tokens tokens (vocabulary 64: the prompt uses bytes < 64).
"""
from __future__ import annotations

import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_reference as ref  # noqa: E402
import moe_reference as mr  # noqa: E402
from dp_common import remove_stale  # noqa: E402
from parity_harness import Checks, parse_args, read_metrics, rel_diff, run  # noqa: E402
from test_gpt_parity import INIT_STD, markov_tokens  # noqa: E402

CFG = ref.GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32)
B, T, STEPS, G, E, HX = 8, 16, 20, 2, 4, 32
HP = ref.HParams(lr=2e-3, min_lr=2e-4, warmup_steps=3, beta1=0.9, beta2=0.95, eps=1e-8,
                 weight_decay=0.1, grad_clip=2.0)
STD = {**INIT_STD, "router.weight": 0.5}
SEED_INIT, SEED_DATA, SEED_VAL, SEED_RUN = 1, 2, 3, 1234
N_TOKENS = 3001
ALPHA, BETA = 0.5, 0.01
TOL_LOSS0_REL, TOL_LOSS_ABS, TOL_AUX_REL, TOL_LR_REL, TOL_GN_REL, TOL_W_ABS = 1e-5, 2e-4, 1e-3, 1e-7, 1e-3, 2e-4
EVAL_EVERY, EVAL_BATCHES, TOL_VAL_ABS = 5, 2, 1e-3
CASES = [  # name, top-k, capacity factor, second policy
    ("top2", 2, 1.0, "all"),
    ("rand", 2, 1.0, "random"),
    ("top1", 1, 1.25, "all"),
]


def opts_of(F: float, policy: str, alpha: float = ALPHA, beta: float = BETA) -> mr.MoEOptions:
    return mr.MoEOptions(capacity_factor=F, second_policy=policy, group_windows=G, aux_loss=alpha, z_loss=beta,
                         seed=SEED_RUN)


def train_cmd(args, init_path, data_path, k, F, policy, extra):
    return [args.meshtrain, "train", "--model", "gpt", "--init", init_path, "--data", data_path,
            "--batch-size", B, "--seq-len", T, "--steps", STEPS, "--lr", repr(HP.lr), "--min-lr", repr(HP.min_lr),
            "--warmup-steps", HP.warmup_steps, "--beta1", repr(HP.beta1), "--beta2", repr(HP.beta2),
            "--eps", repr(HP.eps), "--weight-decay", repr(HP.weight_decay), "--grad-clip", repr(HP.grad_clip),
            "--seed", SEED_RUN, "--threads", 1, "--quiet", "--moe-every", 2, "--experts", E, "--moe-top-k", k,
            "--expert-hidden", HX, "--capacity-factor", repr(F), "--moe-group-windows", G,
            "--moe-second-policy", policy, "--moe-aux-loss", repr(ALPHA), "--moe-z-loss", repr(BETA), *extra]


def load(path: str, checks: Checks, label: str):
    """(tensors, metadata, header entries) of a --save file, or None after a failure."""
    if not checks.check(os.path.isfile(path), f"{label}: --save file {path} was not written"):
        return None
    try:
        raw, meta = ref.read_safetensors(path)
        entries, _, _ = ref.read_safetensors_header(path)
    except (ref.FormatError, OSError, ValueError) as e:
        checks.check(False, f"{label}: --save file {path} is not valid safetensors: {e}")
        return None
    return ref.normalize_names(raw), meta, entries


def compare_steps(label, hist, mt, checks):
    print(f"\n[{label}] {'step':>4} {'loss ref':>10} {'|dloss|':>9} {'aux ref':>9} {'aux rel':>8} {'z ref':>9} "
          f"{'z rel':>8} {'drop ref':>9} {'drop mt':>9} {'gn rel':>8} verdict")
    for h, m in zip(hist, mt):
        s = h["step"]
        bad = []
        for key in ("aux_loss", "z_loss", "moe_dropped"):
            if not isinstance(m.get(key), (int, float)) or not math.isfinite(m[key]):
                bad.append(f"{key} = {m.get(key)!r} is not a finite number")
        if bad:
            checks.check(False, f"{label} step {s}: " + "; ".join(bad))
            continue
        dl = abs(m["loss"] - h["loss"])
        if s == 0:
            for key in ("loss", "aux_loss", "z_loss"):
                if rel_diff(m[key], h[key]) > TOL_LOSS0_REL:
                    bad.append(f"step-0 {key} {m[key]!r} vs {h[key]!r}: rel {rel_diff(m[key], h[key]):.2e} > "
                               f"{TOL_LOSS0_REL:g}")
        if dl > TOL_LOSS_ABS:
            bad.append(f"loss {m['loss']:.6f} vs {h['loss']:.6f}: abs {dl:.2e} > {TOL_LOSS_ABS:g}")
        for key in ("aux_loss", "z_loss"):
            if rel_diff(m[key], h[key]) > TOL_AUX_REL:
                bad.append(f"{key} {m[key]:.6f} vs {h[key]:.6f}: rel {rel_diff(m[key], h[key]):.2e} > {TOL_AUX_REL:g}")
        if abs(m["moe_dropped"] - h["dropped_frac"]) > 1e-12:
            bad.append(f"moe_dropped {m['moe_dropped']!r} vs {h['dropped_frac']!r} ({h['dropped']} of "
                       f"{h['choices']} choices)")
        if rel_diff(m["lr"], h["lr"]) > TOL_LR_REL:
            bad.append(f"lr {m['lr']!r} vs {h['lr']!r}")
        if rel_diff(m["grad_norm"], h["grad_norm"]) > TOL_GN_REL:
            bad.append(f"grad_norm {m['grad_norm']:.6f} vs {h['grad_norm']:.6f}: rel "
                       f"{rel_diff(m['grad_norm'], h['grad_norm']):.2e} > {TOL_GN_REL:g}")
        print(f"[{label}] {s:>4} {h['loss']:>10.6f} {dl:>9.2e} {h['aux_loss']:>9.5f} "
              f"{rel_diff(m['aux_loss'], h['aux_loss']):>8.1e} {h['z_loss']:>9.4f} "
              f"{rel_diff(m['z_loss'], h['z_loss']):>8.1e} {h['dropped_frac']:>9.5f} {m['moe_dropped']:>9.5f} "
              f"{rel_diff(m['grad_norm'], h['grad_norm']):>8.1e} {'ok' if not bad else 'MISMATCH'}")
        checks.check(not bad, f"{label} step {s}: " + "; ".join(bad))


def compare_weights(label, path, ref_final, moe, hist, checks):
    got = load(path, checks, label)
    if got is None:
        return
    saved, meta, entries = got
    for key, want in mr.moe_metadata(CFG, moe).items():
        checks.check(meta.get(key) == want, f"{label}: saved __metadata__ {key} = {meta.get(key)!r}, expected {want!r}")
    extra = sorted(n for n in saved if n not in ref_final and not ref.is_buffer_name(n))
    checks.check(not extra, f"{label}: saved file has unexpected tensors {extra[:5]}")
    C, k_tol = CFG.n_embd, sum(h["lr"] for h in hist)
    rows = []
    for name, want in ref_final.items():
        if not checks.check(name in saved, f"{label}: saved file lacks tensor {name}"):
            continue
        g = saved[name]
        ent = entries.get(name, entries.get("transformer." + name, {}))
        if not checks.check(ent.get("dtype") == "F32" and g.shape == want.shape,
                            f"{label}: tensor {name}: saved {ent.get('dtype')} {list(g.shape)}, expected F32 "
                            f"{list(want.shape)}"):
            continue
        err = np.abs(g.astype(np.float64) - want)
        err[~np.isfinite(err)] = np.inf
        parts = [(name, np.ones(want.shape, bool), TOL_W_ABS)]
        if name.endswith("attn.c_attn.bias"):
            key = np.zeros(want.shape, bool)
            key[C:2 * C] = True
            parts = [(name + "[q,v]", ~key, TOL_W_ABS), (name + "[k]", key, k_tol)]
        for lab, mask, tol in parts:
            rows.append((float(np.where(mask, err, -1.0).max()), lab, tol))
    bad = [r for r in rows if not r[0] <= r[2]]
    worst = max((r for r in rows if r[2] == TOL_W_ABS), default=(0.0, "-", 0))
    print(f"[{label}] final weights: {len(rows)} tensors/slices, worst {worst[1]} {worst[0]:.2e} "
          f"(tolerance {TOL_W_ABS:g}); {len(bad)} over tolerance")
    for diff, lab, tol in bad:
        print(f"[{label}]   {lab}: {diff:.3e} > {tol:g}")
    checks.check(not bad, f"{label}: final weights differ: " + "; ".join(f"{l} {d:.2e}" for d, l, _ in bad[:5]))
    checks.check(len(rows) == len(ref_final) + CFG.n_layer,
                 f"{label}: compared {len(rows)} of {len(ref_final) + CFG.n_layer} tensors/slices")


def max_moved(a, b, prefix=""):
    return max(float(np.abs(a[n].astype(np.float64) - b[n]).max()) for n in a if n.startswith(prefix))


def val_loss_ref(final: dict, moe, val_tokens: np.ndarray, opts: mr.MoEOptions) -> float:
    """Mean CE of the final weights over the first EVAL_BATCHES batches of B windows of the val shard (the
    windows as the training batches are cut: consecutive, stride T)."""
    p = {n: torch.tensor(v) for n, v in final.items()}
    losses = []
    with torch.no_grad():
        for b in range(EVAL_BATCHES):
            x, y = ref.get_batch(val_tokens, b, B, T)
            logits, _ = mr.moe_gpt_forward(p, torch.as_tensor(x), CFG, moe, opts)
            losses.append(float(ref.cross_entropy(logits, torch.as_tensor(y))))
    return sum(losses) / len(losses)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    torch.set_num_threads(1)
    checks = Checks("test_moe_parity")
    wd = args.workdir
    data_path, val_path = os.path.join(wd, "data.bin"), os.path.join(wd, "val.bin")
    ref.write_shard(data_path, markov_tokens(N_TOKENS, CFG.vocab_size, SEED_DATA))
    ref.write_shard(val_path, markov_tokens(1001, CFG.vocab_size, SEED_VAL))
    finals = {}
    for name, k, F, policy in CASES:
        moe = mr.MoEConfig(moe_every=2, experts=E, moe_top_k=k, expert_hidden=HX)
        init_path = os.path.join(wd, f"init_{name}.safetensors")
        init = mr.moe_random_init(CFG, moe, SEED_INIT, std_by_suffix=STD)
        ref.write_safetensors(init_path, init, mr.moe_metadata(CFG, moe))
        hist, ref_final = mr.train_moe(init_path, data_path, B, T, STEPS, HP, opts_of(F, policy))
        # --- the setup exercises what it claims
        drops = [h["dropped"] for h in hist]
        checks.check(sum(d > 0 for d in drops) >= STEPS // 2 and drops[0] > 0,
                     f"{name} setup: capacity must drop choices on step 0 and on at least half the steps "
                     f"(the load-balancing loss evens the routing out as it trains); drops {drops}")
        n_clip = sum(h["clipped"] for h in hist)
        checks.check(0 < n_clip < STEPS, f"{name} setup: clipping triggered on {n_clip} of {STEPS} steps")
        near = [h["step"] for h in hist if abs(h["grad_norm"] / HP.grad_clip - 1.0) < 1e-3]
        checks.check(not near, f"{name} setup: grad norms of steps {near} are within 1e-3 of the clip threshold")
        checks.check(hist[-1]["loss"] < hist[0]["loss"] - 0.05,
                     f"{name} setup: loss did not fall ({hist[0]['loss']:.4f} -> {hist[-1]['loss']:.4f})")
        if policy == "random":
            kept = [h["choices"] for h in hist]
            checks.check(all(B * T < c < 2 * B * T for c in kept),
                         f"{name} setup: the random policy must keep some second choices and leave some: {kept}")
        if name == "top2":
            for what, o in (("alpha=0", opts_of(F, policy, alpha=0.0)), ("beta=0", opts_of(F, policy, beta=0.0))):
                _, other = mr.train_moe(init_path, data_path, B, T, STEPS, HP, o)
                moved = max_moved(other, ref_final, "h.1.mlp.router")
                print(f"[{name}] reference with {what}: final router differs by {moved:.2e}")
                checks.check(moved > 10 * TOL_W_ABS, f"{name} setup: with {what} the final router moves only "
                             f"{moved:.2e} (<= 10x the tolerance {TOL_W_ABS:g}): that loss term is invisible")
        # --- meshtrain
        metrics, save = os.path.join(wd, f"{name}.jsonl"), os.path.join(wd, f"{name}.safetensors")
        remove_stale(metrics, save)
        r = run(train_cmd(args, init_path, data_path, k, F, policy, ["--metrics", metrics, "--save", save]),
                timeout=300, log_prefix=os.path.join(wd, name))
        if not checks.check(r.ok, f"{name}: meshtrain train failed: {r.describe()}"):
            continue
        mt = read_metrics(metrics, STEPS, checks, label=name)
        if mt is not None:
            compare_steps(name, hist, mt, checks)
        compare_weights(name, save, ref_final, moe, hist, checks)
        finals[name] = (init_path, k, F, policy, moe, ref_final, mt)

    if "top2" not in finals:
        checks.fatal("the top2 case did not run; eval, resume and sample are not checked")
    init_path, k, F, policy, moe, ref_final, full = finals["top2"]

    # --- evaluation
    m_eval = os.path.join(wd, "eval.jsonl")
    remove_stale(m_eval)
    r = run(train_cmd(args, init_path, data_path, k, F, policy,
                      ["--val-data", val_path, "--eval-every", EVAL_EVERY, "--eval-batches", EVAL_BATCHES,
                       "--metrics", m_eval]), timeout=300, log_prefix=os.path.join(wd, "eval"))
    if checks.check(r.ok, f"eval: meshtrain train --val-data failed: {r.describe()}"):
        ev = read_metrics(m_eval, STEPS, checks, label="eval")
        if ev is not None:
            at = [m["step"] for m in ev if "val_loss" in m]
            want_at = [s for s in range(STEPS) if (s + 1) % EVAL_EVERY == 0]
            checks.check(at == want_at, f"eval: val_loss at steps {at}, expected {want_at}")
            vals = [m.get("val_loss") for m in ev if "val_loss" in m]
            checks.check(all(isinstance(v, float) and math.isfinite(v) for v in vals), f"eval: val_loss {vals}")
            if ev[-1].get("val_loss") is not None and full is not None:
                want = val_loss_ref(ref_final, moe, ref.read_shard(val_path), opts_of(F, policy))
                got = ev[-1]["val_loss"]
                print(f"[eval] step {STEPS - 1} val_loss {got:.6f}, reference {want:.6f}")
                checks.check(abs(got - want) <= TOL_VAL_ABS, f"eval: final val_loss {got:.6f} vs reference "
                             f"{want:.6f} (abs {abs(got - want):.2e} > {TOL_VAL_ABS:g})")
                same = all(a["loss"] == b["loss"] for a, b in zip(ev, full))
                checks.check(same, "eval: evaluating changed the training losses")

    # --- checkpoint and bit-identical resume
    ck = os.path.join(wd, "ckpt")
    m1, m2 = os.path.join(wd, "part1.jsonl"), os.path.join(wd, "part2.jsonl")
    s_full, s_res = os.path.join(wd, "top2.safetensors"), os.path.join(wd, "resumed.safetensors")
    remove_stale(ck, m1, m2, s_res)
    r1 = run(train_cmd(args, init_path, data_path, k, F, policy,
                       ["--checkpoint-dir", ck, "--save-every", 5, "--stop-at-step", 10, "--metrics", m1]),
             timeout=300, log_prefix=os.path.join(wd, "part1"))
    r2 = run(train_cmd(args, init_path, data_path, k, F, policy,
                       ["--resume", ck, "--checkpoint-dir", ck, "--save-every", 5, "--metrics", m2, "--save", s_res]),
             timeout=300, log_prefix=os.path.join(wd, "part2")) if r1.ok else r1
    if checks.check(r1.ok and r2.ok, f"resume: a run failed: {r1.describe() if not r1.ok else r2.describe()}"):
        p1 = read_metrics(m1, 10, checks, label="resume part 1")
        recs = []
        with open(m2) as f:
            recs = [json.loads(ln) for ln in f if ln.strip()]
        recs = [x for x in recs if isinstance(x, dict) and x.get("step", -1) >= 10]
        keys = ("loss", "aux_loss", "z_loss", "moe_dropped", "lr", "grad_norm")
        if full is not None:
            checks.check([x["step"] for x in recs] == list(range(10, STEPS)),
                         f"resume: resumed run reports steps {[x['step'] for x in recs]}, expected 10..{STEPS - 1}")
            diff = [(x["step"], kk) for x in recs for kk in keys if x.get(kk) != full[x["step"]][kk]]
            checks.check(not diff, f"resume: resumed metrics differ from the uninterrupted run at {diff[:6]}")
            if p1 is not None:
                diff1 = [(x["step"], kk) for x in p1 for kk in keys if x[kk] != full[x["step"]][kk]]
                checks.check(not diff1, f"resume: the first part differs from the uninterrupted run at {diff1[:6]}")
            print(f"[resume] steps 10..{STEPS - 1}: {len(recs)} rows, {len(diff)} differing values")
        a, b = load(s_full, checks, "resume full"), load(s_res, checks, "resume resumed")
        if a is not None and b is not None:
            names = sorted(a[0])
            differ = [n for n in names if n not in b[0] or not np.array_equal(a[0][n], b[0][n])]
            checks.check(sorted(b[0]) == names and not differ,
                         f"resume: final weights of the resumed run are not bit-identical: {differ[:5]}")

    # --- sampling
    outs = []
    prompt = "!#%&"
    for i in range(2):
        r = run([args.meshtrain, "sample", "--init", s_full, "--prompt", prompt, "--max-new-tokens", 12,
                 "--temperature", 0, "--threads", 1], timeout=120, log_prefix=os.path.join(wd, f"sample{i}"))
        checks.check(r.ok, f"sample {i}: meshtrain sample of the MoE model failed: {r.describe()}")
        outs.append(r.stdout)
    if all(outs):
        text = outs[0].rstrip(b"\n")
        checks.check(outs[0] == outs[1], f"sample: two greedy runs differ: {outs[0]!r} vs {outs[1]!r}")
        n = len(text) - (len(prompt) if text.startswith(prompt.encode()) else 0)
        checks.check(n == 12 and all(c < CFG.vocab_size for c in text),
                     f"sample: expected 12 new tokens < {CFG.vocab_size}, got {text!r}")
    checks.finish()


if __name__ == "__main__":
    main()
