"""Self-checks of the MoE reference (moe_reference.py) and its dump checker (moe_block_check.py): the judge
is judged, against a second writing of each rule, before it judges meshtrain's MoE.

Needs no meshtrain binary and no MoE C++ code; accepts and ignores --meshtrain / --workdir (CTest passes
them). Each check prints its measured error next to its bound; any failure makes the script exit 1.
  - counter_uniform: public test vectors of its parts (SplitMix64's first output from seed 0, FNV-1a 64 of
    "", "a", "foobar") and a second implementation of the whole formula inline, on seeds, streams and
    indices at the edges (2^64-1, non-ASCII streams);
  - capacity: ceil(F*k*group/E) in double left to right (values where exact arithmetic or another order
    gives another integer), dropless, the group_tokens cap, negative F rejected;
  - routing on hand-written probabilities: ties to the lower index, an overfull expert drops the later
    tokens, a second choice's slot counts after all first choices of the group, groups start afresh,
    dropless drops nothing, the random policy keeps exactly the seconds with 2*g2 > u;
  - routing against a loop admission written separately (per-expert counters), over many random cases;
  - the block forward against scalar Python loops (float64, 1e-12), gates (top-2 sums to one, top-1 is
    max p, 0 when dropped), a dropped top-1 token passes only its residual and gets no gradient;
  - the block's autograd gradients (out, aux_sum, z_sum) against float64 finite differences with the
    routing held fixed (torch.autograd.gradcheck), for top-1, top-2 all/random, with and without drops;
  - aux = alpha at perfectly even routing and alpha*E when every token picks one expert;
  - the MoE GPT with E=1, top-1, dropless, alpha = beta = 0 equals the dense GPT whose MLPs are expert 0
    (loss and every gradient, float64 1e-12; the router's gradient is 0), and train_moe equals
    gpt_reference.train for 4 AdamW steps; with alpha > 0 the loss rises by alpha per MoE layer exactly;
  - top-2 over three identical experts, dropless, equals the dense GPT; the expert gradients sum to the
    dense MLP's;
  - the MoE GPT's random policy uses stream "moe.second.{step}.{block}" and the row of the global batch;
    groups of G windows give capacity from G*T;
  - moe_block_check.py: a dump written by the reference in float64 passes (exit 0); a wrong slot, a wrong
    count, a gradient off by 1e-3 and a missing file each fail naming the culprit (exit 1).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_reference as ref  # noqa: E402
import moe_block_check as bc  # noqa: E402
import moe_reference as mref  # noqa: E402
from selfcheck import bounded, expect, registry, run_checks  # noqa: E402

CHECKS, check = registry()


# ---------------------------------------------------------------------------------------------- generator

def inline_uniform(seed, stream, index):
    """The counter formula written a second time, with % 2**64 and explicit byte handling."""
    M = 2 ** 64

    def fin(z):
        z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) % M
        z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) % M
        return z ^ (z >> 31)
    h = 0xcbf29ce484222325
    for byte in bytes(stream, "utf-8"):
        h = ((h ^ byte) * 0x100000001b3) % M
    key = fin(fin(seed % M) ^ h)
    bits = fin((key + (index + 1) * 0x9e3779b97f4a7c15) % M)
    return (bits >> 11) / 9007199254740992.0


@check
def counter_uniform_vectors(tmp):
    # SplitMix64 from state 0: the first output is mix(0x9e3779b97f4a7c15) = 0xe220a8397b1dcdaf
    expect(mref.mix64(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF, "SplitMix64 first output")
    for s, h in (("", 0xCBF29CE484222325), ("a", 0xAF63DC4C8601EC8C), ("foobar", 0x85944171F73967E8)):
        expect(mref.fnv1a64(s) == h, f"fnv1a64({s!r}) = {mref.fnv1a64(s):#x}, want {h:#x}")
    cases = [(0, "", 0), (1234, "moe.second.0.1", 0), (1234, "moe.second.19.3", 4095), (2 ** 64 - 1, "x", 7),
             (42, "moe.second.7.11", 2 ** 40 + 3), (5, "é✓", 1), (1, "moe.second.1.0", 0), (1, "moe.second.10", 0)]
    got = [mref.counter_uniform(*c) for c in cases]
    for c, g in zip(cases, got):
        expect(g == inline_uniform(*c), f"counter_uniform{c} = {g!r}, inline {inline_uniform(*c)!r}")
        expect(0.0 <= g < 1.0, f"counter_uniform{c} = {g} outside [0, 1)")
    expect(len(set(got)) == len(got), f"equal values for different keys: {got}")
    print(f"    {len(cases)} values equal the inline formula, e.g. counter_uniform(1234, 'moe.second.0.1', 0) = {got[1]!r}")
    u = [mref.counter_uniform(9, "moe.second.0.0", i) for i in range(20000)]
    bounded("|mean of 20000 draws - 1/2|", abs(sum(u) / len(u) - 0.5), 0.01)


# ---------------------------------------------------------------------------------------------- routing

@check
def capacity_arithmetic(tmp):
    cases = [((1.0, 2, 8, 4), 4), ((1.25, 2, 64, 4), 40), ((1.0, 1, 10, 3), 4), ((0.0, 2, 16, 4), 16),
             ((8.0, 2, 16, 4), 16),       # ceil(64) capped at group_tokens
             ((1.1, 1, 50, 5), 12),       # 1.1*1*50/5 = 11.000000000000002 in double (exactly 11 in reals)
             ((1.1, 2, 75, 3), 55),       # left to right 55.0; 1.1*(2*75/3) would give 55.00000000000001 -> 56
             ((0.01, 1, 16, 4), 1)]
    for args, want in cases:
        expect(mref.capacity(*args) == want, f"capacity{args} = {mref.capacity(*args)}, want {want}")
    expect(math.ceil(1.1 * (2 * 75 / 3)) == 56, "the order case no longer distinguishes orders")
    for bad in (-0.5, float("nan"), float("inf")):
        try:
            mref.capacity(bad, 1, 8, 2)
            raise AssertionError(f"capacity factor {bad} accepted")
        except ValueError:
            pass


def probs_of(rows):
    return torch.tensor(rows, dtype=torch.float64)


@check
def routing_hand_written(tmp):
    # ties to the lower index
    p = probs_of([[0.25, 0.25, 0.25, 0.25], [0.3, 0.3, 0.4, 0.0], [0.1, 0.45, 0.0, 0.45]])
    expect(mref.top_k_choices(p, 1).flatten().tolist() == [0, 2, 1], "top-1 ties")
    expect(mref.top_k_choices(p, 2).tolist() == [[0, 1], [2, 0], [1, 3]], "top-2 ties")
    # top-1, capacity ceil(1*1*4/2) = 2, every token wants expert 0: the later two are dropped
    r = mref.route(probs_of([[0.9, 0.1]] * 4), 1, 1.0, 4)
    expect(r.slot.flatten().tolist() == [0, 1, -1, -1] and r.dropped == 2 and r.choices == 4,
           f"overfull expert: slots {r.slot.flatten().tolist()}")
    # top-2, GShard order: t0 (0,1), t1 (1,0), t2 (0,1); capacity ceil(1*2*3/2) = 3
    p = probs_of([[0.7, 0.3], [0.2, 0.8], [0.6, 0.4]])
    r = mref.route(p, 2, 1.0, 3)
    expect(r.choice.tolist() == [[0, 1], [1, 0], [0, 1]], f"choices {r.choice.tolist()}")
    # first choices: e0 <- t0 (0), t2 (1); e1 <- t1 (0). Seconds after them: t0->e1 1, t1->e0 2, t2->e1 2
    expect(r.slot.tolist() == [[0, 1], [0, 2], [1, 2]], f"second choices after first: {r.slot.tolist()}")
    # capacity ceil(0.5*2*3/2) = 2: the seconds of t1 and t2 no longer fit; t1 and t2 keep their first
    r = mref.route(p, 2, 0.5, 3)
    expect(r.capacity == 2 and r.slot.tolist() == [[0, 1], [0, -1], [1, -1]] and r.dropped == 2,
           f"capacity 2: {r.capacity}, {r.slot.tolist()}")
    # groups start afresh: the same 3 tokens twice, groups of 3
    r2 = mref.route(torch.cat([p, p]), 2, 0.5, 3)
    expect(r2.slot.tolist() == r.slot.tolist() * 2, f"second group {r2.slot.tolist()}")
    # dropless: everything to one expert, nothing dropped, slots 0..n-1 then n..2n-1
    r = mref.route(probs_of([[0.5, 0.3, 0.2]] * 5), 2, 0.0, 5)
    expect(r.capacity == 5 and r.dropped == 0, f"dropless: capacity {r.capacity}, {r.dropped} dropped")
    expect(r.slot[:, 0].tolist() == list(range(5)) and r.slot[:, 1].tolist() == list(range(5)),
           f"dropless slots {r.slot.tolist()}")  # seconds go to expert 1, which no first choice uses
    r = mref.route(probs_of([[0.5, 0.3, 0.2]] * 3 + [[0.3, 0.5, 0.2]] * 2), 2, 0.0, 5)
    expect(r.slot.tolist() == [[0, 2], [1, 3], [2, 4], [0, 3], [1, 4]] and r.dropped == 0,
           f"dropless mixed {r.slot.tolist()}")


@check
def random_policy_keeps_two_g2_above_u(tmp):
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(64, 4, generator=g, dtype=torch.float64) * 2, dim=1)
    seed, step, layer, first = 77, 5, 3, 128
    r = mref.route(p, 2, 0.0, 64, "random", seed, step, layer, first)
    want = []
    for n in range(64):
        top = sorted(range(4), key=lambda e: (-float(p[n, e]), e))[:2]
        g2 = float(p[n, top[1]]) / (float(p[n, top[0]]) + float(p[n, top[1]]))
        want.append(2.0 * g2 > inline_uniform(seed, f"moe.second.{step}.{layer}", first + n))
    expect(r.kept[:, 1].tolist() == want, "kept seconds differ from 2*g2 > u")
    expect(r.kept[:, 0].all(), "a first choice was not kept")
    expect(0 < sum(want) < 64, f"{sum(want)} of 64 kept: the case does not show both outcomes")
    expect(r.expert[:, 1].tolist() == [int(c) if k else -1 for c, k in zip(r.choice[:, 1], want)], "expert -1")
    expect(r.choices == 64 + sum(want), f"choices {r.choices}")
    r1 = mref.route(p, 2, 0.0, 64, "random", seed, step, layer, first + 1)
    expect(r1.kept[:, 1].tolist() != want, "the draw does not depend on first_token")


def loop_routing(p, top_k, cap, group, keep2):
    """Admission written a second time: per-group counters, first choices then kept seconds."""
    N, E = len(p), len(p[0])
    choice = [sorted(range(E), key=lambda e: (-p[n][e], e))[:top_k] for n in range(N)]
    slot = [[-1] * top_k for _ in range(N)]
    for g0 in range(0, N, group):
        fill = [0] * E
        for k in range(top_k):
            for n in range(g0, g0 + group):
                if k == 1 and not keep2[n]:
                    continue
                e = choice[n][k]
                if fill[e] < cap:
                    slot[n][k] = fill[e]
                    fill[e] += 1
    return choice, slot


@check
def routing_matches_loop_admission(tmp):
    g = torch.Generator().manual_seed(4)
    n_cases = dropped = 0
    for E in (2, 3, 5):
        for top_k in (1, 2):
            for F in (0.0, 0.5, 1.0, 1.25):
                for policy in (("all", "random") if top_k == 2 else ("all",)):
                    group = int(torch.randint(3, 12, (1,), generator=g))
                    N = group * 3
                    skew = torch.tensor([1.5 * e for e in range(E)], dtype=torch.float64)  # unbalanced
                    p = torch.softmax(torch.randn(N, E, generator=g, dtype=torch.float64) + skew, dim=1)
                    r = mref.route(p, top_k, F, group, policy, seed=11, step=2, layer=1)
                    cap = group if F == 0 else min(group, math.ceil(F * top_k * group / E))
                    keep2 = r.kept[:, -1].tolist()
                    choice, slot = loop_routing(p.tolist(), top_k, cap, group, keep2)
                    expect(r.choice.tolist() == choice, f"E={E} k={top_k} F={F}: choices differ")
                    expect(r.slot.tolist() == slot, f"E={E} k={top_k} F={F} {policy}: slots {r.slot.tolist()} "
                           f"vs loop {slot}")
                    dropped += r.dropped
                    n_cases += 1
                    if F == 0:
                        expect(r.dropped == 0, f"dropless dropped {r.dropped}")
    expect(dropped > 50, f"only {dropped} drops over all cases: capacity was barely exercised")
    print(f"    {n_cases} cases equal the loop admission ({dropped} drops in all)")


# ---------------------------------------------------------------------------------------------- block

def block_case(N, C, H, E, seed, dtype=torch.float64, router_std=1.0):
    g = torch.Generator().manual_seed(seed)
    p = {}
    for name, shape in mref.block_shapes(C, H, E):
        std = router_std if name == "router.weight" else (0.5 if name.endswith("weight") else 0.1)
        p[name] = torch.randn(*shape, generator=g, dtype=dtype) * std
    x = torch.randn(N, C, generator=g, dtype=dtype)
    res = torch.randn(N, C, generator=g, dtype=dtype)
    dy = torch.randn(N, C, generator=g, dtype=dtype)
    return p, x, res, dy


def naive_block(p, x, res, choice, slot, E):
    """out, gates, aux_sum, z_sum as scalar loops over Python floats, for the given decisions."""
    P = {n: t.tolist() for n, t in p.items()}
    X, R = x.tolist(), res.tolist()
    N, C = len(X), len(X[0])

    def lin(v, W, b):
        return [sum(v[i] * W[i][j] for i in range(len(v))) + (b[j] if b else 0.0) for j in range(len(W[0]))]

    def gelu(a):
        return 0.5 * a * (1 + math.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3)))
    out, gates, probs, z = [], [], [], 0.0
    for n in range(N):
        logit = lin(X[n], P["router.weight"], None)
        m = max(logit)
        s = sum(math.exp(v - m) for v in logit)
        pr = [math.exp(v - m) / s for v in logit]
        probs.append(pr)
        z += (m + math.log(s)) ** 2
        sel = [pr[e] for e in choice[n]]
        gt = sel if len(sel) == 1 else [v / sum(sel) for v in sel]
        row = list(R[n])
        gates.append([gt[k] if slot[n][k] >= 0 else 0.0 for k in range(len(sel))])
        for k, e in enumerate(choice[n]):
            if slot[n][k] < 0:
                continue
            pre = f"experts.{e}."
            hid = [gelu(v) for v in lin(X[n], P[pre + "c_fc.weight"], P[pre + "c_fc.bias"])]
            y = lin(hid, P[pre + "c_proj.weight"], P[pre + "c_proj.bias"])
            row = [row[c] + gt[k] * y[c] for c in range(C)]
        out.append(row)
    return out, gates, probs, z


@check
def block_forward_matches_loops(tmp):
    for top_k, F, policy in ((1, 1.0, "all"), (2, 1.0, "all"), (2, 0.75, "random"), (2, 0.0, "all")):
        N, C, H, E, group = 12, 5, 7, 3, 6
        p, x, res, _ = block_case(N, C, H, E, seed=10 + top_k)
        r = mref.moe_block(x, res, p, top_k=top_k, capacity_factor=F, group_tokens=group, second_policy=policy,
                           seed=3, step=1, layer=2)
        keep2 = r.routing.kept[:, -1].tolist()
        choice, slot = loop_routing(r.probs.tolist(), top_k, r.routing.capacity, group, keep2)
        slot = [[s if (k == 0 or keep2[n]) else -1 for k, s in enumerate(row)] for n, row in enumerate(slot)]
        out, gates, probs, z = naive_block(p, x, res, choice, slot, E)
        tag = f"top-{top_k} F={F} {policy}"
        bounded(f"{tag}: max |out - loops|", float((r.out - torch.tensor(out, dtype=torch.float64)).abs().max()), 1e-12)
        bounded(f"{tag}: max |gate - loops|", float((r.gate - torch.tensor(gates, dtype=torch.float64)).abs().max()), 1e-14)
        aux = 0.0
        for g0 in range(0, N, group):
            f = [sum(1 for n in range(g0, g0 + group) if choice[n][0] == e) / group for e in range(E)]
            Pm = [sum(probs[n][e] for n in range(g0, g0 + group)) / group for e in range(E)]
            aux += E * sum(fi * pi for fi, pi in zip(f, Pm))
        bounded(f"{tag}: |aux_sum - loops|", abs(float(r.aux_sum) - aux), 1e-13)
        bounded(f"{tag}: |z_sum - loops| / z_sum", abs(float(r.z_sum) - z) / z, 1e-14)
        adm = r.routing.admitted
        if top_k == 2:
            both = adm.all(dim=1)
            bounded(f"{tag}: max |g1 + g2 - 1| where both admitted", float((r.gate[both].sum(1) - 1).abs().max()), 1e-15)
            pre = mref.gates_of(r.probs, r.routing.choice)
            expect(torch.equal(r.gate[adm], pre[adm]), "an admitted gate differs from its pre-capacity value")
        else:
            expect(torch.equal(r.gate[adm], r.probs.max(dim=1).values.unsqueeze(1)[adm]), "top-1 gate is not max p")
        expect(bool((r.gate[~adm] == 0).all()), "a gate of a choice not admitted is not 0")
        if F != 0:
            expect(r.dropped > 0, f"{tag}: no drops, the case does not exercise capacity")


@check
def dropped_top1_token_is_residual_only(tmp):
    N, C, H, E = 8, 4, 6, 2
    p, x, res, dy = block_case(N, C, H, E, seed=20)
    p["router.weight"] = torch.zeros(C, E, dtype=torch.float64)
    p["router.weight"][0, 0] = 5.0  # with x[:, 0] > 0 every token prefers expert 0
    x[:, 0] = x[:, 0].abs() + 0.5
    x.requires_grad_(True)
    r = mref.moe_block(x, res, p, top_k=1, capacity_factor=1.0, group_tokens=N)  # capacity 4 of 8 on expert 0
    drop = ~r.routing.admitted[:, 0]
    expect(drop.tolist() == [False] * 4 + [True] * 4, f"dropped {drop.tolist()}")
    expect(torch.equal(r.out[drop], res[drop]), "a dropped token's output is not its residual")
    (dx,) = torch.autograd.grad((r.out * dy).sum(), [x])
    expect(bool((dx[drop] == 0).all()) and float(dx[~drop].abs().min()) > 0,
           "gradient reaches a dropped token (aux and z off) or misses an admitted one")


@check
def block_gradients_match_finite_differences(tmp):
    N, C, H, E, group = 12, 4, 5, 3, 6
    for top_k, F, policy in ((1, 1.0, "all"), (2, 1.0, "all"), (2, 0.75, "random"), (2, 0.0, "all")):
        p, x, res, _ = block_case(N, C, H, E, seed=30 + top_k, router_std=0.7)
        routing = mref.moe_block(x, res, p, top_k=top_k, capacity_factor=F, group_tokens=group,
                                 second_policy=policy, seed=8, step=4, layer=1).routing
        names = list(p)

        def f(xx, rr, *tensors):
            r = mref.moe_block(xx, rr, dict(zip(names, tensors)), top_k=top_k, capacity_factor=F,
                               group_tokens=group, routing=routing)
            # one tensor: gradcheck skips outputs that do not require grad, so a detached aux would pass
            return torch.cat([r.out.flatten(), r.aux_sum.reshape(1), r.z_sum.reshape(1)])
        inputs = (x.clone().requires_grad_(True), res.clone().requires_grad_(True),
                  *(p[n].clone().requires_grad_(True) for n in names))
        ok = torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-5, raise_exception=False)
        tag = f"top-{top_k} F={F} {policy}: {routing.dropped} dropped, {routing.choices} choices"
        print(f"    {tag}: gradcheck of (out, aux_sum, z_sum) over {sum(t.numel() for t in inputs)} elements "
              f"(float64, eps 1e-6, atol 1e-7, rtol 1e-5): {'ok' if ok else 'FAILED'}")
        expect(ok, f"{tag}: gradcheck failed")
        if F != 0:
            expect(routing.dropped > 0, f"{tag}: no drops")
        grads = torch.autograd.grad(f(*inputs).sum(), inputs)
        used = {int(e) for e in routing.choice[routing.admitted]}
        for n, gr in zip(["x", "residual"] + names, grads):
            if n.startswith("experts."):
                e = int(n.split(".")[1])
                expect((float(gr.abs().max()) > 0) == (e in used), f"{tag}: {n} gradient vs use of expert {e}")


@check
def aux_loss_even_and_collapsed(tmp):
    E, N, group = 4, 16, 8
    C = E
    p = {"router.weight": 40.0 * torch.eye(E, dtype=torch.float64)}  # logits 40 * one-hot: p_i ~ 1 - 3e-17
    for name, shape in mref.block_shapes(C, 3, E)[1:]:
        p[name] = torch.zeros(shape, dtype=torch.float64)
    even = torch.eye(E, dtype=torch.float64)[torch.arange(N) % E]      # token n -> expert n % E
    one = torch.eye(E, dtype=torch.float64)[torch.zeros(N, dtype=torch.int64)]
    for alpha in (0.01, 0.5):
        for x, want, what in ((even, alpha, "even routing"), (one, alpha * E, "every token on expert 0")):
            r = mref.moe_block(x, x, p, top_k=1, capacity_factor=0.0, group_tokens=group)
            got = alpha * float(r.aux_sum) / r.n_groups
            bounded(f"alpha {alpha}, {what}: |alpha * aux - {want:g}|", abs(got - want), 1e-12)


# ---------------------------------------------------------------------------------------------- MoE GPT

TINY = ref.GPTConfig(n_layer=2, n_head=2, n_embd=8, vocab_size=11, n_positions=6)


def dense_params(seed):
    init = ref.random_init(TINY, seed, std=0.08, ln_noise=0.2, bias_std=0.1)
    return {n: torch.tensor(a, dtype=torch.float64) for n, a in init.items()}


def moe_from_dense(dense, moe, router_std, seed, copies=1):
    """MoE parameters whose every expert is a copy of the dense MLP of its block."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in mref.moe_param_shapes(TINY, moe):
        if ".mlp.router." in name:
            out[name] = torch.randn(*shape, generator=g, dtype=torch.float64) * router_std
        elif ".mlp.experts." in name:
            parts = name.split(".")
            out[name] = dense[".".join(parts[:3] + parts[5:])].clone()
        else:
            out[name] = dense[name].clone()
    return out


