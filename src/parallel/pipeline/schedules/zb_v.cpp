// ZB-V (zero-bubble pipeline parallelism, the V-shaped schedule): two chunks per rank placed in a V, rank j
// holding stages j (chunk 0) and 2p - 1 - j (chunk 1), so a micro-batch goes down the ranks and back up, rank 0
// holds both ends and rank p - 1 the turn (handed over in memory); the backward split in I and W as in ZB-H1.
//
// The order on each rank is what a greedy list scheduler does with every chunk's F, I and W taking one unit of
// time and messages free: at each unit every free rank starts, of what it may start, an I (chunk 1 first: the
// gradient others wait for), else an F (chunk 1 first: it finishes a micro-batch) if the rank holds fewer than
// 2p (micro-batch, chunk) pairs in flight (F to W), else its oldest pending W. The cap 2p is 1F1B's activation
// memory (p micro-batches of a whole stage, a chunk being half a stage); each chunk's I's, and so its W's, run in
// ascending micro-batch order. With F = B = W no schedule ends before (p - 1) F / 2 + m (F + B + W) (rank p - 1
// waits for p - 1 chunk forwards); the simulator's tests (tests/pipeline/zero_bubble_test.cpp) show this order
// within F / 2 of it for p <= 4 and within F at p = 5 (m >= p): at p = 4, m = 8 it idles 2 F per rank against
// ZB-H1's 3 and 1F1B's 9. The greedy is not proven optimal; it is the schedule as written here.
//
// Rank 0 holds both ends of the model: the GPT task gives its two chunks one tied wte (no tie group to sum
// over); ZeRO 2 and 3 are refused with it (train_config.cpp).
//
//   p = 2, m = 2 (compute order; Fic = forward of micro-batch i on chunk c):
//     j=0  F0c0 F1c0 F0c1 I0c1 F1c1 I1c1 I0c0 W0c1 I1c0 W1c1 W0c0 W1c0
//     j=1  F0c0 F0c1 F1c0 F1c1 I0c1 I0c0 I1c1 I1c0 W0c1 W0c0 W1c1 W1c0
#include <algorithm>
#include <deque>
#include <optional>

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

ActionLists ZbV::compute_order(const ScheduleSpec& spec, const Placement& pl) const {
  const int p = spec.stages, m = spec.micro_batches, S = 2 * p, cap = 2 * p;
  constexpr long kNever = -1;
  // When (i, s)'s forward and its input half end, in units; kNever until scheduled.
  std::vector<long> f_end((size_t)m * S, kNever), i_end((size_t)m * S, kNever);
  auto at = [&](std::vector<long>& v, int i, int s) -> long& { return v[(size_t)i * S + s]; };
  // Per rank and chunk: the next micro-batch to forward and to take the input half of; per rank: pending W's.
  std::vector<int> next_f((size_t)p * 2, 0), next_i((size_t)p * 2, 0), live((size_t)p, 0);
  std::vector<std::deque<Action>> pending((size_t)p);
  ActionLists out((size_t)p);
  const long total = 3L * 2 * m * p;
  long done = 0;
  for (long t = 0; done < total; t++) {
    MT_ASSERT(t <= total * 4, "zb-v: the greedy order made no progress");
    for (int j = 0; j < p; j++) {
      auto ready = [&](long end) { return end != kNever && end <= t; };
      std::optional<Action> pick;
      for (int c : {1, 0}) {  // an input half whose output gradient is here
        const int i = next_i[j * 2 + c], s = pl.stage_of(j, c);
        if (pick || i >= m || next_f[j * 2 + c] <= i) continue;
        if (ready(s == S - 1 ? at(f_end, i, s) : at(i_end, i, s + 1))) pick = Action{ActionKind::backward_input, i, c, -1};
      }
      for (int c : {1, 0}) {  // a forward whose input is here, within the memory cap
        const int i = next_f[j * 2 + c], s = pl.stage_of(j, c);
        if (pick || i >= m || live[j] >= cap) continue;
        if (s == 0 || ready(at(f_end, i, s - 1))) pick = Action{ActionKind::forward, i, c, -1};
      }
      if (!pick && !pending[j].empty()) {
        pick = pending[j].front();
        pending[j].pop_front();
      }
      if (!pick) continue;
      const Action a = *pick;
      const int s = pl.stage_of(j, a.chunk);
      if (a.kind == ActionKind::forward) {
        next_f[j * 2 + a.chunk]++;
        at(f_end, a.micro_batch, s) = t + 1;
        live[j]++;
      } else if (a.kind == ActionKind::backward_input) {
        next_i[j * 2 + a.chunk]++;
        at(i_end, a.micro_batch, s) = t + 1;
        pending[j].push_back({ActionKind::backward_weight, a.micro_batch, a.chunk, -1});
      } else {
        live[j]--;
      }
      out[j].push_back(a);
      done++;
    }
  }
  return out;
}

}  // namespace

std::unique_ptr<ScheduleGenerator> make_zb_v_schedule() { return std::make_unique<ZbV>(); }

}  // namespace mt::pipeline
