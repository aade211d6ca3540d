#include "parallel/pipeline/schedule.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "parallel/pipeline/schedule_check.h"
#include "parallel/pipeline/schedule_generator.h"

namespace mt::pipeline {

namespace {

// Keeps every list small enough to hold and replay at once (about 5 actions per (i, s) pair).
constexpr int64_t kMaxComputePairs = 1'000'000;

}  // namespace

void validate(const ScheduleSpec& spec) {
  const ScheduleGenerator& gen = find_schedule(spec.name);
  const int p = spec.stages, m = spec.micro_batches, V = spec.virtual_stages;
  MT_CHECK_INPUT(p >= 1, "pipeline schedule ", spec.name, ": the number of stages p must be at least 1, got ", p);
  MT_CHECK_INPUT(m >= 1, "pipeline schedule ", spec.name, ": the number of micro-batches m must be at least 1, got ",
                 m);
  MT_CHECK_INPUT(V >= 1, "pipeline schedule ", spec.name,
                 ": the number of virtual stages V (chunks per rank) must be at least 1, got ", V);
  MT_CHECK_INPUT((int64_t)p * V * m <= kMaxComputePairs, "pipeline schedule ", spec.name, ": p * V * m = ", p, " * ",
                 V, " * ", m, " = ", (int64_t)p * V * m, " (micro-batch, stage) pairs is more than the ",
                 kMaxComputePairs, " a schedule may hold");
  gen.validate(spec);
}

Placement placement_of(const ScheduleSpec& spec) {
  validate(spec);
  return find_schedule(spec.name).placement(spec);
}

ActionLists compute_order(const ScheduleSpec& spec) {
  const Placement placement = placement_of(spec);
  return find_schedule(spec.name).compute_order(spec, placement);
}

Schedule with_communication(const Placement& placement, const ActionLists& compute) {
  const int p = placement.ranks(), V = placement.chunks(), S = placement.stages();
  MT_ASSERT((int)compute.size() == p, "compute orders for ", compute.size(), " ranks, the placement has p = ", p);
  Schedule out{placement, ActionLists((size_t)p)};
  for (int j = 0; j < p; j++) {
    // The rank holding stage s of micro-batch i, when it is another rank than j (else -1: in memory).
    auto other = [&](int i, int s) {
      const int r = placement.slot(i, s).rank;
      return r == j ? -1 : r;
    };
    // The wait for x's input, when x's input comes from another rank.
    auto input_wait = [&](const Action& x) -> std::optional<Action> {
      const int s = placement.stage_of(j, x.chunk), i = x.micro_batch;
      if (x.kind == ActionKind::forward && s > 0 && other(i, s - 1) >= 0)
        return Action{ActionKind::wait_recv_act, i, x.chunk, other(i, s - 1)};
      if (is_backward(x.kind) && s < S - 1 && other(i, s + 1) >= 0)
        return Action{ActionKind::wait_recv_grad, i, x.chunk, other(i, s + 1)};
      return std::nullopt;
    };
    auto post_of = [](Action w) {
      w.kind = w.kind == ActionKind::wait_recv_act ? ActionKind::post_recv_act : ActionKind::post_recv_grad;
      return w;
    };
    // The send of x's output, when another rank needs it.
    auto output_send = [&](const Action& x) -> std::optional<Action> {
      const int s = placement.stage_of(j, x.chunk), i = x.micro_batch;
      if (x.kind == ActionKind::forward && s < S - 1 && other(i, s + 1) >= 0)
        return Action{ActionKind::send_act, i, x.chunk, other(i, s + 1)};
      if (is_backward(x.kind) && s > 0 && other(i, s - 1) >= 0)
        return Action{ActionKind::send_grad, i, x.chunk, other(i, s - 1)};
      return std::nullopt;
    };

    // A compute order may hold per-micro-batch updates (optimizer_step(i), schedules/pipedream.cpp): they
    // pass through where they stand, after the send of the computation before them; then the list has no
    // step-end update.
    const std::vector<Action>& all = compute[j];
    std::vector<Action> xs;
    std::vector<std::vector<Action>> updates_after(all.size() + 1);  // per computation k: the updates after it
    bool micro_updates = false;
    for (const Action& x : all) {
      if (x.kind == ActionKind::optimizer_step && x.micro_batch >= 0) {
        MT_ASSERT(!xs.empty(), "an update before any computation: ", to_string(x));
        updates_after[xs.size() - 1].push_back(x);
        micro_updates = true;
        continue;
      }
      MT_ASSERT(is_compute(x.kind) && x.chunk >= 0 && x.chunk < V, "not a computation: ", to_string(x));
      xs.push_back(x);
    }
    std::vector<Action>& list = out.lists[j];
    if (!xs.empty())
      if (auto w = input_wait(xs[0])) list.push_back(post_of(*w));
    for (size_t k = 0; k < xs.size(); k++) {
      if (auto w = input_wait(xs[k])) list.push_back(*w);
      if (k + 1 < xs.size())
        if (auto w = input_wait(xs[k + 1])) list.push_back(post_of(*w));
      list.push_back(xs[k]);
      if (auto snd = output_send(xs[k])) list.push_back(*snd);
      for (const Action& u : updates_after[k]) list.push_back(u);
    }
    if (!micro_updates) list.push_back(Action{ActionKind::optimizer_step, -1, -1, -1});
  }
  return out;
}

Schedule with_communication(const ScheduleSpec& spec, const ActionLists& compute) {
  return with_communication(Placement::looped(spec.stages, spec.virtual_stages), compute);
}

Schedule make_schedule(const ScheduleSpec& spec) {
  validate(spec);
  return make_schedule(spec, find_schedule(spec.name));
}

Schedule make_schedule(const ScheduleSpec& spec, const ScheduleGenerator& generator) {
  const Placement placement = generator.placement(spec);
  Schedule out = with_communication(placement, generator.compute_order(spec, placement));
  // A generator's list that breaks the rules (incomplete, against its own placement, or deadlocking) is caught
  // here, where the schedule is built, not at run time in a wait that never ends.
  try {
    check_schedule(spec, out);
  } catch (const ScheduleError& e) {
    throw ScheduleError(str("pipeline schedule ", generator.name(), " (p = ", spec.stages, ", m = ",
                            spec.micro_batches, ", V = ", spec.virtual_stages,
                            ") built a list that fails the schedule check: ", e.what()));
  }
  return out;
}

Schedule forward_only(const Placement& placement, int micro_batches) {
  MT_CHECK_INPUT(micro_batches >= 1, "a forward-only schedule needs m >= 1, got m = ", micro_batches);
  const int p = placement.ranks();
  ActionLists compute((size_t)p);
  for (int i = 0; i < micro_batches; i++)
    for (int s = 0; s < placement.stages(); s++) {
      const Slot& x = placement.slot(i, s);
      compute[x.rank].push_back({ActionKind::forward, i, x.chunk, -1});
    }
  Schedule out = with_communication(placement, compute);
  for (auto& list : out.lists) list.pop_back();  // no optimizer step
  return out;
}

bool is_compute(ActionKind k) { return k == ActionKind::forward || is_backward(k) || k == ActionKind::backward_weight; }
bool is_backward(ActionKind k) { return k == ActionKind::backward || k == ActionKind::backward_input; }
bool is_send(ActionKind k) { return k == ActionKind::send_act || k == ActionKind::send_grad; }
bool is_post(ActionKind k) { return k == ActionKind::post_recv_act || k == ActionKind::post_recv_grad; }
bool is_wait(ActionKind k) { return k == ActionKind::wait_recv_act || k == ActionKind::wait_recv_grad; }

Message message_of(const Action& a, int rank, const Placement& placement) {
  MT_ASSERT(is_send(a.kind) || is_post(a.kind) || is_wait(a.kind), "not a message action: ", to_string(a));
  Message msg;
  const int s = placement.stage_of(rank, a.chunk);
  switch (a.kind) {
    case ActionKind::send_act: msg = {false, a.micro_batch, s, s + 1}; break;
    case ActionKind::post_recv_act:
    case ActionKind::wait_recv_act: msg = {false, a.micro_batch, s - 1, s}; break;
    case ActionKind::send_grad: msg = {true, a.micro_batch, s, s - 1}; break;
    default: msg = {true, a.micro_batch, s + 1, s}; break;  // post_recv_grad, wait_recv_grad
  }
  MT_ASSERT(msg.from_stage >= 0 && msg.to_stage >= 0 && msg.from_stage < placement.stages() &&
                msg.to_stage < placement.stages(),
            "no stage at the other end of ", to_string(a), " on rank ", rank);
  msg.from_rank = placement.slot(a.micro_batch, msg.from_stage).rank;
  msg.to_rank = placement.slot(a.micro_batch, msg.to_stage).rank;
  return msg;
}

int peak_in_flight(const std::vector<Action>& rank_actions) {
  int live = 0, peak = 0;
  for (const Action& a : rank_actions) {
    if (a.kind == ActionKind::forward) peak = std::max(peak, ++live);
    if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_weight) live--;
  }
  return peak;
}

