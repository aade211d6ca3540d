// GPipe: all forwards, then all backwards, both in ascending micro-batch order (why ascending: schedule.h).
// One chunk per rank, the looped placement (stage = rank). Holds all m activations at the turn.
#include "core/error.h"
#include "parallel/pipeline/schedule_generator.h"

namespace mt::pipeline {

namespace {

class Gpipe : public ScheduleGenerator {
 public:
  const char* name() const override { return "gpipe"; }
  void validate(const ScheduleSpec& spec) const override {
    MT_CHECK_INPUT(spec.virtual_stages == 1,
                   "pipeline schedule gpipe runs one chunk per rank, got V = ", spec.virtual_stages,
                   " virtual stages; use the interleaved schedule for V > 1");
  }
  ActionLists compute_order(const ScheduleSpec& spec, const Placement&) const override {
    std::vector<Action> order;
    for (int i = 0; i < spec.micro_batches; i++) order.push_back({ActionKind::forward, i, 0, -1});
    for (int i = 0; i < spec.micro_batches; i++) order.push_back({ActionKind::backward, i, 0, -1});
    return ActionLists((size_t)spec.stages, order);
  }
};

}  // namespace

std::unique_ptr<ScheduleGenerator> make_gpipe_schedule() { return std::make_unique<Gpipe>(); }

}  // namespace mt::pipeline
