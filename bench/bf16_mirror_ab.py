"""A/B of `--precision bf16` training between two meshtrain binaries that must agree bit for bit: the same
problem and layout run by both, then every step's loss and grad_norm (as written in --metrics, full repr) and
the --save file's bytes compared. Used to show that the bf16 weight mirror (weights rounded once per step
after the update instead of once per product) and the bf16-kept activations change no result.

    python3 bench/bf16_mirror_ab.py --a /work/main/build/meshtrain --b build/meshtrain --workdir /tmp/ab

Problems: tests/parity's dense GPT (L=4, H=2, C=32, V=64, 12 steps), its MoE GPT (E=4 top-2, ep), and its MLP.
"""
from __future__ import annotations

import argparse
import filecmp
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "parity"))
import dp_common as dpc  # noqa: E402
import gpt_reference as ref  # noqa: E402
import test_async as ta  # noqa: E402
import test_moe_layouts as ml  # noqa: E402

BF16 = ["--precision", "bf16"]
DENSE = [("single", []), ("single_mb3", ["--micro-batch-size", 3]), ("recompute", ["--recompute"]),
         ("dp2_z0", ["--nproc", 2]), ("dp2_z1", ["--nproc", 2, "--zero", 1]),
         ("dp2_z2", ["--nproc", 2, "--zero", 2]), ("dp2_z3", ["--nproc", 2, "--zero", 3]),
         ("dp2_z3_mb3", ["--nproc", 2, "--zero", 3, "--micro-batch-size", 3]),
         ("tp2", ["--nproc", 2, "--tp", 2]), ("tp2_sp", ["--nproc", 2, "--tp", 2, "--sequence-parallel"]),
         ("tp2_sp_z3", ["--nproc", 4, "--tp", 2, "--sequence-parallel", "--zero", 3]),
         ("pp2_1f1b", ["--nproc", 2, "--pp", 2, "--schedule", "1f1b", "--micro-batch-size", 6]),
         ("pp2_interleaved", ["--nproc", 2, "--pp", 2, "--schedule", "interleaved", "--virtual-stages", 2,
                              "--micro-batch-size", 6]),
         ("pp2_1f1b_z3", ["--nproc", 4, "--pp", 2, "--zero", 3, "--micro-batch-size", 3]),
         ("dp2_topk_all", ["--nproc", 2, "--compress", "topk:1"]),
         ("local_sgd", ["--nproc", 2, "--local-sgd", 2]),
         ("dp2_tp2_pp2_z1", ["--nproc", 8, "--tp", 2, "--pp", 2, "--zero", 1, "--micro-batch-size", 3]),
         ("dp3_z3", ["--nproc", 3, "--zero", 3]), ("dp4_z2", ["--nproc", 4, "--zero", 2]),
         ("dp2_z3_recompute", ["--nproc", 2, "--zero", 3, "--recompute"]),
         ("pp2_interleaved_z3", ["--nproc", 4, "--pp", 2, "--schedule", "interleaved", "--virtual-stages", 2,
                                 "--zero", 3, "--micro-batch-size", 3])]
MOE = [("moe_single", []), ("moe_dp2_ep2", ["--nproc", 2, "--ep", 2]),
       ("moe_dp2_ep2_z3", ["--nproc", 2, "--ep", 2, "--zero", 3, "--micro-batch-size", 2]),
       ("moe_tp2_sp", ["--nproc", 2, "--tp", 2, "--sequence-parallel"])]
MLP = [("mlp_single", []), ("mlp_dp2_z3", ["--nproc", 2, "--zero", 3])]


