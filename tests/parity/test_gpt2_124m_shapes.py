"""GPT-2 124M layout: meshtrain loads, trains one step on, saves and samples from a file laid out exactly
like the published Hugging Face gpt2 model.safetensors.

The file has the 160 published names and shapes (V=50257, Tmax=1024, L=12, H=12, C=768), the twelve
h.{i}.attn.bias causal-mask buffers [1, 1, 1024, 1024] F32, no "transformer." prefix and __metadata__
{"format": "pt"} only, so the configuration must come from the tensor shapes plus --n-head 12. Values
are seeded random (written in chunks: the file is ~550 MB). Checks:
  1. train without --n-head fails: non-zero exit and a message naming n_head (or the --n-head flag);
  2. train --n-head 12 for one step (B=1, T=16) exits 0; its step-0 loss equals the reference forward's
     loss on the same batch within rel 1e-4 (one float32 forward over 12 layers and a 50257-way
     softmax; observed reference float32 vs float64 ~1e-7). The init is scaled so that this loss is far
     from ln(V) and moves by much more than the tolerance when a block is dropped (asserted), so a
     model that ignores its blocks or its embeddings cannot pass;
  3. the saved file is float32 and has every parameter with its shape (attn.bias buffers may be left
     out), all finite, and each tensor moved as one AdamW step must move it: with t=1,
     |dp| = lr |g/(|g|+eps) + wd p| <= lr (1 + wd |p|) everywhere, and >= lr/2 somewhere in each tensor;
  4. sample --n-head 12 from the saved file exits 0 and prints something. The wte rows of tokens other
     than printable ASCII bytes (32..126) are drawn 10x smaller, so the tied output layer makes greedy
     decoding pick printable bytes: what meshtrain prints for a token id >= 256 in its byte-level
     sampler is not specified, and an empty line must not pass as output.
The big files are deleted at the end, pass or fail.
"""
from __future__ import annotations

import gc
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_reference as ref  # noqa: E402
from parity_harness import Checks, parse_args, read_metrics, rel_diff, run  # noqa: E402

CFG = ref.GPTConfig(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_positions=1024)
B, T = 1, 16
LR, WD = 1e-4, 0.1
TOL_LOSS_REL = 1e-4
SEED = 124
# Std of the random values by name ending; LayerNorm weights are 1 + N(0, 0.1), everything else 0.02.
STD = {"wte.weight": 0.1, "attn.c_attn.weight": 0.05, "mlp.c_fc.weight": 0.05}
CHUNK = 1 << 22  # elements per generated chunk (16 MB of float32)


def specs():
    """(name, dtype, shape) of the published file, in its (sorted) order."""
    out = [(n, "F32", s) for n, s in ref.param_shapes(CFG)]
    out += [(f"h.{i}.attn.bias", "F32", (1, 1, CFG.n_positions, CFG.n_positions)) for i in range(CFG.n_layer)]
    return sorted(out)


def fill(name, shape):
    n = int(np.prod(shape))
    if ref.is_buffer_name(name):  # the causal mask, as in the published file
        rows = np.arange(CFG.n_positions)
        for r0 in range(0, CFG.n_positions, 256):
            yield (rows[None, :] <= rows[r0:r0 + 256, None]).astype(np.float32)
        return
    rng = np.random.default_rng([SEED, sum(map(ord, name)), len(name)])
    is_ln = ".ln_" in name or name.startswith("ln_f.")
    base = 1.0 if is_ln and name.endswith(".weight") else 0.0
    std = 0.1 if is_ln else next((v for k, v in STD.items() if name.endswith(k)), 0.02)
    if name == "wte.weight":  # rows of tokens other than printable ASCII bytes are 10x smaller (see below)
        rows, C = shape
        for r0 in range(0, rows, 4096):
            r = np.arange(r0, min(rows, r0 + 4096))
            scale = np.where((r >= 32) & (r < 127), std, 0.1 * std).astype(np.float32)[:, None]
            yield scale * rng.standard_normal((r.size, C), dtype=np.float32)
        return
    for i in range(0, n, CHUNK):
        yield (base + std * rng.standard_normal(min(CHUNK, n - i), dtype=np.float32)).astype(np.float32)


