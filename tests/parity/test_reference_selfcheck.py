"""Self-checks of the PyTorch reference (gpt_reference.py): the judge is judged before it judges meshtrain.

Needs no meshtrain binary; accepts and ignores --meshtrain / --workdir (CTest passes them). Each check
prints its measured error next to its bound; any failure makes the script exit 1.
  - safetensors and token shards: round trips, header padding, streaming writer == plain writer, and
    rejection of broken files;
  - the batch rule on a shard whose token value is its position, including windows past the end;
  - the LR schedule at its landmarks;
  - AdamW against torch.optim.AdamW and clipping against torch.nn.utils.clip_grad_norm_ on the same
    gradients (float64: 1e-12, the formulas are the same up to rounding; float32: 1e-6);
  - train() against an independent loop built from torch.optim.AdamW + clip_grad_norm_ (float64);
  - the GPT forward against a pure-Python loop version (float64, 1e-10), causality, and float32 vs
    float64 (1e-5);
  - gradients against finite differences with torch.autograd.gradcheck (float64, tiny model);
  - loading: "transformer." prefix and attn.bias buffers ignored, n_head required when not in metadata.
"""
from __future__ import annotations

import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_reference as ref  # noqa: E402
from selfcheck import bounded, expect, registry, run_checks  # noqa: E402

TINY = ref.GPTConfig(n_layer=2, n_head=2, n_embd=8, vocab_size=11, n_positions=6)
CHECKS, check = registry()


def tiny_params(cfg: ref.GPTConfig, seed: int, dtype=torch.float64, scale: float = 4.0):
    """Larger-than-usual weights so that attention is peaked and GELU is in its curved range."""
    init = ref.random_init(cfg, seed, std=0.02 * scale, ln_noise=0.2, bias_std=0.1)
    return {n: torch.tensor(a, dtype=dtype) for n, a in init.items()}


# ---------------------------------------------------------------------------------------------- file formats

@check
def safetensors_roundtrip(tmp):
    rng = np.random.default_rng(0)
    tensors = {"b": rng.standard_normal((3, 5)).astype(np.float32), "a.x": np.arange(7, dtype=np.float32),
               "scalar": np.array(2.5, dtype=np.float32), "empty": np.zeros((0, 4), np.float32),
               "i": np.arange(6, dtype=np.int32).reshape(2, 3), "d": rng.standard_normal(3)}
    meta = {"n_layer": "2", "note": "x y"}
    path = os.path.join(tmp, "rt.safetensors")
    ref.write_safetensors(path, tensors, meta)
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = f.read(n)
    expect(n % 8 == 0, f"header length {n} is not a multiple of 8")
    expect(header.rstrip(b" ").endswith(b"}") and set(header[len(header.rstrip(b' ')):]) <= {32},
           "header is not JSON padded with spaces")
    got, got_meta = ref.read_safetensors(path)
    expect(got_meta == meta, f"metadata {got_meta} != {meta}")
    expect(list(got) == list(tensors), f"order {list(got)} != {list(tensors)}")
    for k, a in tensors.items():
        expect(got[k].dtype == a.dtype and got[k].shape == a.shape and np.array_equal(got[k], a), f"tensor {k}")
    mm, _ = ref.read_safetensors(path, mmap=True)
    expect(all(np.array_equal(mm[k], a) for k, a in tensors.items()), "mmap read differs")
    # streaming writer, odd chunk sizes, must give the same bytes
    path2 = os.path.join(tmp, "rt2.safetensors")
    specs = [(k, ref._NP_TO_ST[a.dtype], a.shape) for k, a in tensors.items()]

    def fill(name, shape):
        flat = tensors[name].reshape(-1)
        for i in range(0, flat.size, 4):
            yield flat[i:i + 4]
        if flat.size == 0:
            yield flat
    ref.write_safetensors_streaming(path2, specs, fill, meta)
    expect(open(path, "rb").read() == open(path2, "rb").read(), "streaming writer output differs")


