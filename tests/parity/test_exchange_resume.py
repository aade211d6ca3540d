"""Checkpoints keep the gradient exchange's per-rank state (train/exchange_state.h): a run stopped and resumed
continues the unbroken one, for DGC (error-feedback residual and velocity), 1-bit Adam (worker and server
errors) and Crossbow's SMA (--learners: each learner's weights and AdamW moments, z_prev), on dp_common.py's tiny
GPT at dp 2.

Per method: the unbroken run (10 steps) against `--checkpoint-dir D --save-every 5 --stop-at-step 5` then
`--resume D` for the rest. Checks:
  1. the resumed rows 5..9 equal the unbroken run's (loss and grad_norm at rel 1e-6; measured: identical) and
     the final weights agree at 1e-6; for SMA both bit for bit (rows' loss and grad_norm, and the saved central
     model);
  2. control: the same checkpoint with "exchange_state" removed from its state.json resumes with the state at
     zero (the lead warns so), and its rows differ from the unbroken run's (loss by > 1e-6 somewhere): the state
     is what makes check 1 pass.
Methods: --compress topk:0.01 --dgc with SGD (momentum 0.9 in the exchange, lr 0.05); --optimizer onebit-adam
--freeze-step 3 (the errors of steps 3 and 4 are in the checkpoint); --learners 2 --sma-momentum 0.5 with
--micro-batch-size 3 (k = 4 learners; the control restarts the learners from the central model and says so);
DGC with AdamW, --compress topk:0.05 --dgc --freeze-step 3 (each rank's momentum and accumulated update of steps 3
and 4; the control restarts both at zero).
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dp_common as dc  # noqa: E402
import gpt_reference as ref  # noqa: E402
from parity_harness import Checks, parse_args, read_metrics, rel_diff  # noqa: E402

STEPS, STOP = 10, 5
SGD_HP = ref.HParams(lr=0.05, min_lr=0.005, warmup_steps=3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
                     grad_clip=2.5)
METHODS = {"dgc": (["--nproc", 2, "--compress", "topk:0.01", "--dgc", "--optimizer", "sgd", "--momentum", 0.9], SGD_HP),
           "onebit": (["--nproc", 2, "--optimizer", "onebit-adam", "--freeze-step", 3], dc.HP),
           "sma": (["--nproc", 2, "--learners", 2, "--sma-momentum", 0.5, "--micro-batch-size", 3], dc.HP),
           "dgc_adam": (["--nproc", 2, "--compress", "topk:0.05", "--dgc", "--freeze-step", 3], dc.HP)}
EXACT = {"sma"}  # resumed = unbroken bit for bit
FALLBACK = {"sma": "restart from the checkpoint's central model"}  # the control's warning (default: zeros)


def go(args, checks, tag, flags, hp, steps):
    r = dc.run_group(dc.train_cmd(args.meshtrain, args.init, args.data, steps, flags, hp=hp), 120,
                     os.path.join(args.workdir, tag))
    checks.check(r.returncode == 0, dc.failure_text(r, tag))
    return r


def main():
    args = parse_args(__doc__)
    checks = Checks("exchange state in checkpoints")
    args.init, args.data, _ = dc.write_inputs(args.workdir)
    for name, (flags, hp) in METHODS.items():
        w = lambda f: os.path.join(args.workdir, f"{name}_{f}")  # noqa: E731
        dc.remove_stale(w("full.jsonl"), w("part1.jsonl"), w("part2.jsonl"), w("ctl.jsonl"), w("ckpt"),
                        w("full.safetensors"), w("part2.safetensors"), w("ctl.safetensors"))
        go(args, checks, f"{name}_full", flags + ["--metrics", w("full.jsonl"), "--save", w("full.safetensors")], hp,
           STEPS)
        go(args, checks, f"{name}_part1", flags + ["--checkpoint-dir", w("ckpt"), "--save-every", STOP,
                                                     "--stop-at-step", STOP, "--metrics", w("part1.jsonl")], hp, STEPS)
        ckpt = os.path.join(w("ckpt"), f"step_{STOP:08d}")
        st_path = os.path.join(ckpt, "state.json")
        if not checks.check(os.path.isfile(st_path), f"{name}: no checkpoint {ckpt}"):
            continue
        st = json.load(open(st_path))
        print(f"{name}: exchange_state {st.get('exchange_state')}")
        checks.check(st.get("exchange_state", {}).get("ranks") == 2, f"{name}: state.json has no exchange_state "
                     f"for 2 ranks: {st.get('exchange_state')}")
        r = go(args, checks, f"{name}_part2", flags + ["--checkpoint-dir", w("ckpt"), "--resume", w("ckpt"),
                                                       "--metrics", w("part2.jsonl"), "--save", w("part2.safetensors")],
               hp, STEPS)
        full = read_metrics(w("full.jsonl"), STEPS, checks, label=f"{name} full")
        part2 = dc.read_metrics_range(w("part2.jsonl"), STOP, STEPS, checks, f"{name} resumed")
        if full and part2:
            worst = max(max(rel_diff(a["loss"], b["loss"]), rel_diff(a["grad_norm"], b["grad_norm"]))
                        for a, b in zip(full[STOP:], part2))
            print(f"{name}: resumed vs unbroken, steps {STOP}..{STEPS - 1}: worst rel {worst:.2e}")
            checks.check(worst <= 1e-6, f"{name}: resumed rows differ from the unbroken run: worst rel {worst:.2e}")
            if name in EXACT:
                same = all(a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"] for a, b in zip(full[STOP:], part2))
                checks.check(same, f"{name}: resumed rows are not bit-equal to the unbroken run's")
            a, b = dc.load_saved(w("full.safetensors"), checks, name), dc.load_saved(w("part2.safetensors"), checks, name)
            if a and b:
                dw = max(float(np.abs(a[k].astype(np.float64) - b[k]).max()) for k in a)
                print(f"{name}: final weights resumed vs unbroken: worst abs {dw:.2e}")
                checks.check(dw <= 1e-6, f"{name}: final weights differ by {dw:.2e}")
                if name in EXACT:
                    with open(w("full.safetensors"), "rb") as fa, open(w("part2.safetensors"), "rb") as fb:
                        checks.check(fa.read() == fb.read(), f"{name}: saved weights are not byte-equal")
        # control: the same checkpoint without its exchange state
        del st["exchange_state"]
        json.dump(st, open(st_path, "w"))
        r = go(args, checks, f"{name}_ctl", flags + ["--checkpoint-dir", w("ckpt"), "--resume", ckpt,
                                                     "--metrics", w("ctl.jsonl"), "--save", w("ctl.safetensors")],
               hp, STEPS)
        text = (r.stderr + r.stdout).decode("utf-8", "replace")
        want = FALLBACK.get(name, "starts at zero")
        checks.check(want in text, f"{name}: the control resume should warn ({want!r}); output: "
                     f"{text.strip()[:300]!r}")
        ctl = dc.read_metrics_range(w("ctl.jsonl"), STOP, STEPS, checks, f"{name} control")
        if full and ctl:
            d = max(rel_diff(a["loss"], b["loss"]) for a, b in zip(full[STOP:], ctl))
            print(f"{name}: control (state at zero) vs unbroken: worst loss rel {d:.2e}")
            checks.check(d > 1e-6, f"{name}: resuming without the exchange state should differ (worst rel {d:.2e})")
    checks.finish()


if __name__ == "__main__":
    main()
