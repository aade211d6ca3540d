"""Checks one MoE block computed by meshtrain's C++ against moe_reference.py: `moe_block_check.py DIR`.

DIR holds a dump written by the C++ side (the format below); the script recomputes everything from the
inputs with the reference and exits 0 when all agree, else 1 with a line per disagreement (what, max abs
and rel diff, the bound). A dump that is incomplete or malformed is also exit 1, naming the file.
`moe_block_check.py --write-example DIR` writes a faithful dump in the same format (N=128, C=64, Hx=256,
E=4, top-2 random, F=0.75: 17 drops; aux_scale 10 so that the aux gradient is above the bound), for
testing a C++ reader or running the C++ block on seeded inputs.

Dump format (raw little-endian, row-major, no header; float32 unless .i32):
  config.json   {"N", "C", "H", "E", "K", "capacity_factor", "group_tokens", "second_policy": "all"|"random",
                 "seed", "step", "layer", "first_token", "aux_scale", "z_scale"}
  inputs        x.f32 [N,C], residual.f32 [N,C], dy.f32 [N,C], router.weight.f32 [C,E],
                experts.{e}.c_fc.weight.f32 [C,H], experts.{e}.c_fc.bias.f32 [H],
                experts.{e}.c_proj.weight.f32 [H,C], experts.{e}.c_proj.bias.f32 [C]
  C++ results   out.f32 [N,C]; dx.f32 [N,C]; grad.router.weight.f32 [C,E]; grad.experts.{e}.c_fc.weight.f32
                and the other three per expert (shapes as the weights); expert.i32 [N,K] (-1: a second choice
                the random policy did not keep); slot.i32 [N,K] (-1: dropped or not kept); gate.f32 [N,K]
                (0 where not admitted); result.json {"aux_sum", "z_sum", "choices", "dropped"}.
The gradients are those of L = sum(out * dy) + aux_scale * aux_sum + z_scale * z_sum. dx is dL/dx where x
is the block's input (the router's and the experts'); residual's gradient is dy and is not dumped.

Compared, with the reason for each bound (diffs are max |cpp - ref| over a tensor; "rel" divides by the
tensor's max |ref|, so one bound fits tensors of any scale):
  expert, slot, choices, dropped   exactly: decisions. A mismatch is printed with the row's top
                 probabilities and, for the random policy, 2*g2 and u, so that a genuine near tie
                 (|p1 - p2| ~ 1e-7, which float32 rounding may break either way) can be told from a bug.
  out            rel 1e-5: a float32 sum of ~Hx products per output; the float32 reference differs from the
                 same reference in float64 (same routing) by ~1e-7 rel on the test dumps, and two float32
                 implementations summing in other orders by a few times that. A wrong gate or a dropped
                 choice that is still added moves out by ~1e-2 rel.
  gate           abs 1e-5: gates are in [0, 1] and come from a softmax whose float32 error is ~1e-7.
  dx, gradients  rel 1e-4: a backward pass is two float32 products deep and sums over N rows (weights) or
                 over E*Hx (dx); float32 vs float64 reference is <= 6e-7 rel, allowed ~100x for summation
                 order. On a dump of N=128, C=64, Hx=256, E=4, top-2, F=1 (11 drops), aux_scale 0.3,
                 z_scale 0.05: a gate treated as a constant moves grad.router.weight by 1.0 rel, dropping
                 the z term by 4.9e-2, admitting the dropped choices moves out by 0.35; but dropping the aux
                 term moves it by only 3.6e-5, under the bound: the aux gradient (E f_i / group_tokens per
                 probability) is small beside sum(out * dy). So the script prints, for each dump, how far
                 grad.router.weight and dx move without the aux term and without the z term ("sensitivity");
                 a dump meant to check those gradients needs them above the bound (dy = 0, or aux_scale ~ 100).
  aux_sum, z_sum rel 1e-5: sums of N float32 terms (observed 3e-8 float32 vs float64).
The script prints the float32 vs float64 difference of the reference (same routing) beside each bound.
"""
from __future__ import annotations

import json
import math
import os
import sys
from typing import Dict, List, Tuple

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_reference as mref  # noqa: E402

TOL_OUT_REL, TOL_GATE_ABS, TOL_GRAD_REL, TOL_SUM_REL = 1e-5, 1e-5, 1e-4, 1e-5
CONFIG_KEYS = ("N", "C", "H", "E", "K", "capacity_factor", "group_tokens", "second_policy", "seed", "step",
               "layer", "first_token", "aux_scale", "z_scale")
