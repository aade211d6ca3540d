"""The Python module `meshtrain` (python/): train, weights to NumPy and PyTorch, forward, errors, simulate.

The module is imported from the build directory (<dir of the meshtrain binary>/python), no pip. Checked:
  1. train(config) takes the CLI's flags: its metrics rows equal, field for field, those of the `meshtrain train`
     binary run with the same flags, and its saved weights are the same bytes; with nproc 2 (ranks forked from
     this Python process) the losses equal the single-process run's to float32 rounding.
  2. Parity: the trained weights, loaded through load_weights into PyTorch ({k: torch.from_numpy(v)}) and run
     through the independent reference GPT-2 (gpt_reference.py), give the logits of meshtrain's own forward
     (meshtrain.forward) to float32 tolerance; load_weights equals the reference's own safetensors reader.
  3. Errors are Python exceptions with the CLI's message: a bad flag value, an unknown key, a missing data file
     (in-process and inside forked ranks), a bad path for load_weights, an out-of-vocabulary token.
  4. save_weights -> `meshtrain train --init` and `meshtrain sample --init`: changed weights (passed as torch
     tensors, Hugging Face style with "transformer." and lm_head) are what the CLI reads back.
  5. simulate returns objects whose numbers are those `meshtrain simulate` prints and the textbook bubble.
"""
from __future__ import annotations

import math
import os
import re
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_reference as ref  # noqa: E402
from parity_harness import Checks, parse_args, run  # noqa: E402

CFG = ref.GPTConfig(n_layer=2, n_head=4, n_embd=64, vocab_size=256, n_positions=64)
TEXT = ("Parallel training splits one step over many ranks; the numbers must not notice. "
        "Each rank reads its share of the batch, computes gradients, and the sum is the same sum. ") * 20
STEPS = 5


def train_flags(wd: str, init: str, data: str) -> dict:
    return dict(model="gpt", init=init, data=data, batch_size=4, seq_len=32, steps=STEPS, lr=3e-3,
                warmup_steps=1, seed=7, threads=1, quiet=True)


def as_argv(flags: dict) -> list:
    out = []
    for k, v in flags.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            out.append(flag)
        elif v is not False and v is not None:
            out.append(f"{flag}={v}")
        # False / None: left out, as train() does
    return out


def cli_error(r) -> str:
    """The message the CLI printed after 'meshtrain: error: ' (or the last 'meshtrain: ' line)."""
    lines = r.stderr.decode("utf-8", "replace").splitlines()
    for line in reversed(lines):
        if line.startswith("meshtrain: error: "):
            return line[len("meshtrain: error: "):]
    for line in reversed(lines):
        if line.startswith("meshtrain: "):
            return line[len("meshtrain: "):]
    return "\n".join(lines)


def raises(fn, exc_type):
    """(exception or None) of fn(); an exception of another type is returned too, for the message."""
    try:
        fn()
    except exc_type as e:  # noqa: PERF203
        return e
    except Exception as e:  # noqa: BLE001
        return e
    return None


