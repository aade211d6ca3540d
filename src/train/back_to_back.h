// Why a clipped zb-h2 run does not step at the zero-bubble paper's back-to-back rate
// (parallel/pipeline/sync_window.h): its steps may run back to back only as far as each stage's update allows,
// and with --grad-clip > 0 that update waits for the global gradient norm, so for the last stage's last weight
// gradient of the step. Then no one-chunk list steps faster than (p - 1) F + m (F + B + W), the synchronized
// step's bound, which the run's one-step lists already reach. Without clipping the run takes the back-to-back
// executor (train/sync_window_steps.h): the first stage's update waits only for the tied wte's copy, which the
// last stage sends after its last input half (the GPT takes that copy's gradient there: model/gpt.h).
#pragma once

#include <string>

namespace mt::train {

struct TrainConfig;

// The log line for --schedule zb-h2 at --pp > 1 with --grad-clip > 0 (the schedule whose back-to-back rate
// differs from its synchronized one), naming what the update waits for; empty for every other run.
std::string back_to_back_note(const TrainConfig& cfg);

}  // namespace mt::train
