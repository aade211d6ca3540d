// ZB-H2 (zero-bubble pipeline parallelism, the second handcrafted schedule): ZB-H1 with more forwards in the
// warm-up, 2 (p - 1 - j) on rank j instead of p - 1 - j, which fill the wait for the first gradient, and each W
// deferred behind its B by 2 j micro-batches. Every rank holds at most min(2p - 1, m) micro-batches in flight.
// For m >= 2p - 1 the step's makespan is the least any schedule can reach, (p - 1)(F + d) + m (F + B + W) with a
// message latency d: the last rank cannot start before p - 1 forwards and messages have passed (the skew of the
// start, which no order within one step removes), and from then on no rank idles. The simulator's tests show it
// with F = B = W, with unequal halves (B, W = 1.3, 0.7 or 0.8, 1.2 or 2, 1 in units of F) and with d = F / 4, where ZB-H1 idles
// longer; with F = B = W, ZB-H1 reaches it too (both idle p - 1 units per rank, the skew).
//
//   p = 4, m = 8 (compute order):
//     j=0  F0 F1 F2 F3 F4 F5 F6 I0 W0 F7 I1 W1 I2 W2 I3 W3 I4 W4 I5 W5 I6 W6 I7 W7
//     j=3  F0 I0 F1 I1 F2 I2 F3 I3 F4 I4 F5 I5 F6 I6 W0 F7 I7 W1 W2 W3 W4 W5 W6 W7
#include <algorithm>

#include "core/error.h"
#include "parallel/pipeline/schedule_generator.h"

namespace mt::pipeline {

namespace {

class ZbH2 : public ScheduleGenerator {
 public:
  const char* name() const override { return "zb-h2"; }
  void validate(const ScheduleSpec& spec) const override {
    MT_CHECK_INPUT(spec.virtual_stages == 1, "pipeline schedule zb-h2 runs one chunk per rank, got V = ",
                   spec.virtual_stages, " virtual stages");
  }
  ActionLists compute_order(const ScheduleSpec& spec, const Placement&) const override {
    const int p = spec.stages;
    ActionLists out((size_t)p);
    for (int j = 0; j < p; j++) out[j] = deferred_weight_order(spec.micro_batches, 2 * (p - 1 - j), 2 * j);
    return out;
  }
};

}  // namespace

std::unique_ptr<ScheduleGenerator> make_zb_h2_schedule() { return std::make_unique<ZbH2>(); }

}  // namespace mt::pipeline
