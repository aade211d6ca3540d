"""Bad MoE input: each case must exit 1 with a message naming the flag or tensor at fault, and write nothing
(no --metrics, no --save, no new or changed file in --checkpoint-dir).

Cases (the small MoE GPT of test_moe_parity.py: L=2, C=32, V=64, --moe-every 2, E=4, hidden 32):
  E not divisible by ep       --experts 3 --ep 2 --nproc 2                      names --experts and --ep
  ep not dividing dp          --experts 4 --ep 4 --nproc 2                      names --ep
  top-k > E                   --experts 1 --moe-top-k 2                         names --moe-top-k
  top-k not 1 or 2            --experts 4 --moe-top-k 3                         names --moe-top-k
  negative capacity factor    --capacity-factor -1                              names --capacity-factor
  MoE flag on the MLP         --model mlp with --moe-every / --experts / --ep, and with each routing flag
                              (--moe-top-k, --capacity-factor, --moe-aux-loss, --moe-second-policy)
                                                                                names that flag
  --init, expert count differs  a 4-expert file with --experts 8 / --experts 2  names --experts
  --init without the experts metadata (shapes say 4) and --experts 2         names --experts
  --resume, expert count differs  a 4-expert checkpoint resumed with --experts 2 / 8
                                                                                names --experts and experts=4
The resume cases also check that the checkpoint directory is byte-for-byte unchanged. A routing flag on the
MLP is caught when its value differs from the default (an explicit default value cannot be told from an
absent flag, so `--model mlp --capacity-factor 1.25` still passes silently).
"""
from __future__ import annotations

import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_reference as ref  # noqa: E402
import moe_reference as mr  # noqa: E402
from dp_common import remove_stale, run_group  # noqa: E402
from parity_harness import Checks, parse_args  # noqa: E402
from test_gpt_parity import markov_tokens  # noqa: E402

CFG = ref.GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32)
MOE = mr.MoEConfig(moe_every=2, experts=4, moe_top_k=2, expert_hidden=32)


