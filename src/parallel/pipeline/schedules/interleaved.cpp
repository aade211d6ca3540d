// Interleaved 1F1B (Megatron-LM) over the looped placement (chunk c of rank j is stage c p + j): the k-th
// forward of a rank is (i, c) with
//   group = k / (p V), c = (k mod p V) / p, i = group * p + k mod p,
// the k-th backward the same with c counted from the last chunk. Warm-up, (V - 1) p + 2 (p - j - 1):
// (V - 1) p forwards take the first group of p micro-batches through chunks 0 .. V - 2, which must come
// before the first forward of the last chunk and so before any backward; then the first micro-batch's
// activation still travels through the p - j - 1 later ranks and its gradient back through them, and rank
// j fills that round trip with forwards. No special case for m == p (Megatron-LM runs all forwards first
// there): check_schedule and the simulator find this order deadlock-free with the textbook bubble.
#include <algorithm>

#include "core/error.h"
#include "parallel/pipeline/schedule_generator.h"

namespace mt::pipeline {

namespace {

std::vector<Action> interleaved_order(int j, int p, int m, int V) {
  const int total = m * V;
  auto nth = [&](int k, bool backward) {
    int group = k / (p * V);
    int c = (k % (p * V)) / p;
    if (backward) c = V - 1 - c;
    int i = group * p + k % p;
    return Action{backward ? ActionKind::backward : ActionKind::forward, i, c, -1};
  };
  const int warmup = std::min((p - j - 1) * 2 + (V - 1) * p, total);
  std::vector<Action> out;
  for (int k = 0; k < warmup; k++) out.push_back(nth(k, false));
  for (int k = 0; k < total - warmup; k++) {
    out.push_back(nth(warmup + k, false));
    out.push_back(nth(k, true));
  }
  for (int k = total - warmup; k < total; k++) out.push_back(nth(k, true));
  return out;
}

class Interleaved : public ScheduleGenerator {
 public:
  const char* name() const override { return "interleaved"; }
  void validate(const ScheduleSpec& spec) const override {
    const int p = spec.stages, m = spec.micro_batches, V = spec.virtual_stages;
    MT_CHECK_INPUT(V >= 2, "pipeline schedule interleaved needs V >= 2 virtual stages (chunks) per rank, got V = ", V,
                   "; with one chunk per rank it is 1f1b");
    MT_CHECK_INPUT(m % p == 0, "pipeline schedule interleaved needs the number of micro-batches m = ", m,
                   " to be a multiple of the number of stages p = ", p,
                   " (it walks the micro-batches in groups of p, as Megatron-LM does); try m = ",
                   m / p > 0 ? str(m / p * p, " or ") : std::string(), (m / p + 1) * p);
  }
  ActionLists compute_order(const ScheduleSpec& spec, const Placement&) const override {
    ActionLists out((size_t)spec.stages);
    for (int j = 0; j < spec.stages; j++)
      out[j] = interleaved_order(j, spec.stages, spec.micro_batches, spec.virtual_stages);
    return out;
  }
};

}  // namespace

std::unique_ptr<ScheduleGenerator> make_interleaved_schedule() { return std::make_unique<Interleaved>(); }

}  // namespace mt::pipeline
