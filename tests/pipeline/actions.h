// Short builders for writing pipeline action lists out by hand in tests, and the checker's verdict as text.
// F/B compute forward and backward, I/W the split backward (input gradient, weight gradient); SA/PA/WA send,
// post and wait an activation; SG/PG/WG the same for gradients; STEP the optimizer step.
// Legend: i micro-batch, c chunk, to/from the peer rank.
#pragma once

#include <string>

#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_check.h"

namespace mt::pipeline::test {

inline Action F(int i, int c = 0) { return {ActionKind::forward, i, c, -1}; }
inline Action B(int i, int c = 0) { return {ActionKind::backward, i, c, -1}; }
inline Action I(int i, int c = 0) { return {ActionKind::backward_input, i, c, -1}; }
inline Action W(int i, int c = 0) { return {ActionKind::backward_weight, i, c, -1}; }
inline Action SA(int i, int c, int to) { return {ActionKind::send_act, i, c, to}; }
inline Action PA(int i, int c, int from) { return {ActionKind::post_recv_act, i, c, from}; }
inline Action WA(int i, int c, int from) { return {ActionKind::wait_recv_act, i, c, from}; }
inline Action SG(int i, int c, int to) { return {ActionKind::send_grad, i, c, to}; }
inline Action PG(int i, int c, int from) { return {ActionKind::post_recv_grad, i, c, from}; }
inline Action WG(int i, int c, int from) { return {ActionKind::wait_recv_grad, i, c, from}; }
inline Action STEP() { return {ActionKind::optimizer_step, -1, -1, -1}; }

// The ScheduleError message of check_schedule, or "(passed)".
inline std::string check_error(const ScheduleSpec& spec, const Schedule& s) {
  try {
    check_schedule(spec, s);
  } catch (const ScheduleError& e) {
    return e.what();
  }
  return "(passed)";
}

}  // namespace mt::pipeline::test
