// comm::deadline_after: every value up to +inf is a deadline that far away, saturating instead of wrapping
// (the int64-nanosecond overflow above ~9.2e9 s made `--comm-timeout inf` time out on the first wait).
#include "comm/deadline.h"

#include <gtest/gtest.h>

#include <chrono>
#include <limits>

namespace mt::comm {
namespace {

using Clock = std::chrono::steady_clock;

TEST(Deadline, OrdinaryValuesAreExact) {
  const Clock::time_point now = Clock::now();
  EXPECT_EQ(deadline_after<Clock>(1.5, now) - now, std::chrono::milliseconds(1500));
  EXPECT_EQ(deadline_after<Clock>(300, now) - now, std::chrono::seconds(300));
  EXPECT_EQ(deadline_after<Clock>(1e9, now) - now, std::chrono::seconds(1000000000));
}

TEST(Deadline, HugeAndInfiniteSaturateInTheFuture) {
  const Clock::time_point now = Clock::now();
  for (double s : {9.3e9, 1e10, 1e300, std::numeric_limits<double>::max(), std::numeric_limits<double>::infinity()}) {
    const Clock::time_point d = deadline_after<Clock>(s, now);
    EXPECT_GT(d, now + std::chrono::hours(24 * 365 * 200)) << s;  // never "already passed"
    EXPECT_EQ(d, Clock::time_point::max()) << s;
  }
  // Just below the limit still fits exactly enough to lie in the future.
  const double room = std::chrono::duration<double>(Clock::time_point::max() - now).count();
  EXPECT_GT(deadline_after<Clock>(room * 0.5, now), now);
}

TEST(Deadline, NonPositiveOrNanIsDueNow) {
  const Clock::time_point now = Clock::now();
  EXPECT_EQ(deadline_after<Clock>(0, now), now);
  EXPECT_EQ(deadline_after<Clock>(-1, now), now);
  EXPECT_EQ(deadline_after<Clock>(std::numeric_limits<double>::quiet_NaN(), now), now);
}

}  // namespace
}  // namespace mt::comm
