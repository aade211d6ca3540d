#include "parallel/pipeline/micro_window.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "core/error.h"
#include "parallel/pipeline/no_flush.h"
#include "parallel/pipeline/schedule_check.h"
#include "parallel/pipeline/schedule_generator.h"

namespace mt::pipeline {

namespace {

bool is_micro_update(const Action& a) { return a.kind == ActionKind::optimizer_step && a.micro_batch >= 0; }

void check_spec(const ScheduleSpec& spec, int steps) {
  MT_CHECK_INPUT(steps >= 1, "a pipeline window needs at least one step, got ", steps);
  MT_CHECK_INPUT(find_schedule(spec.name).micro_updates() != ScheduleGenerator::MicroUpdates::none,
                 "only schedules that update after every micro-batch (pipedream, pipemare) run this window, not ",
                 spec.name);
  MT_CHECK_INPUT(spec.virtual_stages == 1,
                 "a window of per-micro-batch updates runs one chunk per rank, got V = ", spec.virtual_stages);
  validate(window_spec(spec, steps));
}

}  // namespace

Schedule micro_window_schedule(const ScheduleSpec& spec, int steps) {
  check_spec(spec, steps);
  return make_schedule(window_spec(spec, steps));
}

void check_micro_window(const ScheduleSpec& spec, int steps, const Schedule& window) {
  check_spec(spec, steps);
  const ScheduleSpec ws = window_spec(spec, steps);
  const int p = spec.stages, n = ws.micro_batches;
  if ((int)window.size() != p)
    throw ScheduleError(str("the window has ", window.size(), " lists for p = ", p, " ranks"));
  check_schedule(ws, window);

  // Per rank: U(0) .. U(n - 1) in order, each right after its backward (and that backward's send).
  std::vector<std::vector<size_t>> at((size_t)p, std::vector<size_t>((size_t)n, 0));  // [j][i]: index of U(i)
  for (int j = 0; j < p; j++) {
    const std::vector<Action>& list = window[j];
    int next = 0;
    for (size_t k = 0; k < list.size(); k++) {
      const Action& a = list[k];
      if (!is_micro_update(a)) continue;
      auto fail = [&](const auto&... msg) {
        throw ScheduleError(str("rank ", j, ", action ", k, " (", to_string(a), "): ", msg...));
      };
      if (a.micro_batch != next) fail("expected the update of micro-batch ", next, " (updates in backward order)");
      size_t b = k;
      while (b > 0 && is_send(list[b - 1].kind) && list[b - 1].micro_batch == a.micro_batch) b--;
      if (b == 0 || list[b - 1].kind != ActionKind::backward || list[b - 1].micro_batch != a.micro_batch)
        fail("not right after the backward of micro-batch ", a.micro_batch, " (and its send)");
      at[j][next++] = k;
    }
    if (next != n) throw ScheduleError(str("rank ", j, ": ", next, " updates in a window of ", n, " micro-batches"));
  }

  // Replay with U(i) collective: it ends once every rank has reached its U(i).
  replay_window(
      window, is_micro_update,
      [&](int j, const std::vector<size_t>& pc) {
        const int i = window[j][pc[j]].micro_batch;
        for (int r = 0; r < p; r++)
          if (pc[r] < at[r][i]) return true;
        return false;
      },
      [](int, const Action&) {},
      [](const Action&) { return std::string("every rank's update of that micro-batch (the norm)"); });
}

std::vector<int> stash_depths(const Schedule& window, bool stashed, const std::vector<int>& vsync) {
  std::vector<int> out;
  for (size_t j = 0; j < window.size(); j++) {
    int done = 0, peak = 0;
    std::map<int, int> in_flight;  // micro-batch -> the version it reads
    auto look = [&] {
      std::set<int> live{done};
      if (stashed || !vsync.empty())
        for (const auto& [i, v] : in_flight) live.insert(v);
      peak = std::max(peak, (int)live.size());
    };
    for (const Action& a : window[j]) {
      if (a.kind == ActionKind::forward) {
        in_flight[a.micro_batch] = vsync.empty() ? done : vsync.at((size_t)a.micro_batch);
        look();
      } else if (a.kind == ActionKind::backward) {
        look();  // still in flight while its backward reads its version
        in_flight.erase(a.micro_batch);
      } else if (is_micro_update(a)) {
        done++;
        look();
      }
    }
    out.push_back(peak);
  }
  return out;
}

std::vector<int> in_flight_counts(const Schedule& window) {
  std::vector<int> out;
  for (size_t j = 0; j < window.size(); j++) out.push_back(peak_in_flight(window[j]));
  return out;
}

}  // namespace mt::pipeline