def check_train(mt, args, checks: Checks, wd: str, init: str, data: str) -> str:
    flags = train_flags(wd, init, data)
    saved_py, saved_cli = os.path.join(wd, "py.safetensors"), os.path.join(wd, "cli.safetensors")
    metrics_cli = os.path.join(wd, "cli.metrics.jsonl")
    rows = mt.train(dict(flags, save=saved_py))
    r = run([args.meshtrain, "train"] + as_argv(dict(flags, save=saved_cli, metrics=metrics_cli)), 300)
    if not r.ok:
        checks.fatal(f"the CLI run failed: {r.describe()}")
    cli_rows = ref_rows(metrics_cli)
    checks.check(isinstance(rows, list) and all(isinstance(x, dict) for x in rows), "train() returns a list of dicts")
    checks.check([x.get("step") for x in rows] == list(range(STEPS)), f"train() rows are steps 0..{STEPS - 1}: "
                 f"{[x.get('step') for x in rows]}")
    for a, b in zip(rows, cli_rows):
        same = {k: a.get(k) == b.get(k) for k in b if not k.endswith("_s")}  # "_s": timings and rates
        checks.check(all(same.values()) and set(a) == set(b),
                     f"step {b.get('step')}: train() row and CLI row differ in {[k for k, v in same.items() if not v]}"
                     f" (keys {sorted(set(a) ^ set(b))} in one only)")
    with open(saved_py, "rb") as f1, open(saved_cli, "rb") as f2:
        checks.check(f1.read() == f2.read(), "train(save=...) wrote other bytes than the CLI with the same flags")
    checks.check(rows[-1]["loss"] < rows[0]["loss"], f"the loss goes down: {rows[0]['loss']} -> {rows[-1]['loss']}")

    # Two ranks forked from this process after the in-process run above (its OpenMP threads started): data
    # parallelism, the same math.
    rows2 = mt.train(dict(flags, nproc=2))
    checks.check(len(rows2) == STEPS, f"nproc 2: {len(rows2)} rows")
    for a, b in zip(rows, rows2):
        checks.check(abs(a["loss"] - b["loss"]) <= 1e-5 * abs(a["loss"]),
                     f"nproc 2 step {a['step']}: loss {b['loss']!r} vs single process {a['loss']!r}")
    # Two Python threads train at once (nproc 2 each): the runs take turns (one job per process) and both succeed.
    import threading
    results = [None, None]

    def worker(i: int) -> None:
        try:
            results[i] = mt.train(dict(flags, nproc=2, steps=2))
        except Exception as e:  # noqa: BLE001
            results[i] = e

    before = os.fstat(2)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    checks.check(all(isinstance(x, list) and [y["loss"] for y in x] == [y["loss"] for y in rows2[:2]] for x in results),
                 f"two threads training at once: {[x if not isinstance(x, list) else len(x) for x in results]}")
    after = os.fstat(2)  # stderr is passed through a pipe while training: it must be the original again
    checks.check((after.st_dev, after.st_ino) == (before.st_dev, before.st_ino), "fd 2 is not stderr after train()")
    print(f"train(): {STEPS} steps, loss {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f}; CLI rows and weights equal")
    return saved_py


def ref_rows(path: str) -> list:
    import json
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def check_parity(mt, checks: Checks, saved: str) -> None:
    w = mt.load_weights(saved)
    expected, meta = ref.read_safetensors(saved)  # the reference's own reader
    names = [n for n, _ in ref.param_shapes(CFG)]
    checks.check(sorted(w) == sorted(names), f"load_weights keys {sorted(w)} are not GPT-2's {sorted(names)}")
    for n in names:
        a = w.get(n)
        checks.check(isinstance(a, np.ndarray) and a.dtype == np.float32 and np.array_equal(a, expected[n]),
                     f"load_weights[{n}] differs from the file (reference reader)")
    checks.check(mt.read_metadata(saved) == meta, f"read_metadata {mt.read_metadata(saved)} vs {meta}")
    params = {k: torch.from_numpy(v) for k, v in w.items()}
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, CFG.vocab_size, size=(3, 40))
    want = ref.gpt_forward(params, torch.from_numpy(tokens), CFG).numpy()
    got = mt.forward(saved, tokens)
    checks.check(got.shape == (3, 40, CFG.vocab_size) and got.dtype == np.float32, f"forward shape {got.shape}")
    err = float(np.abs(got - want).max())
    scale = float(np.abs(want).max())
    checks.check(err <= 2e-5 * max(1.0, scale), f"logits: max |meshtrain - torch| = {err:.3g} (scale {scale:.3g})")
    one = mt.forward(saved, tokens[1])
    checks.check(one.shape == (40, CFG.vocab_size) and float(np.abs(one - got[1]).max()) <= 1e-5 * max(1, scale),
                 "forward of a 1-D sequence equals its row of the batch")
    # The comparison depends on the whole model: one block fewer in the reference moves the logits far.
    short = ref.gpt_forward(params, torch.from_numpy(tokens), CFG, n_layer=1).numpy()
    checks.check(float(np.abs(short - want).max()) > 100 * max(err, 1e-7), "test setup: the last block matters")
    print(f"parity: logits of 3 x 40 tokens, max |meshtrain.forward - torch reference| = {err:.3g} (scale {scale:.3g})")