RESULT_KEYS = ("aux_sum", "z_sum", "choices", "dropped")


class DumpError(ValueError):
    """A dump that is missing a file or has one of the wrong size; the message names it."""


def param_files(cfg: dict) -> List[Tuple[str, Tuple[int, ...]]]:
    return mref.block_shapes(cfg["C"], cfg["H"], cfg["E"])


def _read_json(path: str, keys) -> dict:
    try:
        with open(path) as f:
            obj = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise DumpError(f"{path}: cannot read JSON: {e}") from None
    missing = [k for k in keys if k not in obj]
    if missing:
        raise DumpError(f"{path}: missing keys {missing}")
    return obj


def _read_raw(d: str, name: str, shape: Tuple[int, ...], dtype: str) -> np.ndarray:
    path = os.path.join(d, name)
    if not os.path.exists(path):
        raise DumpError(f"{path} is missing")
    want = int(np.prod(shape, dtype=np.int64)) * 4
    size = os.path.getsize(path)
    if size != want:
        raise DumpError(f"{path}: {size} bytes, expected {want} for shape {list(shape)} of {dtype}")
    return np.fromfile(path, dtype=np.dtype("<f4") if dtype == "float32" else np.dtype("<i4")).reshape(shape)


def load_dump(d: str) -> Tuple[dict, Dict[str, np.ndarray], Dict[str, np.ndarray], dict]:
    """(config, inputs by name, C++ results by name, result.json)."""
    cfg = _read_json(os.path.join(d, "config.json"), CONFIG_KEYS)
    for k in ("N", "C", "H", "E", "K", "group_tokens", "seed", "step", "layer", "first_token"):
        if not isinstance(cfg[k], int) or isinstance(cfg[k], bool) or cfg[k] < 0:
            raise DumpError(f"config.json: {k} = {cfg[k]!r} is not a non-negative integer")
    N, C, K = cfg["N"], cfg["C"], cfg["K"]
    inputs = {n: _read_raw(d, n + ".f32", (N, C), "float32") for n in ("x", "residual", "dy")}
    results = {"out": _read_raw(d, "out.f32", (N, C), "float32"), "dx": _read_raw(d, "dx.f32", (N, C), "float32"),
               "expert": _read_raw(d, "expert.i32", (N, K), "int32"), "slot": _read_raw(d, "slot.i32", (N, K), "int32"),
               "gate": _read_raw(d, "gate.f32", (N, K), "float32")}
    for name, shape in param_files(cfg):
        inputs[name] = _read_raw(d, name + ".f32", shape, "float32")
        results["grad." + name] = _read_raw(d, "grad." + name + ".f32", shape, "float32")
    summary = _read_json(os.path.join(d, "result.json"), RESULT_KEYS)
    return cfg, inputs, results, summary


def write_dump(d: str, cfg: dict, inputs: Dict[str, np.ndarray], results: Dict[str, np.ndarray],
               summary: dict) -> None:
    """The inverse of load_dump (used by the self-check to play the C++ side)."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    with open(os.path.join(d, "result.json"), "w") as f:
        json.dump(summary, f)
    for name, a in list(inputs.items()) + list(results.items()):
        ext = ".i32" if name in ("expert", "slot") else ".f32"
        np.ascontiguousarray(a, dtype="<i4" if ext == ".i32" else "<f4").tofile(os.path.join(d, name + ext))


EXAMPLE_CONFIG = dict(N=128, C=64, H=256, E=4, K=2, capacity_factor=0.75, group_tokens=64, second_policy="random",
                      seed=1234, step=3, layer=1, first_token=128, aux_scale=10.0, z_scale=0.05)


def example_inputs(cfg: dict, seed: int) -> Dict[str, np.ndarray]:
    """Seeded inputs: x, residual, dy ~ N(0, 1); router N(0, 1) / sqrt(C) * 2.4; expert weights N(0, 0.2),
    biases N(0, 0.05) (peaked routing, GELU in its curved range)."""
    rng = np.random.default_rng(seed)
    N, C = cfg["N"], cfg["C"]
    inp = {n: rng.standard_normal((N, C)).astype(np.float32) for n in ("x", "residual", "dy")}
    for n, shape in param_files(cfg):
        std = 2.4 / math.sqrt(C) if n == "router.weight" else (0.2 if n.endswith("weight") else 0.05)
        inp[n] = (rng.standard_normal(shape) * std).astype(np.float32)
    return inp


def write_example(d: str, cfg: dict = EXAMPLE_CONFIG, seed: int = 0) -> dict:
    """A faithful dump: the reference plays the C++ side (decisions of its float32 run, numbers from its
    float64 run rounded to float32). Returns the float32 reference's results."""
    inp = example_inputs(cfg, seed)
    r32 = reference(cfg, inp, torch.float32)
    r = reference(cfg, inp, torch.float64, routing=r32["routing"])
    res = {"out": r["out"].numpy(), "dx": r["dx"].numpy(), "expert": r32["routing"].expert.numpy(),
           "slot": r32["routing"].slot.numpy(), "gate": r["gate"].numpy()}
    for n, _ in param_files(cfg):
        res["grad." + n] = r["grad." + n].numpy()
    write_dump(d, cfg, inp, res, {k: r[k] for k in RESULT_KEYS})
    return r32


