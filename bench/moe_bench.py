#!/usr/bin/env python3
"""Mixture of experts: throughput with expert parallelism and quality against the dense GPT of equal active FLOPs.

Models (byte-level vocabulary, 256 tokens; every other block an MoE block: --moe-every 2):
  dense  GPT, MLP hidden 4C.
  moe    the same GPT with E=8 experts per MoE block, top-2 (GShard), expert hidden 2C, capacity factor 1.25,
         load-balancing loss 0.01. Two experts of hidden 2C per token cost the dense MLP's 16 C^2 multiply-adds,
         so the two models differ in active FLOPs per token only by the router (2 C E per MoE block); the MoE
         model holds E/2 = 4x the dense MLP parameters in its MoE blocks. Both models' FLOPs per token and
         parameter counts are printed (parameters computed here and checked against meshtrain's --summary).

1. Throughput: width 256, 4 layers, 4 heads, context 128, global batch 16 x 128 tokens, --threads 1 per process:
     dense nproc 1, dense nproc 2 (dp=2: the plain data-parallel peer), moe ep=1 on 1 process, moe ep=2 on 2
     processes (dp=2: each rank stores, computes and updates its 4 experts; their gradients need no
     reduction at dp = ep), moe ep=1 on 2 processes (dp=2, every rank computes all experts on its own tokens),
     moe ep=2 on 2 processes with ZeRO 1 (the dense tensors' optimizer state split over the 2 ranks too).
   Rank 0's parameter bytes (--summary) are printed beside each run.
   The data is uniformly random bytes (bench_util.write_shard), so the routing stays near even (the dropped
   fraction is printed); on real text an untrained router sends most bytes to a few experts.
   tokens/s of a run = global tokens / median step_time_s of rank 0 over the steps after --warmup; the
   configurations run in turn --repeats times (rotated order) and each figure is the median over repeats with
   the min-max spread; the ep=2 / ep=1 ratio is taken per repeat (runs close in time) and reported the same way.
   The all-to-all share is the MoE layers' all_to_all_s (the metrics sum it over ranks: divided by the ranks)
   over step_time_s, mean over the measured steps. Goal of the issue: moe ep=2 on 2 processes >= 1.7x moe ep=1
   on 1 process.
2. Quality: width 128, 4 layers, 4 heads, context 64, batch 16 x 64, AdamW lr 1e-3 (warm-up 20 steps, cosine to
   1e-4), --quality-steps steps on tinyshakespeare (first 90% train, last 10% validation, `meshtrain prepare
   --text`), evaluation every 50 steps on 16 validation batches; --seeds seeds per model. The final validation
   loss (cross-entropy, nats per byte) of dense and moe, mean over the seeds (the same seeds for both); goal:
   moe lower.

Writes --out (default bench/results/moe): table.md (also printed), results.json (every number, the commands,
the per-run metrics summaries and the host). Usage:
  /usr/bin/python3 bench/moe_bench.py --meshtrain build/meshtrain [--repeats 3] [--quick]
Run it under `flock /tmp/meshtrain-bench.lock` on a shared machine (the quality part does not depend on timing).
About 5 minutes on 2 idle cores (an estimate; here, shared: throughput 2.6 min, quality 7.7 min). --table-only rewrites
table.md from results.json.
"""
import argparse
import ctypes
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench_util import prepare_text, write_shard

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

V = 256  # byte-level vocabulary
E, TOPK, MOE_EVERY, CAPACITY, AUX = 8, 2, 2, 1.25, 0.01
SPEED = dict(n_layer=4, n_head=4, n_embd=256, T=128, B=16)
QUALITY = dict(n_layer=4, n_head=4, n_embd=128, T=64, B=16)


# ---------------------------------------------------------------- model arithmetic


