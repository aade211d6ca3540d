// Pipeline schedules as data: for each pipeline rank, the ordered list of actions it performs in one
// optimizer step. The executor runs these lists, the simulator (plan/simulator.h) replays them under a cost
// model, and the swimlane drawing shows them; nothing else decides an order.
//
// Legend: p pipeline ranks (stages per chunk), m micro-batches, V chunks per rank (virtual stages),
// j rank, i micro-batch, c chunk. Chunk c of rank j is global stage s = c*p + j (Megatron's interleaved
// assignment), so with V = 1 rank j is stage j.
//
// Communication rule (what makes every schedule deadlock-free): sends never block (the executor posts them
// and moves on; a message is identified by (kind, micro-batch, global stage)), and each rank waits for its
// receives in list order, each placed right before the compute that needs it. Every receive's send is
// issued by a compute action that depends only on earlier receives, so the lists form one causal order.
//
//   GPipe, p = 2, m = 2 (F = forward, B = backward, numbers are micro-batches):
//     rank 0:  F0 F1 .  .  B0 B1
//     rank 1:  .  F0 F1 B0 B1
//   1F1B, p = 2, m = 3: rank 0 warms up with p-j-1 = 1 forward, then alternates:
//     rank 0:  F0 F1 B0 F2 B1 B2
//     rank 1:  F0 B0 F1 B1 F2 B2
#pragma once

#include <string>
#include <vector>

namespace mt::pipeline {

enum class ActionKind { forward, backward, recv_act, send_act, recv_grad, send_grad };
const char* action_name(ActionKind k);

struct Action {
  ActionKind kind;
  int micro_batch;
  int chunk;  // this rank's chunk (virtual stage), 0..V-1
  int peer;   // rank sent to / received from; -1 for compute
  bool operator==(const Action&) const = default;
};

struct ScheduleSpec {
  std::string name;  // gpipe | 1f1b | interleaved
  int stages = 1;    // p
  int micro_batches = 1;  // m
  int virtual_stages = 1;  // V (interleaved only)
  // Throws InputError naming the bad value (unknown name, p or m < 1, V != 1 for gpipe/1f1b, V < 2 or
  // m not divisible by p for interleaved).
  void validate() const;
};

// Per rank j (0..p-1), its actions in order.
std::vector<std::vector<Action>> make_schedule(const ScheduleSpec& spec);

// Checks the lists as the executor would run them: every send has exactly one matching receive (same
// kind, micro-batch and stage, the right peers), every (micro-batch, chunk) is forwarded then backwarded
// exactly once per rank, each compute is preceded by the receive it needs, and running the lists with
// non-blocking sends and blocking receives terminates (no deadlock). Throws mt::Error describing the first
// violation.
void check_schedule(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& ranks);

}  // namespace mt::pipeline