def batch(seed, B, T):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, TINY.vocab_size, (B, T), generator=g),
            torch.randint(0, TINY.vocab_size, (B, T), generator=g))


@check
def one_expert_equals_dense(tmp):
    moe = mref.MoEConfig(moe_every=1, experts=1, moe_top_k=1, expert_hidden=4 * TINY.n_embd)
    opts = mref.MoEOptions(capacity_factor=0.0, aux_loss=0.0, z_loss=0.0)
    dense = dense_params(40)
    mp = moe_from_dense(dense, moe, router_std=1.0, seed=41)
    idx, tgt = batch(42, 4, 5)
    dp = {n: t.clone().requires_grad_(True) for n, t in dense.items()}
    mpp = {n: t.clone().requires_grad_(True) for n, t in mp.items()}
    dl = ref.gpt_loss(dp, idx, tgt, TINY)
    ml, metrics = mref.moe_gpt_loss(mpp, idx, tgt, TINY, moe, opts)
    bounded("|loss MoE(E=1) - dense|", abs(float(ml) - float(dl)), 1e-12)
    expect(metrics["loss"] == float(ml) and metrics["dropped"] == 0 and metrics["choices"] == 2 * 20,
           f"metrics {metrics}")
    dg = dict(zip(dp, torch.autograd.grad(dl, list(dp.values()))))
    mg = dict(zip(mpp, torch.autograd.grad(ml, list(mpp.values()))))
    err = 0.0
    for n, g in mg.items():
        if ".mlp.router." in n:
            expect(float(g.abs().max()) == 0.0, f"{n}: gradient {float(g.abs().max())} with one expert (p = 1)")
            continue
        parts = n.split(".")
        dn = ".".join(parts[:3] + parts[5:]) if ".mlp.experts." in n else n
        err = max(err, float((g - dg[dn]).abs().max()))
    bounded("max |gradient MoE(E=1) - dense| over every tensor", err, 1e-12)
    # alpha > 0: f = P = 1, so aux = 1 per MoE layer and the loss rises by alpha * 2 exactly
    ml2, metrics2 = mref.moe_gpt_loss(mp, idx, tgt, TINY, moe, mref.MoEOptions(capacity_factor=0.0, aux_loss=0.3))
    bounded("|aux_loss - 2 layers| with one expert", abs(metrics2["aux_loss"] - 2.0), 1e-15)
    bounded("|total - (CE + 0.3 * 2)|", abs(float(ml2) - (float(dl) + 0.6)), 1e-12)
    # z: with ln_2 weight 0 every token's router input is ln_2.bias b, so lse = b . w_router in every row
    # and the mean over the batch's tokens is (b . w)^2 per layer, whatever the normalization's count
    zp = dict(mp)
    want_z = 0.0
    for i in range(TINY.n_layer):
        zp[f"h.{i}.ln_2.weight"] = torch.zeros_like(mp[f"h.{i}.ln_2.weight"])
        want_z += float(mp[f"h.{i}.ln_2.bias"] @ mp[f"h.{i}.mlp.router.weight"][:, 0]) ** 2
    z0, zm0 = mref.moe_gpt_loss(zp, idx, tgt, TINY, moe, mref.MoEOptions(capacity_factor=0.0, aux_loss=0.0))
    z1, zm1 = mref.moe_gpt_loss(zp, idx, tgt, TINY, moe, mref.MoEOptions(capacity_factor=0.0, aux_loss=0.0,
                                                                          z_loss=0.2))
    expect(want_z > 0.1, f"z case too small: {want_z}")
    bounded("|z_loss - sum over layers of (b . w)^2| / that", abs(zm1["z_loss"] - want_z) / want_z, 1e-14)
    bounded("|total(beta 0.2) - total(beta 0) - 0.2 z_loss|", abs(float(z1) - float(z0) - 0.2 * want_z), 1e-12)
    expect(zm0["loss"] == zm1["loss"] == float(z0), "the metric loss is not the cross-entropy alone")