const char* to_string(ActionKind kind) {
  switch (kind) {
    case ActionKind::forward: return "forward";
    case ActionKind::backward: return "backward";
    case ActionKind::send_act: return "send_act";
    case ActionKind::post_recv_act: return "post_recv_act";
    case ActionKind::wait_recv_act: return "wait_recv_act";
    case ActionKind::send_grad: return "send_grad";
    case ActionKind::post_recv_grad: return "post_recv_grad";
    case ActionKind::wait_recv_grad: return "wait_recv_grad";
    case ActionKind::optimizer_step: return "optimizer_step";
    case ActionKind::backward_input:
      return "backward_input";
    case ActionKind::backward_weight:
      return "backward_weight";
  }
  return "?";
}

std::string to_string(const Action& a) {
  if (a.kind == ActionKind::optimizer_step)
    return a.micro_batch < 0 ? "optimizer_step" : str("optimizer_step(i=", a.micro_batch, ", c=", a.chunk, ")");
  std::string s = str(to_string(a.kind), "(i=", a.micro_batch, ", c=", a.chunk);
  if (is_send(a.kind)) s += str(", to=", a.peer);
  if (is_post(a.kind) || is_wait(a.kind)) s += str(", from=", a.peer);
  if (is_compute(a.kind) && a.peer != -1) s += str(", peer=", a.peer);  // only in broken lists
  return s + ")";
}

std::string compute_summary(const std::vector<Action>& rank_actions, int virtual_stages) {
  std::string s;
  for (const Action& a : rank_actions) {
    if (!is_compute(a.kind)) continue;
    if (!s.empty()) s += ' ';
    const char* letter = a.kind == ActionKind::forward           ? "F"
                         : a.kind == ActionKind::backward_input  ? "I"
                         : a.kind == ActionKind::backward_weight ? "W"
                                                                 : "B";
    s += str(letter, a.micro_batch);
    if (virtual_stages > 1) s += str("c", a.chunk);
  }
  return s;
}

}  // namespace mt::pipeline