def model_flags(shape, moe):
    f = ["--model", "gpt", "--vocab-size", str(V), "--n-layer", str(shape["n_layer"]), "--n-head",
         str(shape["n_head"]), "--n-embd", str(shape["n_embd"]), "--n-positions", str(shape["T"]),
         "--seq-len", str(shape["T"]), "--batch-size", str(shape["B"])]
    if moe:
        f += ["--moe-every", str(MOE_EVERY), "--experts", str(E), "--moe-top-k", str(TOPK), "--expert-hidden",
              str(2 * shape["n_embd"]), "--capacity-factor", str(CAPACITY), "--moe-aux-loss", str(AUX)]
    return f


def is_moe_block(l, moe):
    return moe and (l + 1) % MOE_EVERY == 0  # blocks K-1, 2K-1, ...


def arithmetic(shape, moe):
    """Parameters (total and active per token) and forward matmul FLOPs per token of the GPT (tied LM head)."""
    C, L, T = shape["n_embd"], shape["n_layer"], shape["T"]
    Hx = 2 * C
    mlp_dense = C * 4 * C + 4 * C + 4 * C * C + C
    expert = C * Hx + Hx + Hx * C + C
    params = V * C + T * C + 2 * C  # wte (tied with the LM head), wpe, ln_f
    active = params
    fwd = 2 * C * V  # LM head
    for l in range(L):
        block = 4 * C + C * 3 * C + 3 * C + C * C + C  # ln_1, ln_2, c_attn, attn.c_proj
        params += block
        active += block
        fwd += 2 * C * 3 * C + 2 * C * C + 2 * 2 * T * C  # projections, QK^T and AV over a full window of T
        if is_moe_block(l, moe):
            params += C * E + E * expert
            active += C * E + TOPK * expert
            fwd += 2 * C * E + TOPK * (2 * C * Hx + 2 * Hx * C)
        else:
            params += mlp_dense
            active += mlp_dense
            fwd += 2 * C * 4 * C + 2 * 4 * C * C
    return dict(params=params, active_params=active, fwd_flops_per_token=fwd, train_flops_per_token=3 * fwd)


# ---------------------------------------------------------------- runs


def host_info(meshtrain):
    cpu, flags = "?", set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and cpu == "?":
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = [f for f in ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
                       "avx512_vnni", "amx_tile") if f in flags]
    procs = subprocess.run(["ps", "-eo", "ni=,stat=,comm="], capture_output=True, text=True).stdout.splitlines()
    running = [p.split() for p in procs if len(p.split()) >= 3 and p.split()[1].startswith("R")]
    def git(*a):
        r = subprocess.run(["git", "-C", ROOT] + list(a), capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None
    try:  # the kernel OpenBLAS picks here is the one meshtrain's runs (same environment) pick
        blas = ctypes.CDLL("libopenblas.so.0")
        blas.openblas_get_config.restype = ctypes.c_char_p
        blas.openblas_get_corename.restype = ctypes.c_char_p
        openblas = f"{blas.openblas_get_config().decode()}; kernel {blas.openblas_get_corename().decode()}"
    except (OSError, AttributeError):
        openblas = "(libopenblas.so.0 not loadable)"
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            autogroup = f.read().strip()
    except OSError:
        autogroup = "unknown"
    return dict(cpu=cpu, openblas=openblas, autogroup=autogroup, isa=isa, kernel=platform.release(), cores=os.cpu_count(),
                openblas_coretype=os.environ.get("OPENBLAS_CORETYPE", "(unset: OpenBLAS picks)"),
                loadavg=os.getloadavg(), running_at_start=[" ".join(p) for p in running],
                meshtrain=meshtrain,
                meshtrain_mtime=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(os.stat(meshtrain).st_mtime)),
                git_head=git("rev-parse", "HEAD"), git_status=git("status", "--short", "--untracked-files=no"))


def run(args, work, tag, flags, env):
    metrics = os.path.join(work, f"metrics_{tag}.jsonl")
    summary = os.path.join(work, f"summary_{tag}.json")
    for p in (metrics, summary):
        if os.path.exists(p):
            os.remove(p)
    cmd = [args.meshtrain, "train"] + flags + ["--threads", "1", "--quiet", "--metrics", metrics, "--summary",
                                               summary]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, env=env, timeout=args.timeout, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)  # the run's processes, workers included
    rows = [json.loads(l) for l in open(metrics)]
    return cmd, rows, json.load(open(summary)), wall, cpu