@check
def one_expert_training_equals_dense(tmp):
    moe = mref.MoEConfig(moe_every=2, experts=1, moe_top_k=1, expert_hidden=4 * TINY.n_embd)
    dense = dense_params(50)
    mp = moe_from_dense(dense, moe, router_std=1.0, seed=51)
    dpath, mpath, data = (os.path.join(tmp, f) for f in ("d.safetensors", "m.safetensors", "t.bin"))
    ref.save_model(dpath, TINY, dense)
    mref.save_moe_model(mpath, TINY, moe, mp)
    ref.write_shard(data, np.random.default_rng(52).integers(0, TINY.vocab_size, 200))
    hp = ref.HParams(lr=3e-3, min_lr=3e-4, warmup_steps=2, grad_clip=1.0)
    dh, dfin = ref.train(dpath, data, 3, 5, 4, hp, dtype=torch.float64)
    mh, mfin = mref.train_moe(mpath, data, 3, 5, 4, hp, mref.MoEOptions(capacity_factor=0.0, aux_loss=0.0),
                              dtype=torch.float64)
    for a, b in zip(dh, mh):
        expect(abs(a["loss"] - b["loss"]) < 1e-12 and abs(a["grad_norm"] - b["grad_norm"]) < 1e-12 * a["grad_norm"]
               and a["lr"] == b["lr"] and a["clipped"] == b["clipped"], f"step {a['step']}: {a} vs {b}")
    expect(any(h["clipped"] for h in dh), "no step clipped: clipping over the MoE tensors is not exercised")
    err = 0.0
    for n, w in mfin.items():
        if ".mlp.router." in n:
            continue
        parts = n.split(".")
        err = max(err, float(np.abs(w - dfin[".".join(parts[:3] + parts[5:]) if ".mlp.experts." in n else n]).max()))
    bounded("max |final weight train_moe(E=1) - train| (float64, stored as float32)", err, 1e-7)


