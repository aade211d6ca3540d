// The deadline of a blocking communication call: now + --comm-timeout seconds, saturated. A naive
// `now + duration<double>(s)` converted to steady_clock's int64 nanoseconds overflows above ~9.2e9 s (292
// years) and wraps into the past, so `--comm-timeout 1e10` or `inf` would time out on the first wait. Here
// any value that does not fit, and +inf, mean "no deadline" (time_point::max()). Costs a compare per call.
#pragma once

#include <chrono>
#include <cmath>

namespace mt::comm {

template <typename Clock = std::chrono::steady_clock>
typename Clock::time_point deadline_after(double seconds, typename Clock::time_point now = Clock::now()) {
  using Dur = typename Clock::duration;
  if (!(seconds > 0)) return now;  // 0, negative or NaN: already due (flags reject these earlier)
  // Seconds left before time_point::max(), as a double; values at or above it (inf too) never expire.
  const double room = std::chrono::duration<double>(Clock::time_point::max() - now).count();
  if (seconds >= room) return Clock::time_point::max();
  return now + std::chrono::duration_cast<Dur>(std::chrono::duration<double>(seconds));
}

}  // namespace mt::comm
