// Pipeline schedules as data: for each pipeline rank, the ordered list of actions of one training step.
// The executor runs the list as written, the simulator (plan/simulator.h) replays it under a cost model, the
// swimlane diagram draws the replay. Nothing here touches tensors or communicators.
//
// Legend: p pipeline ranks, m micro-batches, V chunks (virtual stages) per rank, S model stages (p V when
// each stage is held once);
// i micro-batch, j rank, c chunk on a rank, s global stage, k position in a rank's list.
//
// Placement (placement.h) is data in the schedule, chosen by its generator: global stage s runs on some
// (rank, chunk). Stage 0 holds the embedding, stage S - 1 the head and the loss. The forward of (i, s) needs
// the activation of (i, s - 1); the backward of (i, s) needs the gradient from (i, s + 1) and the forward of
// (i, s). When two consecutive stages are on one rank (p == 1 under the looped placement, the turn of a
// V-shaped one), the tensor is handed over in memory, with no message.
//
// A list is built in two steps that any new schedule reuses:
//   1. the schedule proper decides the order of forward and backward computations on each rank
//      (compute_order);
//   2. one rule, the same for every schedule, adds the messages around them (with_communication):
//
//        post_recv for the input of the rank's first computation
//        for each computation X_k on rank j, in order:
//          wait_recv   for X_k's input, if it comes from another rank
//          post_recv   for X_{k+1}'s input, if that comes from another rank
//          X_k
//          send        X_k's output, if another rank needs it
//        optimizer_step
//
//      Sends never block: the executor issues them as non-blocking sends (comm isend) and waits for them
//      only before its optimizer step and after its last action, before the buffers are reused; the transport delivers
//      a message even when its receive is not posted yet (shm drains it into an "unexpected" buffer; MPI buffers small
//      messages and completes large ones once the receive is posted). A receive is posted one computation before the
//      one that needs it, so the message moves while X_k computes, and at most one receive buffer per rank is waiting.
//      Matching: per (sender, receiver, kind of message) the receiver posts its receives in exactly the
//      order the sender sends, so a transport that matches by (source, tag) in posting order (ours and MPI
//      do) can use one tag per kind; the (micro-batch, chunk) in each action is there to check what
//      arrived, or to build unique tags if one prefers. With sends that never block, a rank can only wait
//      in wait_recv, and check_schedule (schedule_check.h) proves by replay that every wait ends.
//
//  The generators (schedule_generator.h: one per file in schedules/, found by name in their registry), as
//  the compute order on rank j (F = forward, B = backward, numbers = micro-batch; p = 4, m = 4; the time each
//  one starts is what the simulator works out):
//
//    gpipe        F0 F1 F2 F3 B0 B1 B2 B3              all forwards, then all backwards, in ascending order
//    1f1b  j=0    F0 F1 F2 F3 B0 B1 B2 B3              warm-up of min(p - j - 1, m) forwards, then one
//          j=1    F0 F1 F2 B0 F3 B1 B2 B3              forward one backward, then the remaining backwards
//          j=2    F0 F1 B0 F2 B1 F3 B2 B3
//          j=3    F0 B0 F1 B1 F2 B2 F3 B3
//    zb-h1, zb-h2 the backward split in its input half (I: what the previous stage waits for) and its weight
//                 half (W: the parameter gradients, deferred into the bubble); 1F1B's order of F and I after a
//                 warm-up of p - j - 1 (zb-h2: 2 (p - 1 - j)) forwards, W of micro-batch i after I of i + j
//                 (zb-h2: i + 2 j); schedules/zb_h1.cpp and zb_h2.cpp draw them for p = 4, m = 8.
//    interleaved  Megatron-LM's order over the m * V (micro-batch, chunk) pairs: forwards go through
//                 groups of p micro-batches chunk by chunk (chunk 0 of micro-batches 0..p-1, then chunk 1 of
//                 the same, ..., then chunk 0 of micro-batches p..2p-1); backwards the same with chunks
//                 from last to first; warm-up of (p - j - 1) * 2 + (V - 1) * p forwards (at most m * V),
//                 then one forward one backward, then the remaining backwards.
//
//  Every schedule runs the backwards (and the weight halves) of each chunk in ascending micro-batch order (GPipe could as well run
//  them in reverse, the makespan is the same). Ascending makes every schedule accumulate a parameter's
//  gradient over micro-batches in the same order, 0, 1, ..., m - 1, the order of the single-process run
//  with micro-batches, so no float32 difference between layouts comes from the choice of schedule.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/pipeline/placement.h"