def steps_of(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [(r["step"], repr(r.get("loss")), repr(r.get("grad_norm"))) for r in rows if "loss" in r]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--only", default="", help="comma-separated tags")
    ap.add_argument("--precision", default="bf16", help="fp32: check that the float32 path did not move either")
    args = ap.parse_args()
    global BF16
    BF16 = ["--precision", args.precision]
    os.makedirs(args.workdir, exist_ok=True)
    only = set(filter(None, args.only.split(",")))

    dense_init, dense_data = os.path.join(args.workdir, "init.safetensors"), os.path.join(args.workdir, "data.bin")
    from test_gpt_parity import INIT_STD, markov_tokens
    cfg = ref.GPTConfig(n_layer=4, n_head=2, n_embd=32, vocab_size=64, n_positions=32)
    ref.write_safetensors(dense_init, ref.random_init(cfg, 31, std_by_suffix=INIT_STD), cfg.metadata())
    ref.write_shard(dense_data, markov_tokens(dpc.N_TOKENS, cfg.vocab_size, 32))
    moe_dir = os.path.join(args.workdir, "moe")
    os.makedirs(moe_dir, exist_ok=True)
    margs = argparse.Namespace(workdir=moe_dir, meshtrain=args.a)
    mr = ml.Runner(margs, dpc.Tally("ab"))
    idx = ta.write_idx(args.workdir)

    def dense_cmd(binary, extra):
        return dpc.train_cmd(binary, dense_init, dense_data, 12, BF16 + list(extra))

    def moe_cmd(binary, extra):
        return [binary, "train", "--model", "gpt", "--init", mr.init, "--data", mr.data, "--batch-size", ml.B,
                "--seq-len", ml.T, "--steps", ml.STEPS, "--lr", "3e-3", "--seed", ml.SEED_RUN, "--threads", 1,
                "--quiet", "--moe-every", 2, "--experts", ml.E, "--moe-top-k", 2, "--expert-hidden", ml.HX,
                "--capacity-factor", "1.0", "--moe-group-windows", ml.G, "--moe-second-policy", "random",
                "--moe-aux-loss", "0.5", "--moe-z-loss", "0.01", *BF16, *extra]

    def mlp_cmd(binary, extra):
        return [binary, "train", "--model", "mlp", "--data", idx["images"], "--labels", idx["labels"], "--hidden",
                "32", "--batch-size", ta.MLP_B, "--steps", 12, "--optimizer", "adamw", "--lr", "0.01", "--seed", 5,
                "--threads", 1, "--quiet", *BF16, *extra]

    bad = 0
    cases = [(t, e, dense_cmd) for t, e in DENSE] + [(t, e, moe_cmd) for t, e in MOE] + \
            [(t, e, mlp_cmd) for t, e in MLP]
    print(f"{'layout':<18}{'steps':>6}  {'loss+grad_norm':<16}{'--save bytes':<14}{'s (a, b)':>12}")
    for tag, extra, make in cases:
        if only and tag not in only:
            continue
        res, secs = {}, []
        for side, binary in (("a", args.a), ("b", args.b)):
            m = os.path.join(args.workdir, f"{tag}.{side}.jsonl")
            w = os.path.join(args.workdir, f"{tag}.{side}.safetensors")
            for p in (m, w):
                if os.path.exists(p):
                    os.remove(p)
            cmd = [str(c) for c in make(binary, extra) + ["--metrics", m, "--save", w]]
            t0 = time.monotonic()
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            secs.append(time.monotonic() - t0)
            if r.returncode != 0:
                print(f"{tag}: {side} failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
                res = None
                break
            res[side] = (steps_of(m), w)
        if res is None:
            bad += 1
            continue
        same_steps = res["a"][0] == res["b"][0] and len(res["a"][0]) > 0
        same_w = filecmp.cmp(res["a"][1], res["b"][1], shallow=False)
        bad += not (same_steps and same_w)
        print(f"{tag:<18}{len(res['a'][0]):>6}  {'identical' if same_steps else 'DIFFER':<16}"
              f"{'identical' if same_w else 'DIFFER':<14}{secs[0]:>6.1f}{secs[1]:>6.1f}", flush=True)
        if not same_steps:
            for x, y in zip(res["a"][0], res["b"][0]):
                if x != y:
                    print(f"   first difference: a {x} b {y}")
                    break
    print("all identical" if bad == 0 else f"{bad} layouts differ or failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