def reference(cfg: dict, inputs: Dict[str, np.ndarray], dtype=torch.float32, routing=None) -> dict:
    """The reference block on the dump's inputs: forward, L, and autograd gradients of L."""
    t = {n: torch.tensor(a, dtype=dtype, requires_grad=(n not in ("residual", "dy")))
         for n, a in inputs.items()}
    r = mref.moe_block(t["x"], t["residual"], t, "", top_k=cfg["K"], capacity_factor=float(cfg["capacity_factor"]),
                       group_tokens=cfg["group_tokens"], second_policy=cfg["second_policy"], seed=cfg["seed"],
                       step=cfg["step"], layer=cfg["layer"], first_token=cfg["first_token"], routing=routing)
    L = (r.out * t["dy"]).sum() + cfg["aux_scale"] * r.aux_sum + cfg["z_scale"] * r.z_sum
    names = ["x"] + [n for n, _ in param_files(cfg)]
    # An expert that no token reached is not in the graph: its gradient is exactly zero.
    grads = torch.autograd.grad(L, [t[n] for n in names], allow_unused=True)
    grads = [torch.zeros_like(t[n]) if g is None else g for n, g in zip(names, grads)]
    out = {"out": r.out.detach(), "gate": r.gate.detach(), "dx": grads[0], "aux_sum": float(r.aux_sum),
           "z_sum": float(r.z_sum), "choices": r.choices, "dropped": r.dropped, "routing": r.routing,
           "probs": mref.ref.softmax_last(t["x"].detach() @ t["router.weight"].detach())}
    for n, g in zip(names[1:], grads[1:]):
        out["grad." + n] = g
    return out


def _diff(a: np.ndarray, b: torch.Tensor) -> Tuple[float, float]:
    b64 = b.detach().double().numpy()
    d = float(np.abs(a.astype(np.float64) - b64).max()) if b64.size else 0.0
    scale = float(np.abs(b64).max()) if b64.size else 0.0
    return d, d / scale if scale > 0 else (0.0 if d == 0 else math.inf)