def check_errors(mt, args, checks: Checks, wd: str, init: str, data: str) -> None:
    flags = train_flags(wd, init, data)
    cases = [
        ("bad flag value", dict(flags, steps="abc"), mt.InputError),
        ("unknown key", dict(flags, no_such_flag=1), mt.InputError),
        ("missing data file", dict(flags, data=os.path.join(wd, "missing.bin")), mt.InputError),
        ("bad layout", dict(flags, nproc=2, tp=3), mt.InputError),
    ]
    for what, bad, exc_type in cases:
        e = raises(lambda: mt.train(bad), mt.Error)
        r = run([args.meshtrain, "train"] + as_argv(bad), 120)
        expect = cli_error(r)
        checks.check(r.returncode == 1, f"{what}: the CLI exits {r.returncode}, not 1")
        checks.check(type(e) is exc_type and str(e) in expect and str(e) != "",
                     f"{what}: train() raised {type(e).__name__}: {e!s} ; the CLI printed: {expect!r}")
        print(f"{what}: {type(e).__name__}: {e}")
    # The same missing file read inside forked ranks: the job's failure line becomes the exception.
    missing = os.path.join(wd, "missing.bin")
    e = raises(lambda: mt.train(dict(flags, data=missing, nproc=2)), mt.Error)
    r = run([args.meshtrain, "train"] + as_argv(dict(flags, data=missing, nproc=2)), 120)
    # Either rank may fail first: the rank number is not compared.
    same = re.sub(r"rank \d+", "rank R", str(e)) == re.sub(r"rank \d+", "rank R", cli_error(r))
    checks.check(isinstance(e, mt.Error) and missing in str(e) and same,
                 f"nproc 2, missing data: train() raised {type(e).__name__}: {e!s} ; the CLI printed {cli_error(r)!r}")
    print(f"nproc 2, missing data: {type(e).__name__}: {e}")
    e = raises(lambda: mt.load_weights(missing), mt.InputError)
    checks.check(isinstance(e, mt.InputError) and missing in str(e), f"load_weights(missing): {type(e).__name__}: {e}")
    e = raises(lambda: mt.forward(init, np.array([1, 2, 256])), mt.InputError)
    checks.check(isinstance(e, mt.InputError) and "256" in str(e) and "position 2" in str(e),
                 f"forward(token 256): {type(e).__name__}: {e}")
    e = raises(lambda: mt.simulate("nope", 2, 2), mt.InputError)
    checks.check(isinstance(e, mt.InputError) and "nope" in str(e), f"simulate('nope'): {type(e).__name__}: {e}")


def check_round_trip(mt, args, checks: Checks, wd: str, saved: str, data: str) -> None:
    w = mt.load_weights(saved)
    meta = mt.read_metadata(saved)
    # Changed in torch, written Hugging Face style: "transformer." names, lm_head tied to wte, torch tensors.
    changed = {"transformer." + k: torch.from_numpy(v) * 1.5 if k.endswith("c_fc.weight") else torch.from_numpy(v)
               for k, v in w.items()}
    changed["lm_head.weight"] = changed["transformer.wte.weight"]
    out = os.path.join(wd, "changed.safetensors")
    mt.save_weights(out, changed, meta)
    back, back_meta = ref.read_safetensors(out)
    checks.check(back_meta == meta and all(np.array_equal(back[k], changed[k].numpy()) for k in changed),
                 "save_weights: the file (reference reader) holds other tensors or metadata than given")
    plain = os.path.join(wd, "changed_plain.safetensors")
    ref.write_safetensors(plain, {k[len("transformer."):]: v.numpy() for k, v in changed.items()
                                  if k.startswith("transformer.")}, meta)
    # The CLI reads it: training from it equals training from the same tensors written by the reference.
    flags = dict(train_flags(wd, out, data), steps=2)
    m1, m2, m0 = (os.path.join(wd, f"rt{i}.jsonl") for i in (1, 2, 0))
    r1 = run([args.meshtrain, "train"] + as_argv(dict(flags, metrics=m1)), 120)
    r2 = run([args.meshtrain, "train"] + as_argv(dict(flags, init=plain, metrics=m2)), 120)
    r0 = run([args.meshtrain, "train"] + as_argv(dict(flags, init=saved, metrics=m0)), 120)
    if not (r1.ok and r2.ok and r0.ok):
        checks.fatal(f"--init of saved weights failed: {r1.describe() if not r1.ok else r2.describe()}")
    l1, l2, l0 = ([x["loss"] for x in ref_rows(m)] for m in (m1, m2, m0))
    checks.check(l1 == l2, f"train --init save_weights' file: losses {l1} vs the reference-written file {l2}")
    checks.check(l1 != l0, "test setup: the change made in torch changes the run")
    s1 = run([args.meshtrain, "sample", "--init", out, "--prompt", "Each rank", "--max-new-tokens", "20",
              "--temperature", "0"], 60)
    s2 = run([args.meshtrain, "sample", "--init", plain, "--prompt", "Each rank", "--max-new-tokens", "20",
              "--temperature", "0"], 60)
    checks.check(s1.ok and s1.stdout == s2.stdout, f"sample --init: {s1.stdout!r} vs {s2.stdout!r}")
    print(f"round trip: train --init losses {l1}")


