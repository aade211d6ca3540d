// The collectives' adaptive spin (next_spin_us, comm/shm/signal.h): long waits take the spin down to nothing, short
// ones bring it back up to the policy's maximum, and it never leaves [0, max]. Pure arithmetic, no processes.
#include <gtest/gtest.h>

#include "comm/shm/signal.h"

namespace mt::comm::shm {
namespace {

TEST(AdaptiveSpin, LongWaitsHalveTheSpinToZeroAndShortOnesDoubleItBackToTheMax) {
  int s = 300;
  for (int i = 0; i < 9; ++i) s = next_spin_us(s, 300, 5000.0);  // the peer is not running: every wait is long
  EXPECT_EQ(s, 0);
  EXPECT_EQ(next_spin_us(0, 300, 5000.0), 0);
  // A wait that a probe-sized spin would have caught brings spinning back; then it doubles while waits stay short.
  EXPECT_EQ(next_spin_us(0, 300, 3.0), kSpinProbeUs);
  s = 0;
  for (int i = 0; i < 6; ++i) s = next_spin_us(s, 300, 2.0);
  EXPECT_EQ(s, 300);
  // The spin is capped by the policy's own (2 us when ranks outnumber cores).
  EXPECT_EQ(next_spin_us(2, 2, 1.0), 2);
  EXPECT_EQ(next_spin_us(300, 300, 100.0), 300);
  // A wait longer than the spin, however slightly, halves it.
  EXPECT_EQ(next_spin_us(300, 300, 301.0), 150);
  EXPECT_EQ(next_spin_us(40, 300, 40.0), 80);
}

TEST(AdaptiveSpin, MeshtrainShmSpinFixesThePolicy) {
  setenv("MESHTRAIN_SHM_SPIN", "7,11", 1);
  const SpinPolicy fixed = spin_policy_for(2);
  unsetenv("MESHTRAIN_SHM_SPIN");
  EXPECT_EQ(fixed.spin_us, 7);
  EXPECT_EQ(fixed.yield_us, 11);
  EXPECT_FALSE(fixed.adaptive);
  EXPECT_TRUE(spin_policy_for(2).adaptive);
}

}  // namespace
}  // namespace mt::comm::shm

