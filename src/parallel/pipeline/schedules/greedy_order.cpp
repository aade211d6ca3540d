// The unit-time greedy list scheduler that zb-v and chimera share (schedule_generator.h): at each unit every rank
// that the rule gives an action starts it; each action takes one unit, messages are free. The builder keeps the
// state (what has run, when it ended, micro-batches in flight, the weight halves owed); the rule only chooses.
#include <algorithm>

#include "core/error.h"
#include "parallel/pipeline/schedule_generator.h"

namespace mt::pipeline {

GreedyState::GreedyState(int micro_batches, const Placement& placement)
    : S_(placement.stages()),
      f_end_((size_t)micro_batches * placement.stages(), kNever),
      b_end_((size_t)micro_batches * placement.stages(), kNever),
      next_f_((size_t)placement.ranks() * placement.chunks(), 0),
      next_b_((size_t)placement.ranks() * placement.chunks(), 0),
      live_((size_t)placement.ranks(), 0),
      pending_((size_t)placement.ranks()),
      pl_(placement) {}

void GreedyState::apply(int j, const Action& a) {
  const int s = pl_.stage_of(j, a.chunk);
  const size_t jc = (size_t)j * pl_.chunks() + a.chunk, is = (size_t)a.micro_batch * S_ + s;
  switch (a.kind) {
    case ActionKind::forward:
      next_f_[jc]++;
      f_end_[is] = t_ + 1;
      live_[j]++;
      break;
    case ActionKind::backward_input:
      next_b_[jc]++;
      b_end_[is] = t_ + 1;
      pending_[j].push_back({ActionKind::backward_weight, a.micro_batch, a.chunk, -1});
      break;
    case ActionKind::backward:
      next_b_[jc]++;
      b_end_[is] = t_ + 1;
      live_[j]--;
      break;
    case ActionKind::backward_weight: {
      auto& q = pending_[j];
      auto it = std::find(q.begin(), q.end(), a);
      MT_ASSERT(it != q.end(), "greedy order: a weight half with no input half before it: ", to_string(a));
      q.erase(it);
      live_[j]--;
      break;
    }
    default:
      MT_ASSERT(false, "greedy order: not a computation: ", to_string(a));
  }
}

ActionLists greedy_order(const char* name, const Placement& placement, int micro_batches, long actions,
                         const GreedyRule& rule, long* units) {
  const int p = placement.ranks();
  GreedyState st(micro_batches, placement);
  ActionLists out((size_t)p);
  long done = 0, end = 0;
  for (st.t_ = 0; done < actions; st.t_++) {
    if (st.t_ > actions * 4) {  // the rule left every rank idle for good
      if (units) {
        *units = -1;
        return {};
      }
      MT_ASSERT(false, name, ": the greedy order made no progress");
    }
    for (int j = 0; j < p; j++) {
      const std::optional<Action> a = rule(j, st);
      if (!a) continue;
      st.apply(j, *a);
      out[j].push_back(*a);
      done++;
      end = st.t_ + 1;
    }
  }
  if (units) *units = end;
  return out;
}

}  // namespace mt::pipeline
