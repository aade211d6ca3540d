// Chimera (Li and Hoefler, 2021), the basic schedule: two pipelines over the same p ranks in opposite
// directions. The "down" pipeline puts stage s on rank s (chunk 0), the "up" pipeline stage s on rank p - 1 - s
// (chunk 1), so every rank holds one stage of each and the model is held twice: S = p stages, two routes, V = 2
// chunks per rank. Micro-batch i takes route i mod 2 (placement.h): even micro-batches go down, odd ones up.
// The two copies of a stage live on two different ranks (j and p - 1 - j; the tied wte on ranks 0 and p - 1,
// where each rank holds both of its uses); the run sums their gradients over that pair (train/replicas.h), so
// they stay equal. An odd p would put the middle stage twice on one rank: refused, as is an odd m (the two
// pipelines take equal halves).
//
// The order on each rank is what a greedy list scheduler does with every forward and every backward taking one
// unit (F = B, messages free): at each unit every free rank starts a backward whose output gradient is here (the
// smaller micro-batch first), else a forward whose input is here (the smaller micro-batch first) if the rank
// holds fewer than p micro-batches in flight (forward to backward); each chunk's forwards and backwards run in
// ascending micro-batch order. With F = B this ends at 2m + p - 2 units when m is a multiple of p, the paper's
// bubble ratio (p - 2) / (2m + p - 2) against 1F1B's (p - 1) / (m + p - 1), 0.200 against 0.429 at p = m = 4;
// otherwise p - (m mod p) units later (tests/pipeline/chimera_test.cpp checks both for p <= 8, m <= 24). The cap
// p is 1F1B's activation memory on its rank 0 (p micro-batches of one stage). Memory: every rank holds two stages'
// weights, twice 1F1B's. The greedy is not proven optimal; it is the schedule as written here. The builder
// (greedy_order, schedule_generator.h) is shared with zb-v; the rule below is what chimera chooses.
//
//   p = 4, m = 4 (compute order; Fic = forward, Bic = backward of micro-batch i on chunk c; c0 down, c1 up):
//     j=0  F0c0 F2c0 F1c1 B1c1 F3c1 B3c1 B0c0 B2c0
//     j=1  F0c0 F1c1 F2c0 F3c1 B1c1 B0c0 B3c1 B2c0
//     j=2  F1c1 F0c0 F3c1 F2c0 B0c0 B1c1 B2c0 B3c1
//     j=3  F1c1 F3c1 F0c0 B0c0 F2c0 B2c0 B1c1 B3c1
#include <algorithm>
#include <optional>

#include "core/error.h"
#include "parallel/pipeline/schedule_generator.h"

namespace mt::pipeline {

namespace {

class Chimera : public ScheduleGenerator {
 public:
  const char* name() const override { return "chimera"; }
  void validate(const ScheduleSpec& spec) const override {
    MT_CHECK_INPUT(spec.virtual_stages == 2, "pipeline schedule chimera runs two chunks per rank (one stage of "
                   "each of its two pipelines), got V = ", spec.virtual_stages, " virtual stages; give --virtual-stages 2");
    MT_CHECK_INPUT(spec.stages % 2 == 0, "pipeline schedule chimera needs an even number of stages (--pp), got ",
                   spec.stages, " (--stages in meshtrain simulate and bench pipeline): with an odd one the middle "
                   "stage of both pipelines falls on one rank");
    MT_CHECK_INPUT(spec.micro_batches % 2 == 0, "pipeline schedule chimera splits the micro-batches evenly between "
                   "its two pipelines: it needs an even number of micro-batches per pipeline rank, got ",
                   spec.micro_batches, " (--batch-size / (--dp x --micro-batch-size); --micro-batches in meshtrain "
                   "simulate and bench pipeline)");
  }
  Placement placement(const ScheduleSpec& spec) const override {
    const int p = spec.stages;
    std::vector<Slot> down, up;
    for (int s = 0; s < p; s++) {
      down.push_back({s, 0});
      up.push_back({p - 1 - s, 1});
    }
    return Placement(p, 2, {down, up});
  }
  ActionLists compute_order(const ScheduleSpec& spec, const Placement& pl) const override;
};

ActionLists Chimera::compute_order(const ScheduleSpec& spec, const Placement& pl) const {
  const int p = spec.stages, m = spec.micro_batches, S = p, cap = p;
  // Chunk c of a rank holds micro-batches c, c + 2, ...: its k-th forward or backward is micro-batch 2k + c.
  const int per_chunk = m / 2;
  return greedy_order("chimera", pl, m, 2L * 2 * per_chunk * p, [&](int j, const GreedyState& g) {
    std::optional<Action> pick;
    for (ActionKind kind : {ActionKind::backward, ActionKind::forward}) {
      for (int c = 0; c < 2; c++) {  // the chunk whose next micro-batch is the smaller
        const int k = kind == ActionKind::forward ? g.forwards(j, c) : g.backwards(j, c);
        if (k >= per_chunk) continue;
        const int i = 2 * k + c, s = pl.stage_of(j, c);
        const bool can = kind == ActionKind::backward
                             ? g.forwards(j, c) > k && g.ready(s == S - 1 ? g.f_end(i, s) : g.b_end(i, s + 1))
                             : g.live(j) < cap && (s == 0 || g.ready(g.f_end(i, s - 1)));
        if (can && (!pick || i < pick->micro_batch)) pick = Action{kind, i, c, -1};
      }
      if (pick) break;
    }
    return pick;
  });
}

}  // namespace

std::unique_ptr<ScheduleGenerator> make_chimera_schedule() { return std::make_unique<Chimera>(); }

}  // namespace mt::pipeline
