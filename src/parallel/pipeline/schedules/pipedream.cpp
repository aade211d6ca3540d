// PipeDream (weight stashing): 1F1B's compute order on each rank with an update of the rank's stage after
// EACH micro-batch's backward (an optimizer_step(i) action right after backward i and its send), instead of
// one update per step. The backward of micro-batch i on stage s reads the weight version its forward on
// stage s read (stashed until then; stage s of p keeps up to p - s versions under 1F1B), so each stage's
// gradient is a true gradient of the weights it was computed with. --vertical-sync: micro-batch i reads, on
// every stage, the version stage 0 read when i entered the pipeline. The versions are kept by the run's
// parameter store (train/weight_stash.h); the rule in full is in docs/parallelism.md ("PipeDream and
// PipeMare"). Changes the math.
//
// Rank j's list for p = 2, m = 3 (U = the update after micro-batch i's backward):
//   j=0   F0 F1 B0 U0 F2 B1 U1 B2 U2
//   j=1   F0 B0 U0 F1 B1 U1 F2 B2 U2
// This one-step list ends with every backward done (a flush). A training run goes without it where it can:
// parallel/pipeline/micro_window.h makes this generator's list over the K m micro-batches of a window of K steps
// (train/micro_window_steps.h runs it), so step t+1's first forwards run before step t's last updates.
#include <algorithm>

#include "core/error.h"
#include "parallel/pipeline/schedule_generator.h"

namespace mt::pipeline {

ActionLists one_f_one_b_with_updates(const ScheduleSpec& spec, const Placement& placement) {
  const ActionLists order = make_one_f_one_b_schedule()->compute_order(spec, placement);
  ActionLists out(order.size());
  for (size_t j = 0; j < order.size(); j++) {
    for (const Action& a : order[j]) {
      out[j].push_back(a);
      if (a.kind == ActionKind::backward) out[j].push_back({ActionKind::optimizer_step, a.micro_batch, a.chunk, -1});
    }
  }
  return out;
}

namespace {

class PipeDream : public ScheduleGenerator {
 public:
  const char* name() const override { return "pipedream"; }
  void validate(const ScheduleSpec& spec) const override {
    MT_CHECK_INPUT(spec.virtual_stages == 1, "pipeline schedule pipedream runs one chunk per rank, got V = ",
                   spec.virtual_stages, " virtual stages");
  }
  ActionLists compute_order(const ScheduleSpec& spec, const Placement& placement) const override {
    return one_f_one_b_with_updates(spec, placement);
  }
  MicroUpdates micro_updates() const override { return MicroUpdates::stashed; }
};

}  // namespace

std::unique_ptr<ScheduleGenerator> make_pipedream_schedule() { return std::make_unique<PipeDream>(); }

}  // namespace mt::pipeline
