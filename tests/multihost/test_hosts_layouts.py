"""Multi-host layouts on one machine: 2 "hosts" made by scripts/hosts.sh (network namespaces on a bridge, OpenMPI
started in them through an rsh agent, TCP only: btl tcp,self, no shared memory between hosts). Every layout below
reproduces the single-process run (every step's loss, grad_norm and lr, and the consolidated final weights, with
dp_common's tolerances), and where the layout fixes the bytes that must cross between hosts, the bytes counted on
the hosts' interfaces match that formula.

Layouts (2 hosts x n ranks, rank r on host r // n; the mesh orders ranks tp fastest, then dp, then pp):
  dp4_z1        2 x 2, --dp 4 --zero 1             data parallel across and inside hosts, sharded optimizer;
                also: OpenMPI's transport log shows only tcp and self initialised (no vader: no shared memory
                between hosts) and every rank reaching the 3 others over tcp on the host hosts.sh put it on
  dp4_z3        2 x 2, --dp 4 --zero 3             and sharded parameters
  dp4_z0_hier   2 x 2, --dp 4, MESHTRAIN_MPI_HIER=1: the backend's hierarchical all-reduce, which it then picks
                from the hosts the ranks run on (bytes checked)
  dp4_z0_flat_ring  the same without it (the default) and OpenMPI's iallreduce pinned to its ring (bytes checked)
  tp2_dp2       2 x 2, --tp 2 --dp 2               tp inside a host, dp across hosts (bytes checked)
  dp2_pp2       2 x 2, --dp 2 --pp 2               one pipeline stage per host (bytes checked)
  dp2_tp2_pp2   2 x 4, --dp 2 --tp 2 --pp 2 --zero 1   the 3-D mesh, 8 ranks oversubscribed on the machine

Bytes between hosts B_wire: the sum of the hosts' eth0 tx_bytes minus what the launcher's br0 received (mpirun
and its daemons talking to each other), read before and after each run. The payload formula P counts float32
bytes (Psi parameters, the tied wte once; S = 4 Psi):
  dp4_z0_hier   per step 2 S: inside each host first, then each of the 2 local ranks sends its half of the host's
                partial sum to the other host and gets the other half of the result back (src/comm/mpi/
                hier_allreduce.h: 2 (H-1) S over H hosts).
  dp4_z0_flat_ring  per step 3 S: a ring over 4 ranks with 2 ranks per host has 2 of its 4 edges between hosts,
                and a ring all-reduce sends 2 (n-1)/n S = 1.5 S over every edge.
  tp2_dp2       per step 2 (S + 4 R): each of the 2 dp groups ({0,2}, {1,3}) has one rank per host, and a
                2-rank all-reduce of X bytes moves X each way whatever the algorithm; the two tp ranks hold
                Psi + R parameters between them (R: the tensors tp replicates: LayerNorms, row-parallel biases,
                wpe).
  dp2_pp2       per step 2 B T C 4 (the stage boundary's activations forward and their gradients backward,
                every row of the batch once) + 2 x 2 x 4 V C (the tied wte's gradient all-reduced between its copy
                on the first and on the last stage, once per dp index). This run writes no --save file (gathering
                the last stage's weights for it crosses hosts too, in a way that is not the layout's); its
                weights are compared in the 3-D run, whose pipeline also crosses the hosts.
Per step the wire carries the payload plus Ethernet/IP/TCP headers (66 bytes per segment of up to 1448 bytes:
4.6% at most), acknowledgements, MPI's match headers and meshtrain's 32-byte collective descriptors and scalar
reductions (loss, norm); once per run the start-up (MPI's modex and connection set-up, tens of KB). The check:
P <= B_wire <= 1.15 P + 64 KB. The lower bound fails if ranks on different hosts reach each other in any way but
the wire (shared memory between hosts); the upper bound fails for a layout that sends more than its formula
(the flat all-reduce instead of the hierarchical one: 3 S or more instead of 2 S; a 4-rank all-reduce with
recursive doubling: 4 S instead of 3 S; tp across hosts would add every activation all-reduce).

MT_MULTIHOST_ONLY=tag,tag runs only those layouts (the single-process run always).

Skips (exit 77, which CTest reports as skipped, not passed) when namespaces cannot be made here: not root, no
iproute2, no veth or bridge support; scripts/hosts.sh prints the reason. Without mpirun the test fails.
"""
from __future__ import annotations

