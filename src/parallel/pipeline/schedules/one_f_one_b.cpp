// 1F1B (PipeDream-flush): rank j runs ahead by the forwards its successors need before the first backward
// can come back to it, p - j - 1, then alternates, so it never holds more than p - j activations. One chunk
// per rank, the looped placement (stage = rank).
#include <algorithm>

#include "core/error.h"
#include "parallel/pipeline/schedule_generator.h"

namespace mt::pipeline {

namespace {

class OneFOneB : public ScheduleGenerator {
 public:
  const char* name() const override { return "1f1b"; }
  void validate(const ScheduleSpec& spec) const override {
    MT_CHECK_INPUT(spec.virtual_stages == 1,
                   "pipeline schedule 1f1b runs one chunk per rank, got V = ", spec.virtual_stages,
                   " virtual stages; use the interleaved schedule for V > 1");
  }
  ActionLists compute_order(const ScheduleSpec& spec, const Placement&) const override {
    const int p = spec.stages, m = spec.micro_batches;
    ActionLists out((size_t)p);
    for (int j = 0; j < p; j++) {
      const int warmup = std::min(p - j - 1, m);
      std::vector<Action>& o = out[j];
      for (int i = 0; i < warmup; i++) o.push_back({ActionKind::forward, i, 0, -1});
      for (int k = 0; k < m - warmup; k++) {
        o.push_back({ActionKind::forward, warmup + k, 0, -1});
        o.push_back({ActionKind::backward, k, 0, -1});
      }
      for (int i = m - warmup; i < m; i++) o.push_back({ActionKind::backward, i, 0, -1});
    }
    return out;
  }
};

}  // namespace

std::unique_ptr<ScheduleGenerator> make_one_f_one_b_schedule() { return std::make_unique<OneFOneB>(); }

}  // namespace mt::pipeline
