#include "plan/window_replay.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "parallel/pipeline/schedule_check.h"

namespace mt::plan {

std::string replay_window_lists(const pipeline::Schedule& window, double comm, const WindowReplayParts& parts,
                                SimResult& r) {
  using pipeline::Action;
  const int p = (int)window.size();
  using Msg = std::tuple<bool, int, int>;  // grad, micro-batch, from stage
  std::map<Msg, double> sent_at, posted_at;
  auto key = [&](const Action& a, int j) {
    const pipeline::Message msg = pipeline::message_of(a, j, window.placement);
    return Msg{msg.grad, msg.micro_batch, msg.from_stage};
  };

  r.placement = window.placement;
  r.boxes.resize(p);
  r.finish.assign(p, 0.0);
  r.busy_per_rank.assign(p, 0.0);
  std::vector<size_t> pc((size_t)p, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int j = 0; j < p; j++) {
      double& now = r.finish[j];
      for (; pc[j] < window[j].size(); pc[j]++) {
        const Action& a = window[j][pc[j]];
        if (parts.computes(a.kind)) {
          const double d = parts.duration(j, a);
          r.boxes[j].push_back({now, now + d, a.kind, a.micro_batch, a.chunk});
          r.busy_per_rank[j] += d;
          now += d;
          if (parts.computed) parts.computed(j, a, now);
        } else if (pipeline::is_send(a.kind)) {
          sent_at[key(a, j)] = now;
        } else if (pipeline::is_post(a.kind)) {
          posted_at[key(a, j)] = now;
        } else if (pipeline::is_wait(a.kind)) {
          auto s = sent_at.find(key(a, j));
          if (s == sent_at.end()) break;
          now = std::max(now, std::max(s->second, posted_at.at(key(a, j))) + comm);
        } else if (a.kind == pipeline::ActionKind::optimizer_step) {
          if (!parts.update(j, a, now)) break;
        }
        progress = true;
      }
    }
  }
  std::string stuck;
  for (int j = 0; j < p; j++) {
    if (pc[j] < window[j].size())
      stuck += str(stuck.empty() ? "" : "; ", "rank ", j, " at action ", pc[j], " (",
                   pipeline::to_string(window[j][pc[j]]), ")");
    r.makespan = std::max(r.makespan, r.finish[j]);
    r.busy += r.busy_per_rank[j];
  }
  r.utilization = r.makespan > 0 ? r.busy / (p * r.makespan) : 1.0;
  r.bubble_fraction = 1.0 - r.utilization;
  return stuck;
}

}  // namespace mt::plan