@check
def safetensors_rejects_broken_files(tmp):
    path = os.path.join(tmp, "ok.safetensors")
    ref.write_safetensors(path, {"w": np.ones((2, 2), np.float32)})
    blob = open(path, "rb").read()
    cases = {"truncated": blob[:-4], "extra bytes": blob + b"\0" * 4, "tiny": blob[:5],
             "huge header": (10 ** 12).to_bytes(8, "little") + blob[8:]}
    for what, data in cases.items():
        bad = os.path.join(tmp, "bad.safetensors")
        with open(bad, "wb") as f:
            f.write(data)
        try:
            ref.read_safetensors(bad)
        except ref.FormatError as e:
            print(f"    {what}: rejected ({str(e)[len(bad) + 2:][:70]})")
            continue
        raise AssertionError(f"{what}: accepted a broken file")


@check
def shard_roundtrip_and_header(tmp):
    toks = np.array([0, 1, 65535, 7, 300], dtype=np.int64)
    path = os.path.join(tmp, "s.bin")
    ref.write_shard(path, toks)
    raw = open(path, "rb").read()
    expect(len(raw) == 256 * 4 + 2 * toks.size, f"size {len(raw)}")
    head = np.frombuffer(raw[:1024], "<i4")
    expect(list(head[:3]) == [20240520, 1, 5] and not head[3:].any(), f"header {head[:4]}")
    expect(np.array_equal(ref.read_shard(path), toks), "tokens differ")
    with open(path, "r+b") as f:
        f.write((20240521).to_bytes(4, "little"))
    try:
        ref.read_shard(path)
        raise AssertionError("bad magic accepted")
    except ref.FormatError:
        pass


@check
def batch_rule_with_wrap(tmp):
    n, B, T = 100, 3, 8
    tokens = np.arange(n, dtype=np.uint16)  # token value = position: the batch shows where it came from
    for s in (0, 1, 4, 9, 1000):
        x, y = ref.get_batch(tokens, s, B, T)
        expect(x.shape == (B, T) and y.shape == (B, T) and x.dtype == np.int64, f"shapes {x.shape} {y.shape}")
        for j in range(B):
            o = (s * B + j) * T
            expect([int(v) for v in x[j]] == [(o + t) % n for t in range(T)], f"step {s} window {j} inputs {x[j]}")
            expect([int(v) for v in y[j]] == [(o + t + 1) % n for t in range(T)], f"step {s} window {j} targets")
    x, _ = ref.get_batch(tokens, 4, B, T)  # o = 96: the window runs 96..99 then 0..3
    expect(list(x[0]) == [96, 97, 98, 99, 0, 1, 2, 3], f"mid-window wrap: {list(x[0])}")


