// The shm point-to-point ring's size contract: a 1 MB message (a pipeline activation of the bench's default size)
// with its header fits the ring whole, twice, so a send of it ends in the sender's own call, before the receiver
// has posted anything, and the sender may reuse its buffer at once.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "comm/launch.h"
#include "core/error.h"
#include "comm/shm/shm_comm.h"

namespace mt::comm {
namespace {

TEST(ShmP2P, TwoOneMegabyteSendsEndBeforeTheReceiverPostsAndTheirBuffersAreFree) {
  static_assert(mt::comm::shm::kChannelBytes >= 2 * ((size_t{1} << 20) + 16),
                "the ring must hold two 1 MB messages with their 16-byte headers");
  LaunchOptions o;
  o.nproc = 2;
  o.backend = "shm";
  o.timeout_s = 30;
  LaunchResult r = run_ranks(o, [](Communicator& w) {
    const size_t n = (size_t{1} << 20) / sizeof(float);  // exactly 1 MB
    std::vector<float> a(n), b(n);
    if (w.rank() == 0) {
      for (size_t i = 0; i < n; i++) a[i] = float(i % 977), b[i] = -float(i % 983);
      Request qa = w.isend(a.data(), n, DType::f32, 1, 1);
      Request qb = w.isend(b.data(), n, DType::f32, 1, 2);
      // Rank 1 posts nothing until it has the ack below, which goes after these checks: the sends must have
      // ended on their own.
      MT_REQUIRE(Error, qa.test(), "a 1 MB send did not end before its receive was posted (ring too small)");
      MT_REQUIRE(Error, qb.test(), "a second 1 MB send did not end before its receive was posted (ring too small)");
      std::fill(a.begin(), a.end(), 7.f);  // the buffers are the sender's again
      std::fill(b.begin(), b.end(), 7.f);
      float ack = 1;
      w.send(&ack, 1, DType::f32, 1, 0);
    } else {
      float ack = 0;
      w.recv(&ack, 1, DType::f32, 0, 0);
      MT_REQUIRE(Error, ack == 1.f, "ack ", ack);
      w.recv(b.data(), n, DType::f32, 0, 2);  // out of order: the tag matches
      w.recv(a.data(), n, DType::f32, 0, 1);
      for (size_t i = 0; i < n; i++) {
        MT_REQUIRE(Error, a[i] == float(i % 977), "message 1 element ", i, ": ", a[i]);
        MT_REQUIRE(Error, b[i] == -float(i % 983), "message 2 element ", i, ": ", b[i]);
      }
    }
  });
  EXPECT_EQ(r.exit_code, 0) << "rank " << r.failed_rank << ": " << r.failure;
}

}  // namespace
}  // namespace mt::comm
