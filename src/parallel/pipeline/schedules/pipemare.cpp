// PipeMare without its two corrections, i.e. Pipelined Backpropagation: pipedream's list (1F1B with an
// update of the rank's stage after each micro-batch's backward), but no weight stashing: a backward reads the
// stage's newest weights, which may be newer than those its forward read (the forward's activations are
// kept; only the weights the backward multiplies by differ). Stage s's forward of micro-batch i reads weights
// up to p - 1 - s updates older than stage p - 1's; the rule in full is in docs/parallelism.md. Changes the
// math.
#include "core/error.h"
#include "parallel/pipeline/schedule_generator.h"

namespace mt::pipeline {

namespace {

class PipeMare : public ScheduleGenerator {
 public:
  const char* name() const override { return "pipemare"; }
  void validate(const ScheduleSpec& spec) const override {
    MT_CHECK_INPUT(spec.virtual_stages == 1, "pipeline schedule pipemare runs one chunk per rank, got V = ",
                   spec.virtual_stages, " virtual stages");
  }
  ActionLists compute_order(const ScheduleSpec& spec, const Placement& placement) const override {
    return one_f_one_b_with_updates(spec, placement);
  }
  MicroUpdates micro_updates() const override { return MicroUpdates::newest; }
};

}  // namespace

std::unique_ptr<ScheduleGenerator> make_pipemare_schedule() { return std::make_unique<PipeMare>(); }

}  // namespace mt::pipeline