@check
def lr_schedule_landmarks(tmp):
    lr, mn, W, S = 1e-3, 1e-4, 5, 25
    got = [ref.lr_at(s, lr, mn, W, S) for s in range(S)]
    expect(got[:W] == [lr * (s + 1) / W for s in range(W)], f"warmup {got[:W]}")
    expect(got[W] == lr, f"first cosine step {got[W]} != lr")
    bounded("lr at s=W+(S-W)/2 vs (lr+min_lr)/2", abs(got[W + (S - W) // 2] - (lr + mn) / 2), 1e-18)
    expect(all(a > b for a, b in zip(got[W:], got[W + 1:])), "cosine part not decreasing")
    expect(got[-1] > mn and abs(ref.lr_at(S, lr, mn, W, S) - mn) < 1e-18, "end of the cosine")


# ---------------------------------------------------------------------------------------------- optimizer

def _opt_case(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    shapes = {"w2": (5, 7), "w3": (2, 3, 4), "b": (7,), "s": (3,)}
    params = {n: torch.randn(s, generator=g, dtype=dtype) for n, s in shapes.items()}
    grads = [{n: torch.randn(s, generator=g, dtype=dtype) * 10.0 ** float(k % 5 - 3) for n, s in shapes.items()}
             for k in range(12)]
    return params, grads


@check
def adamw_matches_torch_optim(tmp):
    b1, b2, eps, wd = 0.9, 0.95, 1e-8, 0.1
    lrs = [1e-3 * (k + 1) / 3 for k in range(12)]
    for dtype, bound in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        params, grads = _opt_case(dtype, 1)
        mine = {n: p.clone() for n, p in params.items()}
        theirs = {n: p.clone().requires_grad_(True) for n, p in params.items()}
        opt = ref.AdamW(mine, b1, b2, eps, wd)
        topt = torch.optim.AdamW(
            [{"params": [p for p in theirs.values() if p.dim() >= 2], "weight_decay": wd},
             {"params": [p for p in theirs.values() if p.dim() < 2], "weight_decay": 0.0}],
            lr=lrs[0], betas=(b1, b2), eps=eps)
        for k, (gr, lr) in enumerate(zip(grads, lrs)):
            opt.step(mine, gr, k + 1, lr)
            for n, p in theirs.items():
                p.grad = gr[n].clone()
            for group in topt.param_groups:
                group["lr"] = lr
            topt.step()
        # float32: parameters up to ~4 in size, so the error is taken relative to max(1, |p|)
        err = max(float(((mine[n] - theirs[n].detach()).abs() / mine[n].abs().clamp(min=1.0)).max()) for n in mine)
        moved = min(float((mine[n] - params[n]).abs().max()) for n in mine)
        expect(moved > 1e-4, f"parameters barely moved ({moved}); the comparison would be vacuous")
        bounded(f"max |AdamW - torch.optim.AdamW| / max(1, |p|), {dtype}", err, bound)


@check
def clipping_matches_clip_grad_norm(tmp):
    for clip in (0.5, 1e6):  # clipped and not clipped
        _, grads = _opt_case(torch.float64, 2)
        gr = grads[4]
        norm = ref.global_grad_norm(gr.values())
        scale = ref.clip_scale(norm, clip)
        mine = {n: g * scale for n, g in gr.items()}
        ps = [torch.zeros_like(g, requires_grad=True) for g in gr.values()]
        for p, g in zip(ps, gr.values()):
            p.grad = g.clone()
        tnorm = float(torch.nn.utils.clip_grad_norm_(ps, clip))
        bounded(f"clip {clip:g}: |norm - torch norm| / norm", abs(norm - tnorm) / tnorm, 1e-14)
        err = max(float((m - p.grad).abs().max()) for m, p in zip(mine.values(), ps))
        bounded(f"clip {clip:g}: clipped grads vs clip_grad_norm_", err, 1e-14)
        expect((scale < 1.0) == (norm > clip), f"clip {clip}: scale {scale} for norm {norm}")


@check
def train_matches_torch_optim_loop(tmp):
    """train() end to end (batches, lr per step, t, clipping, wd groups) vs a loop built from torch parts."""
    cfg = ref.GPTConfig(n_layer=1, n_head=2, n_embd=8, vocab_size=13, n_positions=8)
    init = ref.random_init(cfg, 3, std=0.1)
    init_path, data_path = os.path.join(tmp, "i.safetensors"), os.path.join(tmp, "d.bin")
    ref.write_safetensors(init_path, init, cfg.metadata())
    tokens = np.random.default_rng(4).integers(0, cfg.vocab_size, 101)
    ref.write_shard(data_path, tokens)
    B, T, S = 2, 6, 12  # 12 * 2 * 6 = 144 > 101 tokens: the last steps wrap
    hp = ref.HParams(lr=3e-3, min_lr=3e-4, warmup_steps=3, grad_clip=1.5)  # norms run 1.24..1.62
    hist, final = ref.train(init_path, data_path, B, T, S, hp, dtype=torch.float64)
    p = {n: torch.tensor(a, dtype=torch.float64, requires_grad=True) for n, a in init.items()}
    opt = torch.optim.AdamW([{"params": [t for t in p.values() if t.dim() >= 2], "weight_decay": hp.weight_decay},
                             {"params": [t for t in p.values() if t.dim() < 2], "weight_decay": 0.0}],
                            lr=hp.lr, betas=(hp.beta1, hp.beta2), eps=hp.eps)
    n_clipped = 0
    for s in range(S):
        x = torch.tensor([[tokens[((s * B + j) * T + t) % tokens.size] for t in range(T)] for j in range(B)])
        y = torch.tensor([[tokens[((s * B + j) * T + t + 1) % tokens.size] for t in range(T)] for j in range(B)])
        opt.zero_grad()
        loss = ref.gpt_loss(p, x, y, cfg)
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(list(p.values()), hp.grad_clip))
        n_clipped += norm > hp.grad_clip
        if s < hp.warmup_steps:
            lr = hp.lr * (s + 1) / hp.warmup_steps
        else:
            lr = hp.min_lr + 0.5 * (hp.lr - hp.min_lr) * (1 + math.cos(math.pi * (s - hp.warmup_steps) / (S - hp.warmup_steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        expect(abs(hist[s]["loss"] - float(loss)) < 1e-12 and abs(hist[s]["lr"] - lr) < 1e-18
               and abs(hist[s]["grad_norm"] - norm) < 1e-12 * norm, f"step {s}: {hist[s]} vs {float(loss)}, {lr}, {norm}")
    expect(0 < n_clipped < S, f"clipping triggered on {n_clipped} of {S} steps; want some but not all")
    err = max(float(np.abs(final[n] - p[n].detach().float().numpy()).max()) for n in final)
    bounded("final weights, train() vs torch.optim loop (float64 runs, both rounded to float32)", err, 1e-7)


# ---------------------------------------------------------------------------------------------- model

def naive_forward(params, idx, cfg):
    """The GPT forward as scalar Python loops over plain floats: no torch, no numpy arithmetic."""
    P = {n: t.tolist() for n, t in params.items()}
    C, H = cfg.n_embd, cfg.n_head
    hs = C // H

    def ln(v, w, b):
        mu = sum(v) / len(v)
        var = sum((a - mu) ** 2 for a in v) / len(v)
        return [(a - mu) / math.sqrt(var + 1e-5) * w[i] + b[i] for i, a in enumerate(v)]

    def linear(v, W, b):  # v [n], W [n][m] (Conv1D layout)
        return [sum(v[i] * W[i][j] for i in range(len(v))) + b[j] for j in range(len(b))]

    def gelu(a):
        return 0.5 * a * (1 + math.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3)))

    out = []
    for seq in idx:
        T = len(seq)
        x = [[P["wte.weight"][tok][c] + P["wpe.weight"][t][c] for c in range(C)] for t, tok in enumerate(seq)]
        for layer in range(cfg.n_layer):
            pre = f"h.{layer}."
            qkv = [linear(ln(x[t], P[pre + "ln_1.weight"], P[pre + "ln_1.bias"]), P[pre + "attn.c_attn.weight"],
                          P[pre + "attn.c_attn.bias"]) for t in range(T)]
            y = [[0.0] * C for _ in range(T)]
            for h in range(H):
                for t in range(T):
                    q = qkv[t][h * hs:(h + 1) * hs]
                    scores = []
                    for u in range(t + 1):  # causal: keys 0..t only
                        k = qkv[u][C + h * hs:C + (h + 1) * hs]
                        scores.append(sum(q[d] * k[d] for d in range(hs)) / math.sqrt(hs))
                    mx = max(scores)
                    e = [math.exp(sc - mx) for sc in scores]
                    z = sum(e)
                    for u in range(t + 1):
                        v = qkv[u][2 * C + h * hs:2 * C + (h + 1) * hs]
                        for d in range(hs):
                            y[t][h * hs + d] += e[u] / z * v[d]
            for t in range(T):
                a = linear(y[t], P[pre + "attn.c_proj.weight"], P[pre + "attn.c_proj.bias"])
                x[t] = [x[t][c] + a[c] for c in range(C)]
                hid = [gelu(v) for v in linear(ln(x[t], P[pre + "ln_2.weight"], P[pre + "ln_2.bias"]),
                                               P[pre + "mlp.c_fc.weight"], P[pre + "mlp.c_fc.bias"])]
                m = linear(hid, P[pre + "mlp.c_proj.weight"], P[pre + "mlp.c_proj.bias"])
                x[t] = [x[t][c] + m[c] for c in range(C)]
        logits = []
        for t in range(T):
            f = ln(x[t], P["ln_f.weight"], P["ln_f.bias"])
            logits.append([sum(f[c] * P["wte.weight"][v][c] for c in range(C)) for v in range(cfg.vocab_size)])
        out.append(logits)
    return out


def naive_loss(logits, targets):
    total, n = 0.0, 0
    for lb, tb in zip(logits, targets):
        for row, tgt in zip(lb, tb):
            mx = max(row)
            total += mx + math.log(sum(math.exp(v - mx) for v in row)) - row[tgt]
            n += 1
    return total / n


@check
def forward_matches_naive_loops(tmp):
    p = tiny_params(TINY, 5)
    g = torch.Generator().manual_seed(6)
    idx = torch.randint(0, TINY.vocab_size, (2, 5), generator=g)
    tgt = torch.randint(0, TINY.vocab_size, (2, 5), generator=g)
    logits = ref.gpt_forward(p, idx, TINY)
    naive = torch.tensor(naive_forward(p, idx.tolist(), TINY), dtype=torch.float64)
    spread = float(logits.std())
    expect(spread > 0.1, f"logit spread {spread}: the model output is too flat to compare")
    bounded("max |logits - naive loop logits| (float64)", float((logits - naive).abs().max()), 1e-10)
    bounded("|loss - naive loss|", abs(float(ref.cross_entropy(logits, tgt)) - naive_loss(naive.tolist(), tgt.tolist())), 1e-10)


@check
def forward_is_causal_and_float32_close(tmp):
    p64 = tiny_params(TINY, 7)
    idx = torch.tensor([[1, 2, 3, 4, 5, 6]])
    a = ref.gpt_forward(p64, idx, TINY)
    idx2 = idx.clone()
    idx2[0, 4] = 9
    b = ref.gpt_forward(p64, idx2, TINY)
    expect(torch.equal(a[0, :4], b[0, :4]), "changing token 4 changed earlier logits")
    expect(float((a[0, 4:] - b[0, 4:]).abs().max()) > 1e-3, "changing token 4 did not change its own logits")
    p32 = {n: t.float() for n, t in p64.items()}
    bounded("max |logits float32 - float64|", float((ref.gpt_forward(p32, idx, TINY).double() - a).abs().max()), 1e-5)


@check
def gradients_pass_gradcheck(tmp):
    p = tiny_params(TINY, 8)
    names = list(p)
    g = torch.Generator().manual_seed(9)
    idx = torch.randint(0, TINY.vocab_size, (2, 5), generator=g)
    tgt = torch.randint(0, TINY.vocab_size, (2, 5), generator=g)

    def f(*tensors):
        return ref.gpt_loss(dict(zip(names, tensors)), idx, tgt, TINY)
    inputs = tuple(p[n].clone().requires_grad_(True) for n in names)
    n_el = sum(t.numel() for t in inputs)
    ok = torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-5, raise_exception=False)
    print(f"    gradcheck over {len(inputs)} tensors, {n_el} elements (float64, eps 1e-6, atol 1e-7, rtol 1e-5): "
          f"{'ok' if ok else 'FAILED'}")
    expect(ok, "torch.autograd.gradcheck failed")
    grads = torch.autograd.grad(f(*inputs), inputs)
    zero = [n for n, gr in zip(names, grads) if float(gr.abs().max()) == 0.0]
    expect(not zero, f"tensors with an all-zero gradient (not exercised): {zero}")


# ---------------------------------------------------------------------------------------------- loading

@check
def load_accepts_hf_prefix_and_buffers(tmp):
    init = ref.random_init(TINY, 10)
    plain, hf = os.path.join(tmp, "plain.safetensors"), os.path.join(tmp, "hf.safetensors")
    ref.write_safetensors(plain, init, TINY.metadata())
    with_buffers = {}
    for n, a in init.items():
        with_buffers["transformer." + n] = a
        if n.endswith("ln_1.weight"):
            mask = np.tril(np.ones((TINY.n_positions,) * 2, np.float32))[None, None]
            with_buffers["transformer." + n.replace("ln_1.weight", "attn.bias")] = mask
    ref.write_safetensors(hf, with_buffers, {"format": "pt"})
    cfg_a, pa = ref.load_model(plain)
    cfg_b, pb = ref.load_model(hf, n_head=TINY.n_head)
    expect(cfg_a == cfg_b == TINY, f"configs {cfg_a} {cfg_b}")
    expect(list(pa) == list(pb) and all(torch.equal(pa[n], pb[n]) for n in pa), "parameters differ")
    try:
        ref.load_model(hf)
        raise AssertionError("loaded a file without n_head and no n_head given")
    except ref.FormatError as e:
        expect("n_head" in str(e), f"message does not mention n_head: {e}")


def main() -> int:
    return run_checks(__doc__, "reference self-check", CHECKS)


if __name__ == "__main__":
    sys.exit(main())