namespace mt::pipeline {

// What an executor does for each kind; "the tensor" is one micro-batch's activation (or its gradient) at
// one stage boundary, the same shape for every micro-batch.
enum class ActionKind : uint8_t {
  forward,          // forward of (micro_batch, chunk); keeps what backward needs in the activation store
  backward,         // backward of (micro_batch, chunk); accumulates parameter gradients, frees the activations
  send_act,         // non-blocking send of chunk's output activation of micro_batch to peer
  post_recv_act,    // post a non-blocking receive of chunk's input activation of micro_batch from peer
  wait_recv_act,    // wait for that receive to complete; the forward that follows reads its buffer
  send_grad,        // non-blocking send of the gradient of chunk's input of micro_batch to peer
  post_recv_grad,   // post a non-blocking receive of the gradient of chunk's output of micro_batch from peer
  wait_recv_grad,   // wait for that receive to complete; the backward that follows reads its buffer
  optimizer_step,   // this rank's gradients are final: the executor calls the run's update (the same part the
                    // micro-batch loop calls after its last micro-batch), after completing the sends so far.
                    // micro_batch -1: the step's one update, the list's last action; micro_batch i >= 0 (with
                    // its chunk): the update after micro-batch i's backward alone (pipedream, pipemare)
  backward_input,   // the split backward (zero-bubble B): the input's gradient only, what the previous stage
                    // waits for (zb-h1, zb-h2)
  backward_weight,  // the split backward (zero-bubble W): the parameter gradients of (micro_batch, chunk),
                    // after its backward_input; frees the activations
};

struct Action {
  ActionKind kind = ActionKind::forward;
  int micro_batch = -1;  // i in [0, m); -1 for the step-end optimizer_step
  int chunk = -1;        // c in [0, V): the chunk on this rank that computes, sends or receives; -1 for the step
  int peer = -1;         // the other rank of a send or receive; -1 otherwise
  bool operator==(const Action&) const = default;
};

// Per-rank action lists, indexed [j][k].
using ActionLists = std::vector<std::vector<Action>>;

// A schedule: where the stages are, and what each rank does in one training step.
struct Schedule {
  Placement placement;
  ActionLists lists;
  std::vector<Action>& operator[](size_t j) { return lists[j]; }
  const std::vector<Action>& operator[](size_t j) const { return lists[j]; }
  size_t size() const { return lists.size(); }
};

// The schedule a pipeline runs when none is named (train --schedule not given).
inline constexpr const char* kDefaultSchedule = "1f1b";

struct ScheduleSpec {
  std::string name = kDefaultSchedule;  // a generator's name (schedule_names())
  int stages = 1;             // p: pipeline ranks
  int micro_batches = 1;      // m
  int virtual_stages = 1;     // V: chunks per rank
};

// Generators the registry holds, for help texts and error messages: "gpipe, 1f1b, interleaved".
const std::vector<std::string>& schedule_names();
// The same joined by sep, for a flag's help and an unknown name's message.
std::string schedule_names_joined(const std::string& sep = ", ");
// Whether the registry holds a generator called name (what a flag checks before any work starts).
bool has_schedule(const std::string& name);

// Throws mt::InputError naming the flag values when the spec is not one make_schedule can build: an unknown
// name (the message lists the known ones), p, m, V < 1, or what the generator refuses.
void validate(const ScheduleSpec& spec);

// The whole schedule for every rank (validates first). The one function the executor needs. The lists are
// run through check_schedule (schedule_check.h) before they are returned: a generator whose list is incomplete,
// inconsistent with its placement or deadlocking throws ScheduleError naming the schedule, p, m, V and the rule.
Schedule make_schedule(const ScheduleSpec& spec);
class ScheduleGenerator;
// The same with a given generator instead of the registry's (spec.name is not looked up; spec is not validated).
Schedule make_schedule(const ScheduleSpec& spec, const ScheduleGenerator& generator);

// The placement the spec's generator chooses (validates first).
Placement placement_of(const ScheduleSpec& spec);

// Evaluation: forwards only, each rank's (i, c) in ascending micro-batch then stage order (so every wait is
// for a smaller (i, s), and the lists cannot deadlock), with the messages of step 2 and no optimizer step.
// Any placement and m (interleaved's m % p rule is about its backward order).
Schedule forward_only(const Placement& placement, int micro_batches);

// Step 1 alone: only the forward and backward actions, in order (validates first).
ActionLists compute_order(const ScheduleSpec& spec);

// Step 2 alone: adds messages and the optimizer step to per-rank compute orders by the rule above. The
// compute lists may be any order (a test builds broken ones); check_schedule judges the result.
Schedule with_communication(const Placement& placement, const ActionLists& compute);
// The same under the looped placement of spec's p and V.
Schedule with_communication(const ScheduleSpec& spec, const ActionLists& compute);

// ---- Messages ----
// The message a send or receive action refers to, named the same way on both ends: an activation goes from
// (i, from_stage) to (i, from_stage + 1), a gradient from (i, from_stage) to (i, from_stage - 1).
struct Message {
  bool grad = false;  // false: activation, true: gradient
  int micro_batch = -1;
  int from_stage = -1, to_stage = -1;
  int from_rank = -1, to_rank = -1;
  bool operator==(const Message&) const = default;
};
bool is_compute(ActionKind kind);   // forward, backward, backward_input, backward_weight
bool is_backward(ActionKind kind);  // backward, backward_input: what produces the input's gradient
bool is_send(ActionKind kind);      // send_act, send_grad
bool is_post(ActionKind kind);      // post_recv_act, post_recv_grad
bool is_wait(ActionKind kind);      // wait_recv_act, wait_recv_grad
// For a send, post or wait action `a` in rank `rank`'s list. MT_ASSERTs that `a` is one.
Message message_of(const Action& a, int rank, const Placement& placement);

// ---- Memory ----
// The most (micro-batch, chunk) activations a rank holds at once: forwards minus backwards (or weight
// gradients), maximised along its list. 1F1B keeps it at min(p - j, m) on rank j, GPipe at m.
int peak_in_flight(const std::vector<Action>& rank_actions);

// ---- Printing ----
const char* to_string(ActionKind kind);  // "forward", "send_act", ...
std::string to_string(const Action& a);  // "forward(i=3, c=1)", "send_act(i=3, c=0, to=1)", "optimizer_step"
// The compute order in short form: "F0 F1 B0 F2 B1 B2" (I and W for the halves of a split backward); with
// V > 1 the chunk follows a c ("F0c1").
std::string compute_summary(const std::vector<Action>& rank_actions, int virtual_stages);

}  // namespace mt::pipeline