@check
def identical_experts_top2_equal_dense(tmp):
    moe = mref.MoEConfig(moe_every=2, experts=3, moe_top_k=2, expert_hidden=4 * TINY.n_embd)
    dense = dense_params(60)
    mp = moe_from_dense(dense, moe, router_std=1.0, seed=61)
    idx, tgt = batch(62, 4, 5)
    opts = mref.MoEOptions(capacity_factor=0.0, aux_loss=0.0)
    dp = {n: t.clone().requires_grad_(True) for n, t in dense.items()}
    mpp = {n: t.clone().requires_grad_(True) for n, t in mp.items()}
    dl = ref.gpt_loss(dp, idx, tgt, TINY)
    ml, metrics = mref.moe_gpt_loss(mpp, idx, tgt, TINY, moe, opts)
    bounded("|loss top-2 identical experts - dense|", abs(float(ml) - float(dl)), 1e-12)
    dg = dict(zip(dp, torch.autograd.grad(dl, list(dp.values()))))
    mg = dict(zip(mpp, torch.autograd.grad(ml, list(mpp.values()))))
    used = [e for e in range(3) if metrics["tokens_1"][e] > 0]
    expect(len(used) >= 2, f"tokens per expert {metrics['tokens_1']}: the case routes to fewer than 2 experts")
    err = max(float((mg[n] - dg[n]).abs().max()) for n in dg if ".mlp." not in n or n.startswith("h.0."))
    bounded("max |gradient - dense| of the non-MoE tensors", err, 1e-12)
    for suffix in ("c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias"):
        total = sum(mg[f"h.1.mlp.experts.{e}.{suffix}"] for e in range(3))
        bounded(f"max |sum over experts of {suffix} gradient - dense|",
                float((total - dg[f"h.1.mlp.{suffix}"]).abs().max()), 1e-12)
    bounded("max |router gradient| (g1 + g2 = 1 over equal experts)",
            float(mg["h.1.mlp.router.weight"].abs().max()), 1e-12)


