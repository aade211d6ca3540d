// ZB-V (zero-bubble pipeline parallelism, the V-shaped schedule): two chunks per rank placed in a V, rank j
// holding stages j (chunk 0) and 2p - 1 - j (chunk 1), so a micro-batch goes down the ranks and back up, rank 0
// holds both ends and rank p - 1 the turn (handed over in memory); the backward split in I and W as in ZB-H1.
//
// The order on each rank is what a greedy list scheduler does with every chunk's F, I and W taking one unit of
// time and messages free: at each unit every free rank starts the first it may start of five choices taken in
// a priority order: I1, I0 (an input half of chunk 1 or 0 whose output gradient is here), F1, F0 (a forward
// whose input is here, if the rank holds fewer than 2p (micro-batch, chunk) pairs in flight, F to W) and W (its
// oldest pending weight half). The cap 2p is 1F1B's activation memory (p micro-batches of a whole stage, a
// chunk being half a stage); each chunk's I's, and so its W's, run in ascending micro-batch order. Every
// priority order with F1 before F0 is tried (60; F0 first fills the cap with chunk 0's forwards and stalls), and
// the list kept is the shortest under the unit costs, then the one with the fewest messages on its critical
// path (the least growth with message latency: at p = 4, m = 8 it has 20 against 34 for the first shortest one
// found; turn-over at rank p - 1 is no message), then the first in permutation order of I1 I0 F1 F0 W.
// No one order is best everywhere. With F = B = W no schedule ends before (p - 1) F / 2 + m (F + B + W) (rank
// p - 1 waits for p - 1 chunk forwards); the simulator's tests (tests/pipeline/zero_bubble_test.cpp) show the
// kept list at that bound for p <= 4 (m >= p) and within F / 2 of it at p = 5: at p = 4, m = 8 it idles 1.5 F
// per rank against ZB-H1's 3 and 1F1B's 9 (step 25.5 F against 1F1B's 33 F: 0.773x). The search covers these
// priority orders only; it is not proven optimal among all lists. At m <= p the kept list may hold fewer than
// 2p pairs on some ranks (in_flight_bound.h). The builder (greedy_order, schedule_generator.h) is shared with
// chimera; the rule below is what zb-v chooses.
//
// Rank 0 holds both ends of the model: the GPT task gives its two chunks one tied wte (no tie group to sum
// over); ZeRO 2 and 3 are refused with it (train_config.cpp).
//
//   p = 2, m = 2 (compute order; Fic = forward of micro-batch i on chunk c):
//     j=0  F0c0 F1c0 F0c1 I0c1 F1c1 I1c1 I0c0 W0c1 I1c0 W1c1 W0c0 W1c0
//     j=1  F0c0 F0c1 F1c0 F1c1 I0c1 I0c0 I1c1 I1c0 W0c1 W0c0 W1c1 W1c0
#include <algorithm>
#include <array>
#include <optional>
#include <utility>
#include <vector>

#include "core/error.h"
#include "parallel/pipeline/schedule_generator.h"

