#include "parallel/pipeline/no_flush.h"

#include <algorithm>
#include <cstddef>
#include <set>
#include <tuple>

#include "core/error.h"
#include "parallel/pipeline/schedule_check.h"

namespace mt::pipeline {

namespace {

// The step of window micro-batch i.
int step_of(int i, int m) { return i / m; }

void check_spec(const ScheduleSpec& spec, int steps) {
  MT_CHECK_INPUT(steps >= 1, "a pipeline window needs at least one step, got ", steps);
  MT_CHECK_INPUT(spec.name == "pipedream-2bw", "only pipedream-2bw runs steps without a flush, not ", spec.name);
  validate(window_spec(spec, steps));
}

}  // namespace

ScheduleSpec window_spec(const ScheduleSpec& spec, int steps) {
  ScheduleSpec w = spec;
  w.micro_batches = spec.micro_batches * steps;
  return w;
}

Action step_update(int step, int micro_batches) {
  return {ActionKind::optimizer_step, step * micro_batches + micro_batches - 1, -1, -1};
}

bool is_step_update(const Action& a) { return a.kind == ActionKind::optimizer_step && a.chunk == -1 && a.micro_batch >= 0; }

ActionLists no_flush_compute_order(const ScheduleSpec& spec, int steps) {
  check_spec(spec, steps);
  const int p = spec.stages, m = spec.micro_batches, n = m * steps;
  ActionLists out((size_t)p);
  for (int j = 0; j < p; j++) {
    const int w = p - j - 1;
    std::vector<Action>& o = out[j];
    int b = 0;  // backwards so far
    for (int i = 0; i < n; i++) {
      const int nb = std::max({0, i - w, (step_of(i, m) - 1) * m});
      while (b < nb) o.push_back({ActionKind::backward, b++, 0, -1});
      o.push_back({ActionKind::forward, i, 0, -1});
    }
    while (b < n) o.push_back({ActionKind::backward, b++, 0, -1});
  }
  return out;
}

Schedule no_flush_schedule(const ScheduleSpec& spec, int steps) {
  const ActionLists compute = no_flush_compute_order(spec, steps);
  const int m = spec.micro_batches;
  Schedule s = with_communication(Placement::looped(spec.stages, 1), compute);
  for (std::vector<Action>& list : s.lists) {
    MT_ASSERT(!list.empty() && list.back().kind == ActionKind::optimizer_step, "a list without its step-end update");
    list.pop_back();
    std::vector<Action> out;
    int next = 0;  // the next step to update
    for (const Action& a : list) {
      if (a.kind == ActionKind::forward && step_of(a.micro_batch, m) - 2 >= next) {
        // U(t) before the first forward of step t + 2, ahead of that forward's wait for its input and the posts
        // standing right before it.
        size_t pos = out.size();
        while (pos > 0 && (is_post(out[pos - 1].kind) ||
                           (out[pos - 1].kind == ActionKind::wait_recv_act && out[pos - 1].micro_batch == a.micro_batch)))
          pos--;
        std::vector<Action> us;
        while (next <= step_of(a.micro_batch, m) - 2) us.push_back(step_update(next++, m));
        out.insert(out.begin() + (std::ptrdiff_t)pos, us.begin(), us.end());
      }
      out.push_back(a);
    }
    while (next < steps) out.push_back(step_update(next++, m));
    list = std::move(out);
  }
  return s;
}

Schedule without_step_updates(const Schedule& window) {
  Schedule s{window.placement, ActionLists(window.size())};
  for (size_t j = 0; j < window.size(); j++) {
    for (const Action& a : window[j])
      if (!is_step_update(a) && a.kind != ActionKind::optimizer_step) s.lists[j].push_back(a);
    s.lists[j].push_back({ActionKind::optimizer_step, -1, -1, -1});
  }
  return s;
}

void check_step_update_lists(const ScheduleSpec& spec, int steps, const Schedule& window) {
  const int p = spec.stages;
  if ((int)window.size() != p) throw ScheduleError(str("the window has ", window.size(), " lists for p = ", p, " ranks"));
  // A step-end update or a per-micro-batch one has no place in a window.
  for (int j = 0; j < p; j++)
    for (size_t k = 0; k < window[j].size(); k++)
      if (window[j][k].kind == ActionKind::optimizer_step && !is_step_update(window[j][k]))
        throw ScheduleError(str("rank ", j, ", action ", k, " (", to_string(window[j][k]),
                                "): a window holds only step updates optimizer_step(i = t m + m - 1, c = -1)"));
  try {
    check_schedule(window_spec(spec, steps), without_step_updates(window));
  } catch (const ScheduleError& e) {
    throw ScheduleError(str("the window without its step updates: ", e.what()));
  }
}

void check_no_flush(const ScheduleSpec& spec, int steps, const Schedule& window) {
  check_spec(spec, steps);
  check_step_update_lists(spec, steps, window);
  const int p = spec.stages, m = spec.micro_batches;

  // Per rank: the updates' order and the two-version rule.
  std::vector<std::vector<int>> step_backwards((size_t)p, std::vector<int>((size_t)steps, 0));  // [j][t]
  for (int j = 0; j < p; j++)
    for (const Action& a : window[j])
      if (is_backward(a.kind)) step_backwards[j][step_of(a.micro_batch, m)]++;
  for (int j = 0; j < p; j++) {
    const std::vector<Action>& list = window[j];
    std::vector<int> done((size_t)steps, 0);  // backwards of step t run so far
    int updated = 0;                          // U(0) .. U(updated - 1) have run
    for (size_t k = 0; k < list.size(); k++) {
      const Action& a = list[k];
      auto fail = [&](const auto&... msg) {
        throw ScheduleError(str("rank ", j, ", action ", k, " (", to_string(a), "): ", msg...));
      };
      if (is_step_update(a)) {
        if (a.micro_batch % m != m - 1 || step_of(a.micro_batch, m) != updated)
          fail("expected the update of step ", updated, " (optimizer_step(i = ", updated * m + m - 1, "))");
        if (done[updated] != step_backwards[j][updated])
          fail("the update of step ", updated, " before the rank's last backward of that step (", done[updated], " of ",
               step_backwards[j][updated], " run): they read W(t-1), which the update overwrites");
        updated++;
      } else if (a.kind == ActionKind::forward) {
        const int t = step_of(a.micro_batch, m);
        if (t >= 2 && updated < t - 1)
          fail("a forward of step ", t, " before the update of step ", t - 2,
               " made W(", t - 1, "): a third weight version");
      } else if (is_backward(a.kind)) {
        done[step_of(a.micro_batch, m)]++;
      }
    }
    if (updated != steps) throw ScheduleError(str("rank ", j, ": ", updated, " step updates for a window of ", steps, " steps"));
    if (list.empty() || !is_step_update(list.back()))
      throw ScheduleError(str("rank ", j, ": the window does not end with a step update (the drain)"));
  }

  // Replay with U(t) waiting for every rank's backwards of step t (g_t's global norm).
  std::vector<std::vector<int>> ran((size_t)p, std::vector<int>((size_t)steps, 0));  // backwards of step t run
  std::vector<int> pending((size_t)steps, 0);  // ranks not yet done with step t's backwards
  for (int t = 0; t < steps; t++)
    for (int j = 0; j < p; j++) pending[t] += step_backwards[j][t] > 0 ? 1 : 0;
  replay_window(
      window, is_step_update,
      [&](int j, const std::vector<size_t>& pc) { return pending[step_of(window[j][pc[j]].micro_batch, m)] > 0; },
      [&](int j, const Action& a) {
        if (!is_backward(a.kind)) return;
        const int t = step_of(a.micro_batch, m);
        if (++ran[j][t] == step_backwards[j][t]) pending[t]--;
      },
      [&](const Action& a) {
        return str("the norm of step ", step_of(a.micro_batch, m), " (every rank's backwards of that step)");
      });
}

void replay_window(const Schedule& window, const std::function<bool(const Action&)>& is_update,
                   const std::function<bool(int j, const std::vector<size_t>& pc)>& update_held,
                   const std::function<void(int j, const Action& a)>& ran,
                   const std::function<std::string(const Action&)>& update_waits_for) {
  const int p = (int)window.size();
  using Msg = std::tuple<bool, int, int, int>;  // grad, micro-batch, from stage, to stage
  std::set<Msg> sent;
  auto msg_key = [&](const Action& a, int j) {
    const Message msg = message_of(a, j, window.placement);
    return Msg{msg.grad, msg.micro_batch, msg.from_stage, msg.to_stage};
  };
  std::vector<size_t> pc((size_t)p, 0);
  auto blocked = [&](int j) {
    const Action& a = window[j][pc[j]];
    if (is_wait(a.kind)) return sent.count(msg_key(a, j)) == 0;
    return is_update(a) && update_held(j, pc);
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int j = 0; j < p; j++) {
      while (pc[j] < window[j].size() && !blocked(j)) {
        const Action& a = window[j][pc[j]];
        if (is_send(a.kind)) sent.insert(msg_key(a, j));
        ran(j, a);
        pc[j]++;
        progress = true;
      }
    }
  }
  std::string stuck;
  for (int j = 0; j < p; j++) {
    if (pc[j] == window[j].size()) continue;
    const Action& a = window[j][pc[j]];
    stuck += str(stuck.empty() ? "" : "; ", "rank ", j, ", action ", pc[j], " (", to_string(a), ") waits for ",
                 is_update(a) ? update_waits_for(a) : std::string("its message"));
  }
  if (!stuck.empty()) throw ScheduleError("deadlock: " + stuck);
}

}  // namespace mt::pipeline