@check
def gpt_random_policy_stream_and_groups(tmp):
    cfg = ref.GPTConfig(n_layer=4, n_head=2, n_embd=8, vocab_size=11, n_positions=6)
    moe = mref.MoEConfig(moe_every=2, experts=4, moe_top_k=2, expert_hidden=12)
    init = mref.moe_random_init(cfg, moe, 70, std=0.1, std_by_suffix={"router.weight": 1.0})
    p = {n: torch.tensor(a, dtype=torch.float32) for n, a in init.items()}
    B, T, G, seed, step = 4, 5, 2, 99, 7
    idx, tgt = batch(71, B, T)
    opts = mref.MoEOptions(capacity_factor=1.0, second_policy="random", group_windows=G, seed=seed)
    _, results = mref.moe_gpt_forward(p, idx, cfg, moe, opts, step=step)
    expect(sorted(results) == [1, 3], f"MoE blocks {sorted(results)}, want [1, 3] for moe_every 2 of 4")
    for i, r in results.items():
        expect(r.routing.capacity == math.ceil(1.0 * 2 * G * T / 4) and r.n_groups == B // G,
               f"block {i}: capacity {r.routing.capacity}, groups {r.n_groups}")
        g2 = mref.gates_of(r.probs.detach(), r.routing.choice)[:, 1].tolist()
        want = [2.0 * v > inline_uniform(seed, f"moe.second.{step}.{i}", n) for n, v in enumerate(g2)]
        expect(r.routing.kept[:, 1].tolist() == want, f"block {i}: kept seconds are not those of stream "
               f"moe.second.{step}.{i} at the batch row")
        expect(0 < sum(want) < B * T, f"block {i}: {sum(want)} of {B * T} kept")
    expect(sum(r.dropped for r in results.values()) > 0, "no drops in the GPT case")
    try:
        mref.moe_gpt_forward(p, idx[:3], cfg, moe, opts)
        raise AssertionError("3 windows accepted in groups of 2")
    except ValueError:
        pass
    path = os.path.join(tmp, "moe.safetensors")
    mref.save_moe_model(path, cfg, moe, p)
    cfg2, moe2, p2 = mref.load_moe_model(path)
    expect(cfg2 == cfg and moe2 == moe and all(torch.equal(p2[n], p[n]) for n in p), "save/load round trip")
    _, meta = ref.read_safetensors(path)
    expect({k: meta[k] for k in ("moe_every", "experts", "moe_top_k", "expert_hidden")} ==
           {"moe_every": "2", "experts": "4", "moe_top_k": "2", "expert_hidden": "12"}, f"metadata {meta}")


