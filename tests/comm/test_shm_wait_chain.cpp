// The stalled rank at the end of a chain of waits (issue 22, point 11): rank 2 waits for rank 1, which waits for
// rank 0, which stalls (sleeps without calling anything). Rank 2 started waiting first, so its deadline passes
// first; the job must still name rank 0, the rank nobody heard from, not rank 1, which was only waiting itself.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "comm/launch.h"
#include "comm/shm/job.h"

namespace mt::comm {
namespace {

LaunchResult run_chain(int n) {
  LaunchOptions o;
  o.nproc = n;
  o.backend = "shm";
  o.timeout_s = 2;
  o.grace_s = 1;
  return run_ranks(o, [n](Communicator& w) {
    float x = 0;
    const int r = w.rank();
    if (r == 0) {
      std::this_thread::sleep_for(std::chrono::seconds(8));  // stalled: no call, no poll
      return;
    }
    // Rank r waits for rank r - 1; the last rank starts first, each earlier one 0.3 s later.
    std::this_thread::sleep_for(std::chrono::milliseconds(300 * (n - 1 - r)));
    w.recv(&x, 1, DType::f32, r - 1, 7);
  });
}

TEST(ShmWaitChain, TimeoutNamesTheEndOfTheChain) {
  const LaunchResult r = run_chain(3);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.failed_rank, 2) << r.failure;  // the first deadline to pass
  EXPECT_EQ(r.waited_rank, 0) << r.failure;  // ... but rank 0 is the one stalled
  EXPECT_NE(r.failure.find("world rank 1 was itself waiting for world rank 0"), std::string::npos) << r.failure;
  EXPECT_EQ(shm::count_segments(getpid()), 0);
}

TEST(ShmWaitChain, LongerChain) {
  const LaunchResult r = run_chain(4);
  EXPECT_EQ(r.failed_rank, 3) << r.failure;
  EXPECT_EQ(r.waited_rank, 0) << r.failure;
}

}  // namespace
}  // namespace mt::comm
