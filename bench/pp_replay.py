#!/usr/bin/env python3
"""Replays a pipeline run's own steps: each timed step's action lists (from `meshtrain simulate --actions`, the
generator the run used) with every computation taking the duration the run's --trace recorded for it, and every
message the run's mean latency (the simulator's rendezvous rule: it arrives that long after both its send and
its receive's post). The bubble of that replay, beside the run's measured one and the simulated one (each rank's
chunk at its mean time), separates what the schedule and the cost means explain from what the variation of the
individual durations adds (on a loaded machine a rank is descheduled at random: the same forward takes 35 to 350
ms). Analysis only; the simulator proper is plan::simulate.

Usage: /usr/bin/python3 bench/pp_replay.py --meshtrain build/meshtrain --summary S.json --trace T.json
"""
import argparse
import json
import re
import subprocess

ACTION = re.compile(r"^\s*\d+\s+(\w+)(?:\(i=(\d+), c=(\d+)(?:, (?:to|from)=(\d+))?\))?")
COMPUTE = ("forward", "backward", "backward_input", "backward_weight")


def action_lists(meshtrain, spec):
    out = subprocess.run([meshtrain, "simulate", "--schedule", spec["schedule"], "--stages", str(spec["stages"]),
                          "--micro-batches", str(spec["micro_batches"]), "--virtual-stages",
                          str(spec["virtual_stages"]), "--actions"], check=True, capture_output=True, text=True).stdout
    lists, cur = [], None
    for line in out.splitlines():
        if line.startswith("rank ") and ":" in line and "busy" not in line:
            cur = []
            lists.append(cur)
        elif cur is not None and (m := ACTION.match(line)):
            kind, i, c, peer = m.groups()
            cur.append((kind, int(i) if i else -1, int(c) if c else 0, int(peer) if peer else -1))
    return lists[:spec["stages"]]


def stage_of(name, p, j, c):
    if name == "zb-v":
        return j if c == 0 else 2 * p - 1 - j
    if name == "chimera":  # two routes over p stages: down (chunk 0) on rank s, up (chunk 1) on rank p - 1 - s
        return j if c == 0 else p - 1 - j
    return c * p + j  # looped placement


def replay(lists, durations, name, p, latency, ready=0.0, overheads=None):
    """durations[j]: rank j's compute durations in list order; latency: a message arrives that long after both its
    send and its receive's post; ready: what a wait costs when its message has already arrived (0 in
    plan::simulate); overheads[j]: rank j's own time in each send and post action in list order, as traced
    (0 in plan::simulate). Returns (makespan, busy)."""
    kx = [0] * p
    sent, posted = {}, {}
    t = [0.0] * p
    pc = [0] * p
    k = [0] * p
    busy = 0.0

    def msg(kind, i, j, c):
        s = stage_of(name, p, j, c)
        if kind in ("send_act",):
            return ("act", i, s + 1)
        if kind in ("post_recv_act", "wait_recv_act"):
            return ("act", i, s)
        if kind == "send_grad":
            return ("grad", i, s - 1)
        return ("grad", i, s)

    progress = True
    while progress:
        progress = False
        for j in range(p):
            while pc[j] < len(lists[j]):
                kind, i, c, _ = lists[j][pc[j]]
                if kind in COMPUTE:
                    d = durations[j][k[j]]
                    k[j] += 1
                    t[j] += d
                    busy += d
                elif kind.startswith("send") or kind.startswith("post"):
                    if overheads is not None:  # the rank's time in the action, before the message goes out
                        t[j] += overheads[j][kx[j]]
                        kx[j] += 1
                    (sent if kind.startswith("send") else posted)[msg(kind, i, j, c)] = t[j]
                elif kind.startswith("wait"):
                    key = msg(kind, i, j, c)
                    if key not in sent:
                        break
                    arrival = max(sent[key], posted.get(key, 0.0)) + latency
                    t[j] = t[j] + ready if arrival <= t[j] else arrival
                pc[j] += 1
                progress = True
    assert all(pc[j] == len(lists[j]) for j in range(p)), "replay stuck"
    return max(t), busy


