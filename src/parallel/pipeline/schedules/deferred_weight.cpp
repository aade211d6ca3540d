// The order the zero-bubble schedules share (ZB-H1, ZB-H2): 1F1B's alternation of forwards and input-gradient
// halves after a warm-up of forwards, with each weight-gradient half W deferred behind its B by a lag, and the
// W's still owed after the last B at the end. A larger warm-up fills the wait for the first gradient with
// forwards, a lag lets the B's the previous rank waits for go first; both hold more micro-batches in flight
// (a micro-batch is held from its F to its W): at most warm-up + 1 + lag. W's keep ascending micro-batch order.
#include <algorithm>

#include "parallel/pipeline/schedule_generator.h"

namespace mt::pipeline {

std::vector<Action> deferred_weight_order(int m, int warmup, int lag) {
  warmup = std::min(warmup, m);
  std::vector<Action> out;
  int weights = 0;  // W's placed so far: micro-batches 0 .. weights - 1
  auto input_half = [&](int i) {
    out.push_back({ActionKind::backward_input, i, 0, -1});
    if (i - lag >= 0) {
      out.push_back({ActionKind::backward_weight, i - lag, 0, -1});
      weights = i - lag + 1;
    }
  };
  for (int i = 0; i < warmup; i++) out.push_back({ActionKind::forward, i, 0, -1});
  for (int k = 0; k < m - warmup; k++) {
    out.push_back({ActionKind::forward, warmup + k, 0, -1});
    input_half(k);
  }
  for (int i = m - warmup; i < m; i++) input_half(i);
  for (; weights < m; weights++) out.push_back({ActionKind::backward_weight, weights, 0, -1});
  return out;
}

}  // namespace mt::pipeline
