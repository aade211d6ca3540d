// Why a zb-h2 run does not step at the zero-bubble paper's back-to-back rate (parallel/pipeline/sync_window.h):
// its steps may run back to back only as far as each stage's update allows, and in this project's pipeline runs
// (the GPT: --pp needs --model gpt) that update waits for the last stage's last weight gradient of the step: for
// the global gradient norm when --grad-clip > 0, and for the tied wte's copy on the last stage always (its
// gradient is summed with the first stage's before either updates, and the last stage computes it in its W, which
// zb-h2 defers to the end of the step: a property of today's split, not of the rule). Then no one-chunk list steps faster than
// (p - 1) F + m (F + B + W), the synchronized step's bound, which the run's one-step lists already reach; the
// back-to-back m (F + B + W) needs updates that wait for no other stage.
#pragma once

#include <string>

namespace mt::train {

struct TrainConfig;

// The log line for --schedule zb-h2 at --pp > 1 (the schedule whose back-to-back rate differs from its
// synchronized one), naming what the update waits for; empty for every other run.
std::string back_to_back_note(const TrainConfig& cfg);

}  // namespace mt::train
