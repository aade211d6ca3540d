// PipeDream-2BW: 1F1B's compute order on each rank, with the delay-1 update rule and two weight versions per
// stage (weight_versions() = 2). Step t's micro-batches all read W(t-1) on every stage (W(-1) = W(0)); their
// summed gradient, clipped by its own global norm, is applied to W(t): W(t+1) = opt(W(t), g_t). The rule
// does not depend on the layout, so pp 2 or 4 equals the same rule at pp 1 (--delayed-update) to float32
// rounding. The versions are kept by the run's parameter store (train/weight_versions.h), not here: a
// generator says the order of the computations and how many versions the rule reads.
//
// This generator's list is one step's, ending with 1F1B's flush (bubble (p-1)/(m+p-1)): what a run uses when it
// cannot go without a flush (train/no_flush_steps.h says when). 2BW's throughput half, step t+1's forwards while
// step t's last backwards drain with each step's update inside the list, is the window of ../no_flush.h, which
// train/no_flush_steps.h runs.
#include "core/error.h"
#include "parallel/pipeline/schedule_generator.h"

namespace mt::pipeline {

namespace {

class PipeDream2Bw : public ScheduleGenerator {
 public:
  PipeDream2Bw() : order_(make_one_f_one_b_schedule()) {}
  const char* name() const override { return "pipedream-2bw"; }
  void validate(const ScheduleSpec& spec) const override {
    MT_CHECK_INPUT(spec.virtual_stages == 1,
                   "pipeline schedule pipedream-2bw runs one chunk per rank, got V = ", spec.virtual_stages,
                   " virtual stages");
  }
  ActionLists compute_order(const ScheduleSpec& spec, const Placement& placement) const override {
    return order_->compute_order(spec, placement);
  }
  int weight_versions() const override { return 2; }

 private:
  std::unique_ptr<ScheduleGenerator> order_;  // 1F1B: the same compute order
};

}  // namespace

std::unique_ptr<ScheduleGenerator> make_pipedream_2bw_schedule() { return std::make_unique<PipeDream2Bw>(); }

}  // namespace mt::pipeline