def snapshot(d: str) -> dict:
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = fh.read()
    return out


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    checks = Checks("test_moe_bad_input")
    wd = args.workdir
    data = os.path.join(wd, "data.bin")
    ref.write_shard(data, markov_tokens(1001, CFG.vocab_size, 2))
    init = os.path.join(wd, "init.safetensors")
    tensors = mr.moe_random_init(CFG, MOE, 1)
    ref.write_safetensors(init, tensors, mr.moe_metadata(CFG, MOE))
    init_nometa = os.path.join(wd, "init_nometa.safetensors")
    meta = {k: v for k, v in mr.moe_metadata(CFG, MOE).items() if k not in ("experts", "expert_hidden")}
    ref.write_safetensors(init_nometa, tensors, meta)
    rng = np.random.RandomState(7)
    imgs, labels = os.path.join(wd, "images-idx3-ubyte"), os.path.join(wd, "labels-idx1-ubyte")
    with open(imgs, "wb") as f:
        f.write(struct.pack(">IIII", 2051, 40, 8, 8) + rng.randint(0, 256, (40, 64)).astype(np.uint8).tobytes())
    with open(labels, "wb") as f:
        f.write(struct.pack(">II", 2049, 40) + (np.arange(40) % 10).astype(np.uint8).tobytes())

    metrics, save, ck = (os.path.join(wd, "bad.jsonl"), os.path.join(wd, "bad.safetensors"),
                         os.path.join(wd, "bad_ckpt"))
    shape = ["--n-layer", 2, "--n-head", 2, "--n-embd", 32, "--vocab-size", 64, "--n-positions", 32]

    def gpt(*extra, init_path=None):
        src = ["--init", init_path] if init_path else shape
        return ["train", "--model", "gpt", *src, "--data", data, "--batch-size", 8, "--seq-len", 16, "--steps", 4,
                "--threads", 1, "--quiet", "--moe-every", 2, "--expert-hidden", 32, *extra]

    mlp = ["train", "--model", "mlp", "--data", imgs, "--labels", labels, "--hidden", 16, "--batch-size", 8,
           "--steps", 2, "--threads", 1, "--quiet"]

    def expect_error(label, cmd, names, ckpt_dir=None):
        before = snapshot(ckpt_dir) if ckpt_dir else None
        if not ckpt_dir:
            remove_stale(ck)
        remove_stale(metrics, save)
        full = [args.meshtrain, *cmd, "--metrics", metrics, "--save", save]
        if not ckpt_dir:
            full += ["--checkpoint-dir", ck, "--save-every", 1]
        r = run_group(full, 60, os.path.join(wd, "bad_" + label))
        text = (r.stderr + r.stdout).decode("utf-8", "replace")
        missing = [n for n in names if n not in text]
        written = [p for p in (metrics, save) if os.path.exists(p)]
        if ckpt_dir:
            if snapshot(ckpt_dir) != before:
                written.append(ckpt_dir + " (changed)")
        elif os.path.isdir(ck) and snapshot(ck):
            written.append(ck)
        print(f"  {label}: exit {r.returncode}, message {text.strip().splitlines()[-1] if text.strip() else ''!r}")
        checks.check(not r.timed_out and r.returncode == 1 and not missing and not written,
                     f"{label}: expected exit 1, a message naming {names} and nothing written; got "
                     f"{'timeout' if r.timed_out else f'exit {r.returncode}'}, missing {missing}, written {written}; "
                     f"output {text.strip()[-300:]!r}")

    expect_error("experts_not_divisible_by_ep", gpt("--experts", 3, "--ep", 2, "--nproc", 2), ["--experts", "--ep"])
    expect_error("ep_not_dividing_dp", gpt("--experts", 4, "--ep", 4, "--nproc", 2), ["--ep"])
    expect_error("top_k_more_than_experts", gpt("--experts", 1, "--moe-top-k", 2), ["--moe-top-k"])
    expect_error("top_k_3", gpt("--experts", 4, "--moe-top-k", 3), ["--moe-top-k"])
    expect_error("negative_capacity", gpt("--experts", 4, "--capacity-factor", -1), ["--capacity-factor"])
    for flag, value in (("--moe-every", 2), ("--experts", 4), ("--moe-top-k", 2), ("--capacity-factor", 2),
                        ("--moe-aux-loss", 0.1), ("--moe-second-policy", "random")):
        expect_error("mlp" + flag.replace("-", "_"), mlp + [flag, value], [flag])
    expect_error("mlp_ep", mlp + ["--ep", 2, "--nproc", 2], ["--ep"])
    expect_error("init_experts_8", gpt("--experts", 8, init_path=init), ["--experts"])
    expect_error("init_experts_2", gpt("--experts", 2, init_path=init), ["--experts"])
    expect_error("init_nometa_experts_2", gpt("--experts", 2, init_path=init_nometa), ["--experts"])

    # a 4-expert checkpoint, resumed with another expert count
    good = os.path.join(wd, "ckpt4")
    remove_stale(good)
    r = run_group([args.meshtrain, *gpt("--experts", 4, "--moe-top-k", 2, init_path=init), "--checkpoint-dir", good,
                   "--save-every", 1, "--stop-at-step", 2], 60, os.path.join(wd, "ckpt4"))
    if checks.check(r.returncode == 0 and snapshot(good), f"writing the 4-expert checkpoint failed: {r.describe()}"):
        for e in (2, 8):
            expect_error(f"resume_experts_{e}", gpt("--experts", e, "--moe-top-k", 2)
                         + ["--resume", good, "--checkpoint-dir", good, "--save-every", 1], ["--experts", "experts=4"],
                         ckpt_dir=good)
    checks.finish()


if __name__ == "__main__":
    main()
