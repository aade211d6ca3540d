"""Training's gathers and all-to-alls read their peers' send buffers from the job's shared heap (issue 29).

The shm launcher maps one shared heap before it forks the ranks (core/shared_heap.h); the single-copy collectives
(comm/shm/shm_comm.cpp) read a peer's send buffer there with ordinary loads, elsewhere with process_vm_readv.
Training puts the send buffers of the collectives that ZeRO and expert parallelism lean on in the heap: ZeRO 3's
parameter shard (and its bf16 copy under --precision bf16, and the pooled bucket buffers), ZeRO 1/2's flat
parameters (all-gathered in place), the expert-parallel dispatch/combine rows, and under --offload params the
pooled buffers that the offloaded shards are read into and gathered from. --summary reports per rank the
step loop's single-copy reads by path (ranks[r].comm.peer_reads) and the heap's peak.

Each layout runs twice on 2 ranks, --threads 1: with the heap (the default) and with MESHTRAIN_SHARED_HEAP_MB=0
(no heap: every buffer private). Checked per layout:
  - heap on, every rank: direct_bytes > 0 and kernel_bytes == kernel_calls == 0 (every single-copy read of the
    step loop found its peer's buffer in the heap: one send buffer left private makes kernel_bytes > 0), and
    shared_heap_peak_bytes > 0;
  - heap off, every rank: direct_bytes == direct_calls == 0 and shared_heap_peak_bytes == 0;
  - the same reads by either path: per rank, direct bytes and calls with the heap equal kernel bytes and calls
    without it (the path changes how bytes move, never which or how many);
  - losses bitwise equal (the metrics rows' loss) and the saved weights byte for byte equal.

The single-copy threshold depends on whether the ranks are bound to CPUs (32 KB bound, 16 MB unbound: shm_comm.h);
the test pins it with MESHTRAIN_SHM_CMA_GATHER_KB=32 so that the path does not depend on the machine. The shapes put
the gathers and exchanges above 32 KB: GPT L=2, C=64, V=128 (a block's all-gather is ~197 KB); the MoE run sends
256 rows of 64 floats per rank per exchange (B=8, T=32, top-2, dropless: 64 KB). The count exchanges of the MoE
(a few int64 per rank) stay below it, so they take the staged path, as do the summary's own gathers (after the
step loop, not counted).
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dp_common import run_group  # noqa: E402
from parity_harness import Checks, parse_args  # noqa: E402
from run_files import tensor_bytes, write_random_shard  # noqa: E402

V, STEPS = 128, 4
GPT = ["--model", "gpt", "--n-layer", 2, "--n-head", 2, "--n-embd", 64, "--vocab-size", V, "--n-positions", 32,
       "--batch-size", 8, "--seq-len", 32, "--steps", STEPS, "--lr", "1e-3", "--seed", 7, "--threads", 1,
       "--quiet", "--nproc", 2]
MOE = ["--moe-every", 2, "--experts", 4, "--moe-top-k", 2, "--expert-hidden", 64, "--capacity-factor", 0]
LAYOUTS = [  # (tag, flags)
    ("z3", ["--zero", 3]),
    ("z3_bf16", ["--zero", 3, "--precision", "bf16"]),
    ("z1", ["--zero", 1]),
    ("z2", ["--zero", 2]),
    # --delayed-update --overlap-update: ZeRO 1 all-gathers the update in the version its thread wrote
    # (train/overlapped_update.h, B).
    ("z1_delay_overlap", ["--zero", 1, "--delayed-update", "--overlap-update"]),
    ("ep2", ["--ep", 2, *MOE]),
    # --offload params: ZeRO 3 gathers from the shard read into a pooled buffer; ZeRO 2 all-gathers each bucket in
    # place in a pooled buffer (parallel/data/param_file.cpp).
    ("z3_offload", ["--zero", 3, "--offload", "params", "--offload-tile", 4096]),
    ("z2_offload", ["--zero", 2, "--offload", "params", "--offload-tile", 4096]),
    # --overlap-update: a forward gathers from the update's own copy of a shard (Stage3::keep_fresh's buffers).
    ("z3_offload_overlap", ["--zero", 3, "--offload", "optimizer,params", "--offload-tile", 4096, "--overlap-update"]),
]


def run_one(args, data, tag, flags, heap: bool, checks: Checks):
    name = f"{tag}_{'heap' if heap else 'noheap'}"
    metrics, summary, save = (os.path.join(args.workdir, f"{name}.{ext}")
                              for ext in ("jsonl", "summary.json", "safetensors"))
    for p in (metrics, summary, save):
        if os.path.exists(p):
            os.remove(p)
    if heap:
        os.environ.pop("MESHTRAIN_SHARED_HEAP_MB", None)
    else:
        os.environ["MESHTRAIN_SHARED_HEAP_MB"] = "0"
    if "--offload" in flags:
        flags = [*flags, "--offload-dir", os.path.join(args.workdir, "offload")]
        os.makedirs(flags[-1], exist_ok=True)
    cmd = [args.meshtrain, "train", "--data", data, *GPT, *flags, "--metrics", metrics, "--summary", summary,
           "--save", save]
    r = run_group(cmd, 300, os.path.join(args.workdir, name))
    os.environ.pop("MESHTRAIN_SHARED_HEAP_MB", None)
    if not checks.check(r.ok, f"{name}: {r.describe()}"):
        return None
    with open(metrics) as f:
        losses = [json.loads(line)["loss"] for line in f if line.strip()]
    with open(summary) as f:
        ranks = json.load(f)["ranks"]
    return {"losses": losses, "comm": [q["comm"] for q in ranks], "weights": tensor_bytes(save)}


def main():
    args = parse_args(__doc__.splitlines()[0])
    os.environ["MESHTRAIN_SHM_CMA_GATHER_KB"] = "32"
    checks = Checks("shared-heap collectives")
    data = os.path.join(args.workdir, "tokens.bin")
    write_random_shard(data, 4001, V)
    for tag, flags in LAYOUTS:
        on = run_one(args, data, tag, flags, True, checks)
        off = run_one(args, data, tag, flags, False, checks)
        if on is None or off is None:
            continue
        checks.check(len(on["comm"]) == 2 and len(off["comm"]) == 2,
                     f"{tag}: summary ranks {len(on['comm'])} / {len(off['comm'])}, expected 2")
        for r, (a, b) in enumerate(zip(on["comm"], off["comm"])):
            pa, pb = a["peer_reads"], b["peer_reads"]
            print(f"{tag} rank {r}: heap {pa} peak {a['shared_heap_peak_bytes']}; "
                  f"no heap {pb} peak {b['shared_heap_peak_bytes']}", flush=True)
            checks.check(pa["direct_bytes"] > 0, f"{tag} rank {r}: no direct reads with the heap: {pa}")
            checks.check(pa["kernel_bytes"] == 0 and pa["kernel_calls"] == 0,
                         f"{tag} rank {r}: process_vm_readv reads with the heap (a send buffer outside it): {pa}")
            checks.check(a["shared_heap_peak_bytes"] > 0, f"{tag} rank {r}: heap peak 0 with the heap")
            # Peers' pages read with loads are mapped into the reader (and so in its RSS); without a heap there are none.
            checks.check(a["peer_heap_rss_bytes"] > 0, f"{tag} rank {r}: no peer heap pages mapped after direct reads")
            checks.check(b["peer_heap_rss_bytes"] == 0,
                         f"{tag} rank {r}: peer heap pages {b['peer_heap_rss_bytes']} without a heap")
            checks.check(pb["direct_bytes"] == 0 and pb["direct_calls"] == 0,
                         f"{tag} rank {r}: direct reads without a heap: {pb}")
            checks.check(b["shared_heap_peak_bytes"] == 0,
                         f"{tag} rank {r}: heap peak {b['shared_heap_peak_bytes']} without a heap")
            checks.check(pa["direct_bytes"] == pb["kernel_bytes"] and pa["direct_calls"] == pb["kernel_calls"],
                         f"{tag} rank {r}: other reads by the two paths: heap {pa}, no heap {pb}")
        checks.check(len(on["losses"]) == STEPS and on["losses"] == off["losses"],
                     f"{tag}: losses differ with and without the heap: {on['losses']} vs {off['losses']}")
        checks.check(on["weights"].keys() == off["weights"].keys(), f"{tag}: other tensors saved")
        diff = [k for k in on["weights"] if on["weights"][k] != off["weights"].get(k)]
        checks.check(not diff, f"{tag}: saved weights differ with and without the heap: {diff[:5]}")
    checks.finish()


if __name__ == "__main__":
    main()
