// ZB-H1 (zero-bubble pipeline parallelism, the first handcrafted schedule): 1F1B's forwards and input-gradient
// halves (B), each weight-gradient half (W) on rank j deferred behind its B by j micro-batches, so the B's that
// carry gradients upstream go first and the W's fill the cooldown. With F = B = W = 1 unit each rank idles
// (p - 1)(F + B - W) = p - 1 units against 1F1B's (p - 1)(F + B + W), for m >= p: p = 4, m = 8 gives 3 against 9.
// Memory: every rank holds at most min(p, m) micro-batches in flight (F to W): 1F1B's peak (that of its rank 0),
// reached by every rank here rather than only the first. One chunk per rank, the looped placement.
//
//   p = 4, m = 8 (compute order; W lags B by j on rank j):
//     j=0  F0 F1 F2 F3 I0 W0 F4 I1 W1 F5 I2 W2 F6 I3 W3 F7 I4 W4 I5 W5 I6 W6 I7 W7
//     j=3  F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 I4 W1 F5 I5 W2 F6 I6 W3 F7 I7 W4 W5 W6 W7
#include <algorithm>

#include "core/error.h"
#include "parallel/pipeline/schedule_generator.h"

namespace mt::pipeline {

namespace {

class ZbH1 : public ScheduleGenerator {
 public:
  const char* name() const override { return "zb-h1"; }
  void validate(const ScheduleSpec& spec) const override {
    MT_CHECK_INPUT(spec.virtual_stages == 1, "pipeline schedule zb-h1 runs one chunk per rank, got V = ",
                   spec.virtual_stages, " virtual stages");
  }
  ActionLists compute_order(const ScheduleSpec& spec, const Placement&) const override {
    const int p = spec.stages;
    ActionLists out((size_t)p);
    for (int j = 0; j < p; j++) out[j] = deferred_weight_order(spec.micro_batches, p - j - 1, j);
    return out;
  }
};

}  // namespace

std::unique_ptr<ScheduleGenerator> make_zb_h1_schedule() { return std::make_unique<ZbH1>(); }

}  // namespace mt::pipeline
