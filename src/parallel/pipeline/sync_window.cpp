#include "parallel/pipeline/sync_window.h"

#include <set>
#include <string>
#include <tuple>

#include "core/error.h"
#include "parallel/pipeline/no_flush.h"
#include "parallel/pipeline/schedule_check.h"

namespace mt::pipeline {

namespace {

void check_spec(const ScheduleSpec& spec, int steps) {
  MT_CHECK_INPUT(steps >= 1, "a back-to-back window needs at least one step, got ", steps);
  std::string why;
  MT_CHECK_INPUT(sync_window_applies(spec, &why), "--schedule ", spec.name, " cannot run steps back to back: ", why);
  validate(window_spec(spec, steps));
}

}  // namespace

bool sync_window_applies(const ScheduleSpec& spec, std::string* reason) {
  auto no = [&](const std::string& why) {
    if (reason) *reason = why;
    return false;
  };
  if (spec.name != "1f1b" && spec.name != "zb-h1" && spec.name != "zb-h2")
    return no("only the one-chunk synchronous schedules 1f1b, zb-h1 and zb-h2 have a back-to-back window (" +
              spec.name + " does not)");
  if (spec.virtual_stages != 1) return no(str(spec.virtual_stages, " chunks per rank (one needed)"));
  return true;
}

Schedule sync_window_schedule(const ScheduleSpec& spec, int steps) {
  check_spec(spec, steps);
  const int m = spec.micro_batches;
  const Schedule one = make_schedule(spec);
  Schedule out{one.placement, ActionLists(one.size())};
  for (size_t j = 0; j < one.size(); j++) {
    MT_ASSERT(!one[j].empty() && (one[j].back() == Action{ActionKind::optimizer_step, -1, -1, -1}),
              "a one-step list without its step-end update as its last action");
    for (int t = 0; t < steps; t++)
      for (Action a : one[j]) {
        if (a.kind == ActionKind::optimizer_step) {
          MT_ASSERT(a.micro_batch < 0, "a per-micro-batch update in a synchronous list");
          a = step_update(t, m);
        } else {
          MT_ASSERT(a.micro_batch >= 0 && a.micro_batch < m, "an action without its micro-batch: ", to_string(a));
          a.micro_batch += t * m;
        }
        out.lists[j].push_back(a);
      }
  }
  return out;
}

void check_sync_window(const ScheduleSpec& spec, int steps, const Schedule& window) {
  check_spec(spec, steps);
  check_step_update_lists(spec, steps, window);
  const int p = spec.stages, m = spec.micro_batches;

  // Per rank: the updates in order, every computation of step t between U(t - 1) and U(t).
  std::vector<std::vector<int>> computations((size_t)p, std::vector<int>((size_t)steps, 0));  // [j][t]
  for (int j = 0; j < p; j++) {
    const std::vector<Action>& list = window[j];
    int updated = 0;  // U(0) .. U(updated - 1) have run
    for (size_t k = 0; k < list.size(); k++) {
      const Action& a = list[k];
      auto fail = [&](const auto&... msg) {
        throw ScheduleError(str("rank ", j, ", action ", k, " (", to_string(a), "): ", msg...));
      };
      if (is_step_update(a)) {
        if (a.micro_batch % m != m - 1 || a.micro_batch / m != updated)
          fail("expected the update of step ", updated, " (optimizer_step(i = ", updated * m + m - 1, "))");
        updated++;
      } else if (is_compute(a.kind)) {
        const int t = a.micro_batch / m;
        if (t < updated)
          fail("a computation of step ", t, " after the update of step ", updated - 1,
               ": the update must follow every computation of its step on the rank (the last W adds to g_t)");
        if (t > updated)
          fail("a computation of step ", t, " before the update of step ", updated,
               ": it would read weights the update has not made");
        computations[j][t]++;
      }
    }
    if (updated != steps) throw ScheduleError(str("rank ", j, ": ", updated, " step updates for a window of ", steps, " steps"));
    if (list.empty() || !is_step_update(list.back()))
      throw ScheduleError(str("rank ", j, ": the window does not end with a step update"));
  }

  // Replay under the norm rule: U(t) ends once every rank has run all its computations of step t.
  std::vector<std::vector<int>> ran((size_t)p, std::vector<int>((size_t)steps, 0));
  std::vector<int> pending((size_t)steps, 0);  // ranks not yet done with step t's computations
  for (int t = 0; t < steps; t++)
    for (int j = 0; j < p; j++) pending[t] += computations[j][t] > 0 ? 1 : 0;
  replay_window(
      window, is_step_update,
      [&](int j, const std::vector<size_t>& pc) { return pending[window[j][pc[j]].micro_batch / m] > 0; },
      [&](int j, const Action& a) {
        if (!is_compute(a.kind)) return;
        const int t = a.micro_batch / m;
        if (++ran[j][t] == computations[j][t]) pending[t]--;
      },
      [&](const Action& a) {
        return str("the norm of step ", a.micro_batch / m, " (every rank's computations of that step)");
      });
}

}  // namespace mt::pipeline