def speed_configs():
    d1 = model_flags(SPEED, False)
    m1 = model_flags(SPEED, True)
    return [("dense, 1 process", "dense_1", d1 + ["--nproc", "1"], 1),
            ("dense, 2 processes (dp=2)", "dense_2", d1 + ["--nproc", "2"], 2),
            ("moe ep=1, 1 process", "moe_ep1_1", m1 + ["--nproc", "1"], 1),
            ("moe ep=2, 2 processes (dp=2)", "moe_ep2_2", m1 + ["--nproc", "2", "--ep", "2"], 2),
            ("moe ep=1, 2 processes (dp=2)", "moe_ep1_2", m1 + ["--nproc", "2", "--ep", "1"], 2),
            ("moe ep=2, 2 processes, ZeRO 1", "moe_ep2_2_z1", m1 + ["--nproc", "2", "--ep", "2", "--zero", "1"], 2)]


def speed_one(args, work, tag, flags, nproc, env):
    cmd, rows, summary, wall, cpu = run(args, work, tag, flags + ["--steps", str(args.steps), "--data",
                                                                  os.path.join(work, "random.bin")], env)
    meas = rows[args.warmup:]
    times = sorted(r["step_time_s"] for r in meas)
    med = times[len(times) // 2]
    tokens = SPEED["B"] * SPEED["T"]
    a2a = [sum(m["all_to_all_s"] for m in r.get("moe", [])) / nproc / r["step_time_s"] for r in meas]
    a2a_bytes = [sum(m["all_to_all_bytes"] for m in r.get("moe", [])) / nproc for r in meas]
    return dict(command=cmd, wall_s=wall, cores_used=cpu / wall, step_times=[r["step_time_s"] for r in rows], median_step_s=med,
                tokens_per_s=tokens / med, a2a_share=statistics.mean(a2a) if a2a else 0.0,
                a2a_bytes_per_rank=statistics.mean(a2a_bytes) if a2a_bytes else 0.0,
                dropped=statistics.mean(r.get("moe_dropped", 0.0) for r in meas), params=summary.get("params"),
                comm_bytes=statistics.mean(r.get("comm_bytes", 0) for r in meas),
                param_bytes_rank0=summary["ranks"][0]["param_bytes"])


def spread(xs):
    return dict(median=statistics.median(xs), min=min(xs), max=max(xs), all=xs)


def run_speed(args, work, env):
    cfgs = speed_configs()
    per = {tag: [] for _, tag, _, _ in cfgs}
    for rep in range(args.repeats):
        order = cfgs[rep % len(cfgs):] + cfgs[:rep % len(cfgs)]
        for label, tag, flags, nproc in order:
            r = speed_one(args, work, tag, flags, nproc, env)
            per[tag].append(r)
            print(f"  repeat {rep + 1}: {label:<32} {r['tokens_per_s']:8.0f} tokens/s  "
                  f"(median step {r['median_step_s'] * 1e3:.0f} ms, all-to-all {100 * r['a2a_share']:.1f}%, "
                  f"{r['cores_used']:.2f} cores used)", flush=True)
    out = {}
    for label, tag, flags, nproc in cfgs:
        runs = per[tag]
        out[tag] = dict(label=label, nproc=nproc, tokens_per_s=spread([r["tokens_per_s"] for r in runs]),
                        a2a_share=spread([r["a2a_share"] for r in runs]),
                        cores_used=spread([r["cores_used"] for r in runs]),
                        a2a_bytes_per_rank=runs[0]["a2a_bytes_per_rank"], comm_bytes=runs[0]["comm_bytes"],
                        param_bytes_rank0=runs[0].get("param_bytes_rank0"),
                        dropped=statistics.mean(r["dropped"] for r in runs), params=runs[0]["params"], runs=runs)
    ratio = lambda a, b: spread([x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(per[a], per[b])])
    # Tokens per CPU-second of the run's processes, 2 processes against 1, times 2: the ratio on 2 dedicated
    # cores if each process kept its CPU efficiency (a projection, not a measurement; see table_md).
    proj = lambda a, b: spread([2 * (x["tokens_per_s"] / x["cores_used"]) / (y["tokens_per_s"] / y["cores_used"])
                                for x, y in zip(per[a], per[b])])
    out["projected"] = {"moe_ep2_2 / moe_ep1_1": proj("moe_ep2_2", "moe_ep1_1"),
                        "moe_ep2_2_z1 / moe_ep1_1": proj("moe_ep2_2_z1", "moe_ep1_1"),
                        "dense_2 / dense_1": proj("dense_2", "dense_1")}
    out["ratios"] = {"moe_ep2_2 / moe_ep1_1": ratio("moe_ep2_2", "moe_ep1_1"),
                     "moe_ep2_2_z1 / moe_ep1_1": ratio("moe_ep2_2_z1", "moe_ep1_1"),
                     "dense_2 / dense_1": ratio("dense_2", "dense_1"),
                     "moe_ep1_2 / moe_ep1_1": ratio("moe_ep1_2", "moe_ep1_1"),
                     "moe_ep1_1 / dense_1": ratio("moe_ep1_1", "dense_1"),
                     "moe_ep2_2 / dense_2": ratio("moe_ep2_2", "dense_2")}
    return out


def trace_breakdown(path, warmup):
    """Rank 0's mean time per step (ms) by part, from a --trace file: steps end at each 'optimizer step' event;
    steps before `warmup` are left out. Block times include what runs inside them (the MoE blocks' all-to-all)."""
    with open(path) as f:
        t = json.load(f)
    ev = [e for e in (t["traceEvents"] if isinstance(t, dict) else t) if e.get("ph") == "X" and e.get("pid") == 0]
    opt = sorted(e["ts"] + e["dur"] for e in ev if e["name"] == "optimizer step" and e.get("tid") == 0)
    start = opt[warmup - 1] if warmup >= 1 else float("-inf")
    steps = len(opt) - warmup
    parts = {}
    add = lambda k, v: parts.__setitem__(k, parts.get(k, 0.0) + v / 1e3 / steps)
    for e in ev:
        if e["ts"] < start:
            continue
        n, d = e["name"], e["dur"]
        if e.get("tid") != 0:
            add("comm track: " + n.split()[0], d)
        elif n in ("forward wte", "backward wte"):  # encloses the whole pass (blocks, ln_f, loss)
            add(n.split()[0] + " pass, total", d)
            add(n.split()[0] + " pass, outside the blocks", d)
        elif n.startswith(("forward h.", "backward h.")):
            l = int(n.split("h.")[1].split()[0])
            add(n.split()[0] + " pass, " + ("moe" if is_moe_block(l, True) else "dense") + " blocks", d)
            add(n.split()[0] + " pass, outside the blocks", -d)
        elif n == "optimizer step":
            add("optimizer step", d)
    step = [b - a for a, b in zip(opt[warmup - 1:], opt[warmup:])] if warmup >= 1 else []
    if step:
        parts["step (end to end)"] = sum(step) / len(step) / 1e3
        parts["step - passes - optimizer (exposed comm, waits)"] = parts["step (end to end)"] - sum(
            parts.get(k, 0.0) for k in ("forward pass, total", "backward pass, total", "optimizer step"))
    order = ["forward pass, total", "forward pass, dense blocks", "forward pass, moe blocks",
             "forward pass, outside the blocks", "backward pass, total", "backward pass, dense blocks",
             "backward pass, moe blocks", "backward pass, outside the blocks", "optimizer step"]
    return {k: parts[k] for k in order + sorted(k for k in parts if k not in order) if k in parts}


def run_breakdown(args, work, env):
    """One traced run of moe ep=1 on 1 process and of moe ep=2 on 2 processes: where rank 0's step goes."""
    out = {}
    for label, tag, flags, nproc in speed_configs():
        if tag not in ("moe_ep1_1", "moe_ep2_2"):
            continue
        trace = os.path.join(work, f"trace_{tag}.json")
        r = speed_one(args, work, "trace_" + tag, flags + ["--trace", trace], nproc, env)
        out[tag] = dict(label=label, median_step_ms=r["median_step_s"] * 1e3, tokens_per_s=r["tokens_per_s"],
                        parts_ms=trace_breakdown(trace, args.warmup))
        print(f"  {label}: {', '.join(f'{k} {v:.0f}' for k, v in out[tag]['parts_ms'].items())} ms/step "
              f"(median step {out[tag]['median_step_ms']:.0f} ms)", flush=True)
    return out


def run_quality(args, work, env):
    out = {}
    base = ["--data", os.path.join(work, "train.bin"), "--val-data", os.path.join(work, "val.bin"),
            "--eval-batches", "16", "--eval-every", str(args.eval_every), "--steps", str(args.quality_steps),
            "--optimizer", "adamw", "--lr", "1e-3", "--warmup-steps", "20", "--nproc", "1"]
    for moe in (False, True):
        name = "moe" if moe else "dense"
        runs = []
        for s in range(args.seeds):
            seed = 1337 + s
            cmd, rows, summary, wall, _ = run(args, work, f"q_{name}_{seed}",
                                           model_flags(QUALITY, moe) + base + ["--seed", str(seed)], env)
            curve = [dict(step=r["step"] + 1, val_loss=r["val_loss"]) for r in rows if "val_loss" in r]
            final = rows[-1].get("val_loss")
            runs.append(dict(seed=seed, command=cmd, wall_s=wall, final_val_loss=final,
                             final_train_loss=rows[-1]["loss"], curve=curve, params=summary.get("params"),
                             dropped=statistics.mean(r.get("moe_dropped", 0.0) for r in rows)))
            print(f"  {name} seed {seed}: final val loss {final:.4f} (train {rows[-1]['loss']:.4f}), {wall:.0f} s",
                  flush=True)
        out[name] = dict(runs=runs, final_val_loss_mean=statistics.mean(r["final_val_loss"] for r in runs))
    return out


# ---------------------------------------------------------------- report


def conditions(part):
    h = part["host"]
    return (f"Measured {h['started']} to {h['ended']} UTC at nice {part['nice']}, load average {h['loadavg'][0]:.1f} "
            f"at the start and {h['loadavg_end'][0]:.1f} at the end ({h['cores']} cores); "
            f"{part['total_s'] / 60:.1f} min" + (" (--quick: a smoke test, not a measurement)." if part["quick"] else "."))


def table_md(parts):
    speed, quality = parts.get("speed"), parts.get("quality")
    host = (speed or quality)["host"]
    out = ["# Mixture of experts: expert-parallel throughput and quality at equal active FLOPs", ""]
    out += [f"Host: {host['cpu']}, {host['cores']} cores, Linux {host['kernel']}, ISA {' '.join(host['isa'])}; "
            f"{host['openblas']} (OPENBLAS_CORETYPE={host['openblas_coretype']}). meshtrain built "
            f"{host['meshtrain_mtime']} at {(host['git_head'] or '?')[:10]}"
            f"{' (dirty: ' + host['git_status'].replace(chr(10), ', ') + ')' if host['git_status'] else ''}.",
            "",
            "Shared machine: other helpers' builds and tests (at nice 5-19) were running during the measurements, "
            "on 2 cores, and the kernel's autogroup scheduling (sched_autogroup_enabled = "
            f"{host.get('autogroup', '1 on the recording host')}) shares the CPU between sessions whatever their "
            "nice value: absolute figures are depressed and noisy (see the cores each run obtained); ratios "
            "compare runs taken close together.", ""]
    for name, shape in (("throughput", SPEED), ("quality", QUALITY)):
        d, m = arithmetic(shape, False), arithmetic(shape, True)
        out += [f"Models of the {name} part (C={shape['n_embd']}, L={shape['n_layer']}, heads={shape['n_head']}, "
                f"context {shape['T']}, V={V}; MoE: E={E}, top-{TOPK}, every {MOE_EVERY}nd block, expert hidden "
                f"{2 * shape['n_embd']}, capacity {CAPACITY}):", "",
                "| model | parameters | active parameters / token | training FLOPs / token (fwd+bwd) |",
                "| --- | ---: | ---: | ---: |",
                f"| dense (MLP hidden {4 * shape['n_embd']}) | {d['params']:,} | {d['active_params']:,} | "
                f"{d['train_flops_per_token'] / 1e6:.2f} M |",
                f"| moe | {m['params']:,} | {m['active_params']:,} | {m['train_flops_per_token'] / 1e6:.2f} M "
                f"({100 * (m['train_flops_per_token'] / d['train_flops_per_token'] - 1):+.2f}%: the router) |", ""]
    if speed:
        tok = SPEED["B"] * SPEED["T"]
        args = argparse.Namespace(**speed["settings"])
        out += ["## Throughput", "", conditions(speed), "",
                f"Global batch {SPEED['B']} x {SPEED['T']} = {tok} tokens per step in every run, --threads 1 per "
                f"process, {args.steps} steps of which the first {args.warmup} are warm-up; tokens/s from the median "
                f"step time of each run; {args.repeats} repeats in rotated order: median (min-max).", "",
                "| run | tokens/s | all-to-all share of step time | all-to-all bytes sent / rank / step | "
                "gradient sync bytes (metrics' comm_bytes) / step | parameter bytes on rank 0 | dropped | "
                "cores obtained |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for tag in (c[1] for c in speed_configs()):
            s = speed[tag]
            t, a = s["tokens_per_s"], s["a2a_share"]
            moe = tag.startswith("moe")
            a2a = f"{100 * a['median']:.1f}% ({100 * a['min']:.1f}-{100 * a['max']:.1f})" if moe and s["nproc"] > 1 \
                else ("0 (one rank: no exchange)" if moe else "—")
            b = f"{s['a2a_bytes_per_rank'] / 1e6:.2f} MB" if moe else "—"
            c = s["cores_used"]
            dropped = f"{100 * s['dropped']:.1f}%" if moe else "—"
            cb = f"{s['comm_bytes'] / 1e6:.2f} MB" if s["nproc"] > 1 else "—"
            pb = s.get("param_bytes_rank0")
            pb = f"{pb / 1e6:.2f} MB" if pb else "—"
            out.append(f"| {s['label']} | {t['median']:.0f} ({t['min']:.0f}-{t['max']:.0f}) | {a2a} | {b} | {cb} | "
                       f"{pb} | {dropped} | {c['median']:.2f} ({c['min']:.2f}-{c['max']:.2f}) |")
        out += ["", "| ratio (per repeat) | median | min-max |", "| --- | ---: | ---: |"]
        for k, r in speed["ratios"].items():
            out.append(f"| {k} | {r['median']:.2f}x | {r['min']:.2f}-{r['max']:.2f}x |")
        g = speed["ratios"]["moe_ep2_2 / moe_ep1_1"]["median"]
        out += ["", f"Goal: moe ep=2 on 2 processes >= 1.7x moe ep=1 on 1 process: {g:.2f}x, "
                f"{'MET' if g >= 1.7 else 'NOT MET'}.", "",
                "Cores obtained: CPU seconds (user + system) of the run's processes over its wall time: 1 process "
                "can use at most 1.00 and 2 processes 2.00 (a shared-memory wait spins up to 0.3 ms and yields up to "
                "2 ms before it sleeps: that part of waiting counts as used).", "",
                "Projection to 2 dedicated cores (not a measurement): 2 x (tokens per CPU-second of the 2-process "
                "run) / (tokens per CPU-second of the 1-process run), per repeat. Spinning and yielding while the "
                "peer process is descheduled count as CPU time, so on an oversubscribed machine this understates "
                "the 2-process efficiency; CPU seconds cover the whole run (start-up and warm-up too).", "",
                "| projected ratio on 2 dedicated cores | median | min-max |", "| --- | ---: | ---: |"]
        for k, r in speed["projected"].items():
            out.append(f"| {k} | {r['median']:.2f}x | {r['min']:.2f}-{r['max']:.2f}x |")
        out.append("")
        bd = speed.get("breakdown")
        if bd and "moe_ep1_1" in bd and "moe_ep2_2" in bd:
            a, b = bd["moe_ep1_1"]["parts_ms"], bd["moe_ep2_2"]["parts_ms"]
            out += ["Where rank 0's step goes (one traced run each, ms per step after warm-up; block times include "
                    "the MoE blocks' dispatch and combine; the comm track runs beside the compute track):", "",
                    f"| part | {bd['moe_ep1_1']['label']} | {bd['moe_ep2_2']['label']} | ratio |",
                    "| --- | ---: | ---: | ---: |"]
            for k in list(a) + [k for k in b if k not in a]:
                x, y = a.get(k), b.get(k)
                r = f"{x / y:.2f}x" if x and y else "—"
                out.append(f"| {k} | {x:.1f} | {y:.1f} | {r} |".replace("None", "—") if x and y else
                           f"| {k} | {x if x is None else round(x, 1)} | {y if y is None else round(y, 1)} | — |"
                           .replace("None", "—"))
            x, y = bd["moe_ep1_1"]["median_step_ms"], bd["moe_ep2_2"]["median_step_ms"]
            out += [f"| median step time | {x:.1f} | {y:.1f} | {x / y:.2f}x |", ""]
    if quality:
        d, m = quality["dense"], quality["moe"]
        args = argparse.Namespace(**quality["settings"])
        out += ["## Quality", "", conditions(quality), "",
                f"tinyshakespeare bytes (first 90% train, last 10% validation), batch {QUALITY['B']} x "
                f"{QUALITY['T']}, AdamW lr 1e-3 (20 warm-up steps, cosine to 1e-4), {args.quality_steps} steps, "
                f"validation on 16 batches every {args.eval_every} steps, 1 process.", "",
                "| model | seed | final val loss | final train loss | val loss at each evaluation | dropped |",
                "| --- | ---: | ---: | ---: | --- | ---: |"]
        for name, q in (("dense", d), ("moe", m)):
            for r in q["runs"]:
                curve = " ".join(f"{c['val_loss']:.3f}" for c in r["curve"])
                out.append(f"| {name} | {r['seed']} | {r['final_val_loss']:.4f} | {r['final_train_loss']:.4f} | "
                           f"{curve} | {100 * r['dropped']:.1f}% |" if name == "moe" else
                           f"| {name} | {r['seed']} | {r['final_val_loss']:.4f} | {r['final_train_loss']:.4f} | "
                           f"{curve} | — |")
        gap = m["final_val_loss_mean"] - d["final_val_loss_mean"]
        out += ["", f"Mean final validation loss: dense {d['final_val_loss_mean']:.4f}, moe "
                f"{m['final_val_loss_mean']:.4f} ({gap:+.4f} nats/byte, {100 * gap / d['final_val_loss_mean']:+.2f}%): "
                f"{'MoE lower (goal met)' if gap < 0 else 'MoE NOT lower (goal not met)'}.", ""]
    out.append(f"Reproduce: `flock /tmp/meshtrain-bench.lock /usr/bin/python3 bench/moe_bench.py --meshtrain "
               f"build/meshtrain`")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meshtrain", default=os.path.join(ROOT, "build", "meshtrain"))
    ap.add_argument("--out", default=os.path.join(HERE, "results", "moe"))
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data"), help="holds tinyshakespeare.txt")
    ap.add_argument("--steps", type=int, default=8, help="steps per throughput run")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the throughput")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quality-steps", type=int, default=400)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--seeds", type=int, default=2, help="seeds per model in the quality part (paired)")
    ap.add_argument("--only", choices=("speed", "quality"))
    ap.add_argument("--quick", action="store_true", help="a few steps per run: a smoke test, not a measurement")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--table-only", action="store_true", help="rewrite table.md from --out's results.json")
    args = ap.parse_args()
    if args.table_only:
        with open(os.path.join(args.out, "results.json")) as f:
            parts = {k: v for k, v in json.load(f).items() if k in ("speed", "quality") and v}
        with open(os.path.join(args.out, "table.md"), "w") as f:
            f.write(table_md(parts))
        return
    if args.quick:
        args.steps, args.warmup, args.repeats, args.quality_steps, args.eval_every = 3, 1, 1, 20, 10
    args.meshtrain = os.path.abspath(args.meshtrain)
    args.out = os.path.abspath(args.out)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    host = host_info(args.meshtrain)
    print(f"host: {host['cpu']}, {host['cores']} cores, Linux {host['kernel']}, ISA {' '.join(host['isa'])}, "
          f"{host['openblas']}, OPENBLAS_CORETYPE={host['openblas_coretype']}, load average {host['loadavg'][0]:.1f}")
    for name, shape in (("throughput", SPEED), ("quality", QUALITY)):
        for moe in (False, True):
            a = arithmetic(shape, moe)
            print(f"{name} model {'moe' if moe else 'dense'}: {a['params']:,} parameters, {a['active_params']:,} "
                  f"active per token, {a['train_flops_per_token'] / 1e6:.2f} MFLOP per token (fwd+bwd)")
    work = tempfile.mkdtemp(prefix="moe_bench_")
    # Each part keeps its own conditions; --only reruns one part and keeps the other from results.json.
    path = os.path.join(args.out, "results.json")
    parts = {}
    try:
        prepare_text(args.meshtrain, work, args.data)
        write_shard(os.path.join(work, "random.bin"), SPEED["B"] * SPEED["T"] * (args.steps + 1) + 1, V)
        for part in ("speed", "quality"):
            if args.only not in (None, part):
                continue
            t0 = time.monotonic()
            h = dict(host_info(args.meshtrain), started=time.strftime("%Y-%m-%d %H:%M", time.gmtime()))
            if part == "speed":
                print("throughput:", flush=True)
                r = run_speed(args, work, env)
                print("breakdown (traced runs, rank 0):", flush=True)
                r["breakdown"] = run_breakdown(args, work, env)
                for tag in ("dense_1", "moe_ep1_1"):  # the formula's parameter count against meshtrain's
                    want = arithmetic(SPEED, tag.startswith("moe"))["params"]
                    if r[tag]["params"] != want:
                        sys.exit(f"parameter count of {tag}: meshtrain says {r[tag]['params']}, formula {want}")
                settings = dict(steps=args.steps, warmup=args.warmup, repeats=args.repeats)
            else:
                print("quality:", flush=True)
                r = run_quality(args, work, env)
                for name in ("dense", "moe"):
                    want = arithmetic(QUALITY, name == "moe")["params"]
                    if r[name]["runs"][0]["params"] != want:
                        sys.exit(f"parameter count of quality {name}: meshtrain says "
                                 f"{r[name]['runs'][0]['params']}, formula {want}")
                settings = dict(quality_steps=args.quality_steps, eval_every=args.eval_every, seeds=args.seeds)
            h.update(loadavg_end=os.getloadavg(), ended=time.strftime("%Y-%m-%d %H:%M", time.gmtime()))
            r.update(host=h, settings=settings, quick=args.quick, nice=os.nice(0), total_s=time.monotonic() - t0)
            parts[part] = r
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.only and os.path.exists(path):  # read at the end: the other part may have been rerun meanwhile
        with open(path) as f:
            old = json.load(f)
        parts.update({k: old[k] for k in ("speed", "quality") if old.get(k) and k != args.only})
    table = table_md(parts)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table)
    with open(path, "w") as f:
        json.dump(dict(speed_shape=SPEED, quality_shape=QUALITY,
                       arithmetic={n: {"dense": arithmetic(s, False), "moe": arithmetic(s, True)}
                                   for n, s in (("speed", SPEED), ("quality", QUALITY))}, **parts), f, indent=1)
    print("\n" + table)
    print(f"wrote {args.out}/table.md, results.json")


if __name__ == "__main__":
    main()