import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "parity"))
import dp_common as dpc  # noqa: E402
sys.path.insert(0, HERE)
from hosts_common import HOSTS_SH, hosts, on_two_hosts  # noqa: E402
from parity_harness import parse_args  # noqa: E402

STEPS = 12
CFG = dpc.CFG
PSI = dpc.PSI
C, V, TMAX = CFG.n_embd, CFG.vocab_size, CFG.n_positions
WIRE_REL, WIRE_ABS = 0.15, 64 * 1024
COMM_TIMEOUT_S, MPIRUN_TIMEOUT_S = 60, 180  # a run takes 3-30 s here


def tp_replicated_count() -> int:
    """R: parameters every tp rank holds whole (the vocabulary-parallel wte, c_attn, c_fc and both c_proj
    weights are split; LayerNorms, the row-parallel layers' biases and wpe are not)."""
    per_block = 2 * C + 2 * C + C + C  # ln_1, ln_2, attn.c_proj.bias, mlp.c_proj.bias
    return CFG.n_layer * per_block + 2 * C + TMAX * C  # + ln_f + wpe



def wire_bytes(prefix: str) -> int:
    """Bytes sent between hosts so far: the hosts' eth0 tx summed, minus the launcher's br0 rx."""
    total = 0
    for line in hosts(prefix, "bytes").stdout.splitlines():
        name, tx, rx = line.split()
        total += -int(rx) if name == "launcher" else int(tx)
    return total



def check_btl_use(stderr: str, ranks: int, per_host: int, prefix: str, checks: dpc.Tally, tag: str) -> None:
    """From OpenMPI's btl_base_verbose output: every rank loaded only the tcp and self transports (vader, the
    shared-memory one, is not even initialised), and every rank reaches every other rank over tcp on the
    node where hosts.sh placed it (host r // per_host)."""
    inits = set(re.findall(r"select: initializing btl component (\w+)", stderr))
    checks.check(inits == {"tcp", "self"}, f"{tag}: MPI initialised the transports {sorted(inits)}, expected only "
                 "['self', 'tcp'] (no shared memory between hosts)")
    uses = re.findall(r"Using (\w+) btl for send to \[\[\d+,\d+\],(\d+)\] on node (\S+)", stderr)
    tcp = {(int(r), node) for kind, r, node in uses if kind == "tcp"}
    want = {(r, f"{prefix}-h{r // per_host}") for r in range(ranks)}
    checks.check(tcp == want and len([u for u in uses if u[0] == "tcp"]) == ranks * (ranks - 1),
                 f"{tag}: tcp sends {sorted(tcp)} ({len(uses)} 'Using ... btl' lines), expected every rank to reach "
                 f"the {ranks - 1} others over tcp on {sorted(want)}")


def main() -> None:
    args = parse_args(__doc__)
    checks = dpc.Tally("test_hosts_layouts")
    on_two_hosts("mh", checks, lambda prefix: run_layouts(args, checks, prefix))