def check_dump(d: str, verbose: bool = True) -> List[str]:
    """Returns the list of disagreements (empty: all agree). Raises DumpError for a malformed dump."""
    cfg, inputs, cpp, summary = load_dump(d)
    say = print if verbose else (lambda *a, **k: None)
    r32 = reference(cfg, inputs, torch.float32)
    r64 = reference(cfg, inputs, torch.float64, routing=r32["routing"])  # same decisions, float64 arithmetic
    fails = []
    say(f"MoE block N={cfg['N']} C={cfg['C']} H={cfg['H']} E={cfg['E']} K={cfg['K']} F={cfg['capacity_factor']} "
        f"group={cfg['group_tokens']} policy={cfg['second_policy']}: capacity {r32['routing'].capacity}, "
        f"{r32['choices']} choices, {r32['dropped']} dropped (reference)")

    # decisions
    rt = r32["routing"]
    want_expert, want_slot = rt.expert.numpy(), rt.slot.numpy()
    for what, got, want in (("expert", cpp["expert"], want_expert), ("slot", cpp["slot"], want_slot)):
        bad = np.argwhere(got != want)
        if bad.size:
            rows = sorted({int(i) for i in bad[:, 0]})
            fails.append(f"{what}.i32 differs at {len(bad)} entries, rows {rows[:10]}")
            for n in rows[:5]:
                p = r32["probs"][n]
                top = torch.sort(p, descending=True, stable=True)
                info = ", ".join(f"p[{int(i)}]={float(v):.9g}" for v, i in zip(top.values[:3], top.indices[:3]))
                if cfg["K"] == 2 and cfg["second_policy"] == "random":
                    g2 = float(mref.gates_of(p[None], rt.choice[n:n + 1])[0, 1])
                    u = mref.counter_uniform(cfg["seed"], mref.second_stream(cfg["step"], cfg["layer"]),
                                             cfg["first_token"] + n)
                    info += f"; 2*g2={2 * g2:.9g} u={u:.9g}"
                say(f"  row {n}: cpp {what} {got[n].tolist()} ref {want[n].tolist()} ({info})")
    for key in ("choices", "dropped"):
        if summary[key] != r32[key]:
            fails.append(f"result.json {key}: cpp {summary[key]} ref {r32[key]}")
    if fails:
        say("  (floats below are compared against the reference's own routing)")

    # floats: cpp vs float32 reference, with the float32 vs float64 reference difference as the rounding scale
    say(f"  {'tensor':34} {'max abs':>10} {'rel':>10} {'bound':>8}  {'f32 vs f64 ref (rel)':>20}")
    checks = [("out", TOL_OUT_REL, True), ("gate", TOL_GATE_ABS, False), ("dx", TOL_GRAD_REL, True)]
    checks += [("grad." + n, TOL_GRAD_REL, True) for n, _ in param_files(cfg)]
    for name, tol, relative in checks:
        d_abs, d_rel = _diff(cpp[name], r32[name])
        _, r_rel = _diff(r32[name].detach().numpy(), r64[name])
        err = d_rel if relative else d_abs
        ok = err <= tol
        say(f"  {name:34} {d_abs:>10.3e} {d_rel:>10.3e} {tol:>8.0e}{' rel' if relative else ' abs'} "
            f"{r_rel:>16.3e}  {'ok' if ok else 'MISMATCH'}")
        if not ok:
            fails.append(f"{name}: max abs diff {d_abs:.3e}, rel {d_rel:.3e} > {tol:g} "
                         f"({'rel' if relative else 'abs'})")
    for key in ("aux_sum", "z_sum"):
        got, want = float(summary[key]), r32[key]
        rel = abs(got - want) / max(abs(want), 1e-30)
        ok = rel <= TOL_SUM_REL
        say(f"  {key:34} {abs(got - want):>10.3e} {rel:>10.3e} {TOL_SUM_REL:>8.0e} rel "
            f"{abs(want - r64[key]) / max(abs(r64[key]), 1e-30):>16.3e}  {'ok' if ok else 'MISMATCH'}")
        if not ok:
            fails.append(f"result.json {key}: cpp {got!r} ref {want!r}, rel diff {rel:.3e} > {TOL_SUM_REL:g}")
    for key in ("aux_scale", "z_scale"):  # how visible each auxiliary gradient is in this dump (a note)
        if cfg[key] and verbose:
            r0 = reference({**cfg, key: 0.0}, inputs, torch.float32)
            moved = [_diff(r0[n].numpy(), r32[n])[1] for n in ("grad.router.weight", "dx")]
            say(f"  sensitivity: without the {key[:-6]} term grad.router.weight moves {moved[0]:.2e} rel, dx "
                f"{moved[1]:.2e} rel ({'visible' if min(moved) > TOL_GRAD_REL else 'NOT visible'} at the "
                f"{TOL_GRAD_REL:g} bound)")
    return fails


def main() -> int:
    args = sys.argv[1:]
    if len(args) not in (1, 2) or (len(args) == 2 and args[0] != "--write-example"):
        print(f"usage: {sys.argv[0]} DUMP_DIR          check a dump\n"
              f"       {sys.argv[0]} --write-example DIR  write a faithful dump of {EXAMPLE_CONFIG}", file=sys.stderr)
        return 1
    torch.set_num_threads(1)
    if len(args) == 2:
        r = write_example(args[1])
        print(f"wrote {args[1]}: {r['choices']} choices, {r['dropped']} dropped")
        return 0
    try:
        fails = check_dump(args[0])
    except (DumpError, ValueError) as e:
        print(f"moe_block_check: bad dump: {e}", file=sys.stderr)
        return 1
    if fails:
        print(f"moe_block_check: {len(fails)} disagreement(s):")
        for f in fails:
            print(f"  - {f}")
        return 1
    print("moe_block_check: all agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
