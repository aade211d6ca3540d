// The one way the multi-rank tests start a job: `n` forked shm ranks, each running `body` on one thread
// (the parent's OpenMP pool does not survive the fork, and libgomp would wait for it forever in a parallel
// region). The caller checks the result: EXPECT_EQ(res.exit_code, 0) << ... << res.failed_rank << res.failure.
#pragma once

#include <functional>

#include "comm/launch.h"
#include "tensor/blas.h"

namespace mt::test {

inline comm::LaunchResult run_shm_ranks(int n, const std::function<void(comm::Communicator& world)>& body,
                                        double timeout_s = 60) {
  comm::LaunchOptions lo;
  lo.nproc = n;
  lo.backend = "shm";
  lo.timeout_s = timeout_s;
  return comm::run_ranks(lo, [&](comm::Communicator& world) {
    set_num_threads(1);
    body(world);
  });
}

}  // namespace mt::test