def ready_wait(ev, comp, p):
    """The mean time a receive took to complete when its message had been sent before the rank began waiting for
    it (the wait began when the rank's previous computation ended), over the traced receives of the timed steps."""
    sends = {}
    for e in ev:
        if e.get("ph") == "X" and e.get("cat") == "p2p" and e["name"].startswith("send"):
            kind, i, to = re.match(r"send (\w+) i=(\d+)(?: c=\d+)? to (\d+)", e["name"]).groups()
            sends.setdefault((kind, int(i), e["pid"], int(to)), []).append(e["ts"])
    waits = []
    for j in range(p):
        ends = sorted(e["ts"] + e["dur"] for e in comp[j])
        seen = {}
        for e in sorted((e for e in ev if e.get("ph") == "X" and e.get("cat") == "p2p" and e.get("pid") == j
                         and e["name"].startswith("recv")), key=lambda e: e["ts"]):
            kind, i, frm = re.match(r"recv (\w+) i=(\d+)(?: c=\d+)? from (\d+)", e["name"]).groups()
            key = (kind, int(i), int(frm), j)
            n = seen.get(key, 0)
            seen[key] = n + 1
            if key not in sends or n >= len(sends[key]):
                continue
            sent, done = sends[key][n], e["ts"] + e["dur"]
            before = [t for t in ends if t <= done]
            if before and sent <= before[-1] and before[-1] >= comp[j][0]["ts"]:
                waits.append((done - before[-1]) / 1000.0)
    return sum(waits) / len(waits) if waits else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--summary", required=True)
    ap.add_argument("--trace", required=True)
    args = ap.parse_args()
    with open(args.summary) as f:
        spec = json.load(f)["pipeline"]
    with open(args.trace) as f:
        tr = json.load(f)
    ev = tr["traceEvents"] if isinstance(tr, dict) else tr
    p = spec["stages"]
    lists = action_lists(args.meshtrain, spec)
    per_step = [sum(1 for a in lst if a[0] in COMPUTE) for lst in lists]
    comp = [sorted((e for e in ev
                    if e.get("ph") == "X" and e.get("pid") == j and e.get("cat") in ("forward", "backward")),
                   key=lambda e: e["ts"]) for j in range(p)]
    # Evaluation forwards would break the count; the runs this is for have no evaluation.
    steps = min(len(comp[j]) // per_step[j] for j in range(p))
    total_ms, total_busy = 0.0, 0.0
    for s in range(1, steps):  # the first step is not timed, as in the run's own figures
        durs = [[e["dur"] / 1000.0 for e in comp[j][s * per_step[j]:(s + 1) * per_step[j]]] for j in range(p)]
        ms, busy = replay(lists, durs, spec["schedule"], p, spec.get("message_latency_ms", 0.0))
        total_ms += ms
        total_busy += busy
    replayed = 1 - total_busy / (p * total_ms)
    ready = ready_wait(ev, comp, p)
    total_ms = total_busy = 0.0
    for s in range(1, steps):
        durs = [[e["dur"] / 1000.0 for e in comp[j][s * per_step[j]:(s + 1) * per_step[j]]] for j in range(p)]
        ms, busy = replay(lists, durs, spec["schedule"], p, spec.get("message_latency_ms", 0.0), ready)
        total_ms += ms
        total_busy += busy
    replayed_ready = 1 - total_busy / (p * total_ms)
    # The executor's own time in each send and post (trace category "executor": the copy, the transport's call;
    # on a loaded host the rank may lose its core there), replayed with the compute durations.
    per_step_x = [sum(1 for a in lst if a[0].startswith("send") or a[0].startswith("post")) for lst in lists]
    xs = [sorted((e for e in ev if e.get("ph") == "X" and e.get("pid") == j and e.get("cat") == "executor"
                  and (e["name"].startswith("send") or e["name"].startswith("post"))), key=lambda e: e["ts"])
          for j in range(p)]
    replayed_overheads, overhead_ms = None, None
    if all(len(xs[j]) >= steps * per_step_x[j] for j in range(p)):
        total_ms = total_busy = over = 0.0
        for s in range(1, steps):
            durs = [[e["dur"] / 1000.0 for e in comp[j][s * per_step[j]:(s + 1) * per_step[j]]] for j in range(p)]
            ovs = [[e["dur"] / 1000.0 for e in xs[j][s * per_step_x[j]:(s + 1) * per_step_x[j]]] for j in range(p)]
            over += sum(map(sum, ovs))
            ms, busy = replay(lists, durs, spec["schedule"], p, spec.get("message_latency_ms", 0.0), 0.0, ovs)
            total_ms += ms
            total_busy += busy
        replayed_overheads = 1 - total_busy / (p * total_ms)
        overhead_ms = over / (steps - 1) / p  # per rank and step
    # Self-check: the same replay with each (rank, chunk)'s mean times (index rank * V + chunk; older summaries:
    # each stage's mean over the ranks holding it) gives the run's simulated bubble (plan::simulate).
    V = spec["virtual_stages"]
    if spec.get("rank_chunk_forward_ms"):
        fw, bw = spec["rank_chunk_forward_ms"], spec["rank_chunk_backward_ms"]
        ww = spec.get("rank_chunk_weight_ms") or []
        key = lambda j, c: j * V + c
    else:
        fw, bw, ww = spec["stage_forward_ms"], spec["stage_backward_ms"], spec.get("stage_weight_ms") or []
        key = lambda j, c: stage_of(spec["schedule"], p, j, c)
    mean = {"forward": lambda s: fw[s], "backward": lambda s: bw[s],
            "backward_input": lambda s: bw[s] - (min(ww[s], bw[s]) if ww else bw[s] / 2),
            "backward_weight": lambda s: min(ww[s], bw[s]) if ww else bw[s] / 2}
    means = [[mean[a[0]](key(j, a[2])) for a in lists[j] if a[0] in COMPUTE] for j in range(p)]
    ms, busy = replay(lists, means, spec["schedule"], p, spec.get("message_latency_ms", 0.0))
    check = 1 - busy / (p * ms)
    # This replay charges sends and posts nothing: it matches plan::simulate with them free (the summary's
    # bubble_simulated charges each its measured mean; older summaries have only that, with free sends).
    free_calls = spec.get("bubble_simulated_with_free_sends_and_posts", spec["bubble_simulated"])
    assert abs(check - free_calls) < 1e-4, f"replay of the means {check} != simulated with free sends {free_calls}"
    ms, busy = replay(lists, means, spec["schedule"], p, spec.get("message_latency_ms", 0.0), ready)
    means_ready = 1 - busy / (p * ms)
    print(json.dumps({"schedule": spec["schedule"], "steps_replayed": steps - 1,
                      "bubble_measured": spec["bubble_measured"],
                      "bubble_simulated": spec["bubble_simulated"], "bubble_replayed": replayed,
                      "ready_wait_ms": ready, "bubble_replayed_with_ready_wait": replayed_ready,
                      "bubble_simulated_with_ready_wait": means_ready,
                      "bubble_replayed_with_executor_time": replayed_overheads,
                      "executor_ms_per_rank_step": overhead_ms}))


if __name__ == "__main__":
    main()