namespace mt::pipeline {

namespace {

class ZbV : public ScheduleGenerator {
 public:
  const char* name() const override { return "zb-v"; }
  void validate(const ScheduleSpec& spec) const override {
    MT_CHECK_INPUT(spec.virtual_stages == 2, "pipeline schedule zb-v runs two chunks per rank placed in a V, got V = ",
                   spec.virtual_stages, " virtual stages; give --virtual-stages 2");
  }
  Placement placement(const ScheduleSpec& spec) const override {
    const int p = spec.stages;
    std::vector<Slot> route;
    for (int s = 0; s < 2 * p; s++) route.push_back(s < p ? Slot{s, 0} : Slot{2 * p - 1 - s, 1});
    return Placement(p, 2, {route});
  }
  ActionLists compute_order(const ScheduleSpec& spec, const Placement& pl) const override;
};

// The five choices of the greedy rule, in the order a priority list names them.
enum Choice { kInput1, kInput0, kForward1, kForward0, kWeight };

// A list's length under unit costs with every message taking an infinitesimal e: units + hops e, as the pair
// (units, hops) compared in that order. hops counts the messages on the critical path: how fast the list's
// length grows with the message latency (a handover inside a rank, at the turn, is no message).
std::pair<long, long> length_and_hops(const Placement& pl, int m, const ActionLists& lists) {
  using Time = std::pair<long, long>;
  const int p = pl.ranks(), S = pl.stages();
  const Time unset{-1, -1};
  std::vector<Time> f_end((size_t)m * S, unset), b_end((size_t)m * S, unset), t((size_t)p, Time{0, 0});
  std::vector<size_t> pc((size_t)p, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int j = 0; j < p; j++) {
      for (; pc[j] < lists[j].size(); pc[j]++) {
        const Action& a = lists[j][pc[j]];
        const int s = pl.stage_of(j, a.chunk);
        const size_t is = (size_t)a.micro_batch * S + s;
        Time start = t[j];
        int from = -1;  // the stage whose result this computation needs, if on another chunk
        if (a.kind == ActionKind::forward && s > 0) from = s - 1;
        if (a.kind == ActionKind::backward_input && s < S - 1) from = s + 1;
        if (from >= 0) {
          const Time end = a.kind == ActionKind::forward ? f_end[is - 1] : b_end[is + 1];
          if (end == unset) break;  // waits for another rank
          start = std::max(start, Time{end.first, end.second + (pl.slot(0, from).rank != j ? 1 : 0)});
        }
        t[j] = Time{start.first + 1, start.second};
        if (a.kind == ActionKind::forward) f_end[is] = t[j];
        if (a.kind == ActionKind::backward_input) b_end[is] = t[j];
        progress = true;
      }
    }
  }
  return *std::max_element(t.begin(), t.end());
}

}  // namespace

ActionLists ZbV::compute_order(const ScheduleSpec& spec, const Placement& pl) const {
  const int p = spec.stages, m = spec.micro_batches, S = 2 * p, cap = 2 * p;
  auto input = [&](int j, int c, const GreedyState& g) -> std::optional<Action> {
    const int i = g.backwards(j, c), s = pl.stage_of(j, c);  // an input half whose output gradient is here
    if (i >= m || g.forwards(j, c) <= i) return std::nullopt;
    if (!g.ready(s == S - 1 ? g.f_end(i, s) : g.b_end(i, s + 1))) return std::nullopt;
    return Action{ActionKind::backward_input, i, c, -1};
  };
  auto forward = [&](int j, int c, const GreedyState& g) -> std::optional<Action> {
    const int i = g.forwards(j, c), s = pl.stage_of(j, c);  // a forward whose input is here, within the cap
    if (i >= m || g.live(j) >= cap) return std::nullopt;
    if (s != 0 && !g.ready(g.f_end(i, s - 1))) return std::nullopt;
    return Action{ActionKind::forward, i, c, -1};
  };
  ActionLists best;
  std::pair<long, long> best_length{0, 0};
  std::array<Choice, 5> order{kInput1, kInput0, kForward1, kForward0, kWeight};  // the first tried
  do {
    if (std::find(order.begin(), order.end(), kForward0) < std::find(order.begin(), order.end(), kForward1))
      continue;  // chunk 0's forwards first fill the cap with nothing for chunk 1 to turn: a deadlock
    long units = 0;
    ActionLists lists = greedy_order(
        "zb-v", pl, m, 3L * 2 * m * p,
        [&](int j, const GreedyState& g) -> std::optional<Action> {
          for (Choice c : order) {
            std::optional<Action> a;
            switch (c) {
              case kInput1: a = input(j, 1, g); break;
              case kInput0: a = input(j, 0, g); break;
              case kForward1: a = forward(j, 1, g); break;
              case kForward0: a = forward(j, 0, g); break;
              case kWeight:
                if (!g.pending_weights(j).empty()) a = g.pending_weights(j).front();  // the oldest owed
                break;
            }
            if (a) return a;
          }
          return std::nullopt;
        },
        &units);
    if (units < 0) continue;  // this order stalls here
    const std::pair<long, long> length = length_and_hops(pl, m, lists);
    MT_ASSERT(length.first == units, "zb-v: the replay's length ", length.first, " is not the greedy's ", units);
    if (best.empty() || length < best_length) {
      best = std::move(lists);
      best_length = length;
    }
  } while (std::next_permutation(order.begin(), order.end()));
  MT_ASSERT(!best.empty(), "zb-v: no priority order completes p = ", p, ", m = ", m);
  return best;
}

std::unique_ptr<ScheduleGenerator> make_zb_v_schedule() { return std::make_unique<ZbV>(); }

}  // namespace mt::pipeline