def run_layouts(args, checks: dpc.Tally, prefix: str) -> None:
    init_path, data_path, _ = dpc.write_inputs(args.workdir)

    def out(tag: str, ext: str) -> str:
        return os.path.join(args.workdir, f"{tag}.{ext}")

    def train(tag: str, launcher, flags, save: bool = True):
        dpc.remove_stale(out(tag, "jsonl"), out(tag, "safetensors"))
        cmd = list(launcher) + dpc.train_cmd(args.meshtrain, init_path, data_path, STEPS, list(flags) + [
            "--metrics", out(tag, "jsonl")] + (["--save", out(tag, "safetensors")] if save else []))
        r = dpc.run_group(cmd, 300, out(tag, "log"))
        if not checks.check(r.returncode == 0, dpc.failure_text(r, tag)):
            return None, None, r
        return dpc.read_metrics_range(out(tag, "jsonl"), 0, STEPS, checks, tag), \
            dpc.load_saved(out(tag, "safetensors"), checks, tag) if save else None, r

    want, want_w, _ = train("single", [], [])
    if want is None or want_w is None:
        return

    S = 4 * PSI
    R = tp_replicated_count()
    B, T = dpc.B, dpc.T
    # (tag, ranks per host, mpirun options, layout flags, payload per step or None, --save)
    layouts = [
        ("dp4_z1", 2, ["--mca", "btl_base_verbose", 100], ["--dp", 4, "--zero", 1], None, True),
        ("dp4_z3", 2, [], ["--dp", 4, "--zero", 3], None, True),
        ("dp4_z0_hier", 2, ["-x", "MESHTRAIN_MPI_HIER=1"], ["--dp", 4, "--zero", 0], 2 * S, True),
        ("dp4_z0_flat_ring", 2, ["--mca", "coll_libnbc_iallreduce_algorithm", 1],
         ["--dp", 4, "--zero", 0], 3 * S, True),
        ("tp2_dp2", 2, [], ["--tp", 2, "--dp", 2], 2 * (S + 4 * R), True),
        ("dp2_pp2", 2, [], ["--dp", 2, "--pp", 2, "--micro-batch-size", 3],
         2 * B * T * C * 4 + 2 * 2 * 4 * V * C, False),
        ("dp2_tp2_pp2_z1", 4, [], ["--dp", 2, "--tp", 2, "--pp", 2, "--zero", 1, "--micro-batch-size", 3], None,
         True),
    ]
    only = [t for t in os.environ.get("MT_MULTIHOST_ONLY", "").split(",") if t]
    if only:  # for trying a change quickly; a run that leaves layouts out says so
        print(f"MT_MULTIHOST_ONLY: only {only}")
        checks.check(all(t in [x[0] for x in layouts] for t in only), f"MT_MULTIHOST_ONLY names unknown layouts: {only}")
    for tag, per_host, mca, flags, per_step, save in layouts:
        if only and tag not in only:
            continue
        before = wire_bytes(prefix)
        # mpirun's own deadline (below the harness's 300 s): a job stuck before meshtrain's deadlines apply (in
        # MPI's start-up) ends with every process's state printed instead of a silent kill.
        launcher = ["bash", HOSTS_SH, "--prefix", prefix, "mpirun", per_host, "--timeout", MPIRUN_TIMEOUT_S,
                    "--report-state-on-timeout", *mca]
        got, got_w, r = train(tag, launcher, flags + ["--comm-timeout", COMM_TIMEOUT_S], save)
        after = wire_bytes(prefix)
        if got is None:
            continue
        print(f"{tag}: {r.seconds:.1f} s")
        if "btl_base_verbose" in mca:
            check_btl_use(r.stderr.decode(errors="replace"), 2 * per_host, per_host, prefix, checks, tag)
        wl, wg = dpc.compare_steps(got, want, checks, tag)
        line = f"{tag}: worst loss diff {wl:.2e}, worst grad_norm rel diff {wg:.2e}"
        if got_w is not None:
            dw, where, _ = dpc.weight_diffs(got_w, want_w)
            checks.check(dw <= dpc.TOL_W_ABS, f"{tag}: final weights differ by {dw:.2e} in {where}")
            line += f", worst weight diff {dw:.2e}"
        print(line)
        if per_step is not None:
            payload, wire = STEPS * per_step, after - before
            hi = (1 + WIRE_REL) * payload + WIRE_ABS
            print(f"{tag}: bytes between hosts {wire} = {wire / payload:.4f} x the formula's {payload} "
                  f"({STEPS} steps x {per_step}); allowed [{payload}, {hi:.0f}]")
            checks.check(payload <= wire <= hi, f"{tag}: {wire} bytes between hosts, outside [{payload}, {hi:.0f}] "
                         f"(formula {STEPS} x {per_step})")


if __name__ == "__main__":
    main()