def check_simulate(mt, args, checks: Checks) -> None:
    s = mt.simulate("gpipe", 4, 8)
    checks.check(abs(s.bubble_fraction - 3 / 11) < 1e-12 and abs(s.ideal_bubble - 3 / 11) < 1e-12,
                 f"gpipe p=4 m=8: bubble {s.bubble_fraction}, ideal {s.ideal_bubble}; (p-1)/(m+p-1) = {3 / 11}")
    checks.check(len(s.boxes) == 4 and all(len(b) == 16 for b in s.boxes), "boxes: 4 ranks of 2 m = 16")
    checks.check(sum(1 for b in s.boxes[0] if b.kind == "forward") == 8 and
                 all(b.end > b.start for rank in s.boxes for b in rank), "boxes: 8 forwards, positive lengths")
    for args_, kw in ((("interleaved", 4, 8), dict(virtual_stages=2, comm_cost=0.1)), (("1f1b", 3, 5), {})):
        s = mt.simulate(*args_, **kw)
        cmd = [args.meshtrain, "simulate", "--schedule", args_[0], "--stages", str(args_[1]), "--micro-batches",
               str(args_[2])] + sum(([f"--{k.replace('_', '-')}", str(v)] for k, v in kw.items()), [])
        r = run(cmd, 60)
        out = r.stdout.decode()
        mk = re.search(r"makespan (\S+)", out)
        bub = re.search(r"bubble fraction ([0-9.]+)%", out)
        checks.check(r.ok and mk and bub and float(mk.group(1)) == float(f"{s.makespan:.4g}") and
                     f"{100 * s.bubble_fraction:.1f}" == bub.group(1),
                     f"simulate{args_} {kw}: {s!r} vs the CLI's {out!r}")
        peaks = [int(x) for x in re.findall(r"peak in-flight activations (\d+)", out)]
        checks.check(peaks == list(s.peak_in_flight), f"peak_in_flight {s.peak_in_flight} vs the CLI's {peaks}")
    print(f"simulate: {mt.simulate('gpipe', 4, 8)!r}")


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    torch.set_num_threads(1)
    os.environ.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    checks = Checks("test_python_bindings")
    sys.path.insert(0, os.path.join(os.path.dirname(args.meshtrain), "python"))
    try:
        import meshtrain as mt
    except ImportError as e:
        checks.fatal(f"cannot import meshtrain from {sys.path[0]}: {e}; build the module (needs pybind11-dev: "
                     "bash scripts/setup.sh test, then cmake and cmake --build build)")
    wd = args.workdir
    init, data = os.path.join(wd, "init.safetensors"), os.path.join(wd, "text.bin")
    ref.write_safetensors(init, ref.random_init(CFG, 5), CFG.metadata())
    ref.write_shard(data, np.frombuffer(TEXT.encode("ascii"), np.uint8))
    saved = check_train(mt, args, checks, wd, init, data)
    check_parity(mt, checks, saved)
    check_errors(mt, args, checks, wd, init, data)
    check_round_trip(mt, args, checks, wd, saved, data)
    check_simulate(mt, args, checks)
    checks.finish()


if __name__ == "__main__":
    main()