# ---------------------------------------------------------------------------------------------- dump checker

DUMP_CFG = dict(N=16, C=6, H=10, E=3, K=2, capacity_factor=0.5, group_tokens=8, second_policy="random", seed=5,
                step=2, layer=1, first_token=32, aux_scale=0.5, z_scale=0.1)


def make_dump(d):
    return bc.write_example(d, DUMP_CFG, seed=80)


@check
def block_check_accepts_and_rejects(tmp):
    d = os.path.join(tmp, "dump")
    r32 = make_dump(d)
    expect(r32["dropped"] > 0 and r32["choices"] < 32, f"dump case: {r32['dropped']} dropped, {r32['choices']} choices")
    fails = bc.check_dump(d, verbose=False)
    expect(fails == [], f"a faithful dump fails: {fails}")

    def mutated(edit, needle):
        make_dump(d)
        edit()
        fails = bc.check_dump(d, verbose=False)
        expect(any(needle in f for f in fails), f"mutation ({needle}) not reported: {fails}")
        print(f"    caught: {next(f for f in fails if needle in f)}")

    def swap_slot():
        s = np.fromfile(os.path.join(d, "slot.i32"), "<i4").reshape(16, 2)
        n = int(np.argwhere(s[:, 0] >= 0)[-1, 0])
        s[n, 0] = -1
        s.tofile(os.path.join(d, "slot.i32"))

    def grad_off():
        path = os.path.join(d, "grad.experts.1.c_proj.bias.f32")
        g = np.fromfile(path, "<f4")
        g[0] += 1e-3 * np.abs(g).max()
        g.tofile(path)

    def count_off():
        with open(os.path.join(d, "result.json")) as f:
            s = json.load(f)
        s["dropped"] += 1
        with open(os.path.join(d, "result.json"), "w") as f:
            json.dump(s, f)
    mutated(swap_slot, "slot.i32")
    mutated(grad_off, "grad.experts.1.c_proj.bias")
    mutated(count_off, "dropped")
    make_dump(d)
    os.remove(os.path.join(d, "experts.2.c_fc.weight.f32"))
    try:
        bc.check_dump(d, verbose=False)
        raise AssertionError("a dump without experts.2.c_fc.weight.f32 was accepted")
    except bc.DumpError as e:
        expect("experts.2.c_fc.weight.f32" in str(e), f"message does not name the file: {e}")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe_block_check.py")
    make_dump(d)
    ok = subprocess.run([sys.executable, script, d], capture_output=True, text=True)
    grad_off()
    bad = subprocess.run([sys.executable, script, d], capture_output=True, text=True)
    expect(ok.returncode == 0 and "all agree" in ok.stdout, f"faithful dump: exit {ok.returncode}\n{ok.stdout}{ok.stderr}")
    expect(bad.returncode == 1 and "grad.experts.1.c_proj.bias" in bad.stdout,
           f"wrong gradient: exit {bad.returncode}\n{bad.stdout[-500:]}")
    print(f"    moe_block_check.py exit codes: faithful dump {ok.returncode}, wrong gradient {bad.returncode}")


def main() -> int:
    return run_checks(__doc__, "MoE reference self-check", CHECKS)


if __name__ == "__main__":
    sys.exit(main())