def make_batch_and_losses(path, data_path):
    """Writes the shard and returns the reference step-0 loss of the full model, without its last block,
    and without any block. The shard starts with ids from the whole vocabulary (including 50256 and ids
    above 32767, which a uint16 read as int16 would turn negative), then continues with the model's own
    greedy choices: with those targets the loss depends on the model's exact predictions, where random
    targets would give ~ln V + var(logits)/2 whatever the blocks compute."""
    cfg, p = ref.load_model(path, n_head=CFG.n_head, mmap=True)
    assert cfg == CFG, cfg
    head = [50256, 40000, 33333, 7, 72, 105]
    new, _ = ref.greedy_generate(p, cfg, head, B * T + 1 - len(head))
    tokens = np.array(head + new + list(range(100, 147)), dtype=np.int64)
    ref.write_shard(data_path, tokens)
    x, y = (torch.from_numpy(a) for a in ref.get_batch(tokens, 0, B, T))
    with torch.no_grad():
        losses = [float(ref.cross_entropy(ref.gpt_forward(p, x, cfg, n_layer=n), y)) for n in (None, 11, 0)]
    print(f"shard starts {tokens[:B * T + 1].tolist()}")
    del p
    gc.collect()
    return losses


def check_saved(checks, init_path, save_path, n_metrics_lr):
    try:
        saved, meta = ref.read_safetensors(save_path, mmap=True)
        entries, _, _ = ref.read_safetensors_header(save_path)
    except (ref.FormatError, OSError, ValueError) as e:
        checks.check(False, f"--save file is not valid safetensors: {e}")
        return
    init, _ = ref.read_safetensors(init_path, mmap=True)
    params = dict(ref.param_shapes(CFG))
    missing = [n for n in params if n not in saved]
    extra = [n for n in saved if n not in params and not (ref.is_buffer_name(n) and n in init)]
    checks.check(not missing, f"saved file lacks {len(missing)} tensors: {missing[:5]}")
    checks.check(not extra, f"saved file has unexpected tensors: {extra[:5]}")
    bad_shapes = []
    for n, a in saved.items():
        want = params.get(n, init[n].shape if n in init else None)
        if want is not None and (tuple(a.shape) != tuple(want) or entries[n]["dtype"] != "F32"):
            bad_shapes.append(f"{n}: {entries[n]['dtype']} {list(a.shape)}, expected F32 {list(want)}")
    checks.check(not bad_shapes, f"saved file has {len(bad_shapes)} tensors of the wrong dtype or shape: "
                 + "; ".join(bad_shapes[:5]))
    print(f"saved file: {len(saved)} tensors ({sum(ref.is_buffer_name(n) for n in saved)} attn.bias buffers), "
          f"metadata {meta}")
    lr = n_metrics_lr
    worst = []
    for n in params:
        if n not in saved or tuple(saved[n].shape) != params[n]:
            continue
        a, b = saved[n].reshape(-1), init[n].reshape(-1)
        max_move, max_over, finite = 0.0, -math.inf, True
        for i in range(0, a.size, CHUNK):
            sa, sb = a[i:i + CHUNK].astype(np.float64), b[i:i + CHUNK].astype(np.float64)
            finite &= bool(np.isfinite(sa).all())
            move = np.abs(sa - sb)
            wd = WD if len(params[n]) >= 2 else 0.0
            bound = lr * (1.0 + wd * np.abs(sb)) * (1 + 1e-3) + 1e-7 * np.abs(sb)  # + float32 rounding of p
            max_move = max(max_move, float(move.max()))
            max_over = max(max_over, float((move - bound).max()))
        worst.append((max_move, n))
        if not checks.check(finite, f"saved {n} has non-finite values"):
            continue
        checks.check(max_over <= 0, f"saved {n}: moved by more than one AdamW step allows "
                     f"(by {max_over:.2e} over lr (1 + wd |p|) with lr {lr:g})")
        checks.check(max_move >= 0.5 * lr, f"saved {n}: max change {max_move:.2e} < lr/2 = {lr / 2:g}: "
                     f"not updated by the step")
    if worst:
        print(f"one-step changes: smallest max|dp| {min(worst)[0]:.3e} ({min(worst)[1]}), "
              f"largest {max(worst)[0]:.3e} ({max(worst)[1]}), lr {lr:g}")


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    torch.set_num_threads(1)
    checks = Checks("test_gpt2_124m_shapes")
    wd = args.workdir
    init_path, data_path = os.path.join(wd, "gpt2_124m_layout.safetensors"), os.path.join(wd, "tiny.bin")
    save_path, metrics_path = os.path.join(wd, "gpt2_124m_out.safetensors"), os.path.join(wd, "metrics.jsonl")
    nohead_save = os.path.join(wd, "nohead_out.safetensors")
    big = [init_path, save_path, nohead_save]
    try:
        for p in big + [metrics_path]:
            if os.path.exists(p):
                os.remove(p)
        ref.write_safetensors_streaming(init_path, specs(), fill, {"format": "pt"})
        entries, meta, _ = ref.read_safetensors_header(init_path)
        print(f"wrote {init_path}: {len(entries)} tensors, {os.path.getsize(init_path) / 1e6:.0f} MB, metadata {meta}")
        checks.check(len(entries) == 160 and meta == {"format": "pt"}, f"test setup: {len(entries)} tensors, {meta}")
        full, minus_one, no_blocks = make_batch_and_losses(init_path, data_path)
        tol = TOL_LOSS_REL * full
        print(f"reference step-0 loss {full:.6f} (without the last block {minus_one:.6f}, without blocks "
              f"{no_blocks:.6f}, ln V {math.log(CFG.vocab_size):.6f}); tolerance {tol:.2e}")
        for what, other in (("dropping the last block", minus_one), ("dropping every block", no_blocks),
                            ("uniform logits (ln V)", math.log(CFG.vocab_size))):
            checks.check(abs(full - other) > 20 * tol, f"test setup: {what} changes the loss by only "
                         f"{abs(full - other):.2e}, not > 20x the tolerance {tol:.2e}")

        common = ["--model", "gpt", "--init", init_path, "--data", data_path, "--batch-size", B, "--seq-len", T,
                  "--steps", 1, "--lr", repr(LR), "--min-lr", repr(LR / 10), "--warmup-steps", 1, "--beta1", 0.9,
                  "--beta2", 0.95, "--eps", 1e-8, "--weight-decay", WD, "--grad-clip", 1.0, "--seed", 0,
                  "--threads", 1]
        # 1. no --n-head: must fail and say why
        r = run([args.meshtrain, "train", *common, "--metrics", os.path.join(wd, "nohead.jsonl"),
                 "--save", nohead_save], timeout=600, log_prefix=os.path.join(wd, "train_no_nhead"))
        msg = (r.stderr + r.stdout).decode("utf-8", "replace")
        checks.check(not r.timed_out and r.returncode not in (0, None),
                     f"train without --n-head on a file without n_head metadata must fail; {r.describe()}")
        checks.check("n_head" in msg or "n-head" in msg, f"train without --n-head: the message does not mention "
                     f"n_head: {msg.strip()[-300:]!r}")
        print(f"  message: {msg.strip()[-200:]!r}")

        # 2. one step with --n-head 12
        r = run([args.meshtrain, "train", *common, "--n-head", 12, "--metrics", metrics_path, "--save", save_path],
                timeout=900, log_prefix=os.path.join(wd, "train"))
        if checks.check(r.ok, f"train --n-head 12 failed: {r.describe()}"):
            mt = read_metrics(metrics_path, 1, checks)
            if mt is not None:
                rd = rel_diff(mt[0]["loss"], full)
                print(f"step-0 loss: meshtrain {mt[0]['loss']:.6f}, reference {full:.6f}, rel diff {rd:.2e} "
                      f"(tolerance {TOL_LOSS_REL:g})")
                checks.check(rd <= TOL_LOSS_REL, f"step-0 loss {mt[0]['loss']!r} vs reference {full!r}: rel diff "
                             f"{rd:.2e} > {TOL_LOSS_REL:g}")
                checks.check(rel_diff(mt[0]["lr"], LR) <= 1e-7, f"step-0 lr {mt[0]['lr']!r}, expected {LR!r}")
            # 3. the saved file
            if checks.check(os.path.exists(save_path), f"--save file {save_path} was not written"):
                check_saved(checks, init_path, save_path, LR)
                # 4. sampling from it
                r = run([args.meshtrain, "sample", "--init", save_path, "--n-head", 12, "--prompt", "Hi",
                         "--max-new-tokens", 4, "--temperature", 0], timeout=600, log_prefix=os.path.join(wd, "sample"))
                if checks.check(r.ok, f"sample from the saved 124M-layout file failed: {r.describe()}"):
                    print(f"  sample printed {r.stdout!r}")
                    checks.check(len(r.stdout.strip()) > 0, "sample printed nothing on stdout")
    finally:
        for p in big:
            if os.path.exists(p):
                os.remove(p)
    checks.finish()


if __name__ == "__main__":
    main()
