// MESHTRAIN_SHM_BIND=1 (comm/shm/bind.h): each forked rank of the world group ends up on a CPU of its own, or, when
// the ranks outnumber the CPUs this process may use, keeps the whole set; without the variable nothing is bound.
#include <gtest/gtest.h>
#include <sched.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/launch.h"

namespace mt::comm {
namespace {

int allowed_count() {
  cpu_set_t s;
  CPU_ZERO(&s);
  if (sched_getaffinity(0, sizeof s, &s) != 0) return -1;
  return CPU_COUNT(&s);
}

int only_cpu() {  // the CPU this process is bound to, or -1 when it may use more than one
  cpu_set_t s;
  CPU_ZERO(&s);
  if (sched_getaffinity(0, sizeof s, &s) != 0 || CPU_COUNT(&s) != 1) return -1;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &s)) return c;
  }
  return -1;
}

// Runs 2 ranks with MESHTRAIN_SHM_BIND set to `bind` (nullptr: unset); each rank all-gathers only_cpu() and rank 0
// checks them against expect_bound; a failed check ends the job with the message.
LaunchResult run_two(const char* bind, bool expect_bound) {
  const char* saved = std::getenv("MESHTRAIN_SHM_BIND");
  const std::string keep = saved ? saved : "";
  if (bind) {
    setenv("MESHTRAIN_SHM_BIND", bind, 1);
  } else {
    unsetenv("MESHTRAIN_SHM_BIND");
  }
  LaunchOptions o;
  o.nproc = 2;
  o.backend = "shm";
  o.timeout_s = 60;
  const int parent_cpus = allowed_count();
  auto res = run_ranks(o, [&](Communicator& w) {
    float mine = float(only_cpu());
    std::vector<float> all(2);
    w.all_gather(&mine, all.data(), 2, DType::f32);  // count is the gathered total: one value per rank
    if (expect_bound && parent_cpus >= 2) {
      if (all[0] < 0 || all[1] < 0 || all[0] == all[1]) {
        throw std::runtime_error("ranks not on CPUs of their own: " + std::to_string(all[0]) + ", " +
                                 std::to_string(all[1]));
      }
    } else if (parent_cpus >= 2 && (all[0] >= 0 || all[1] >= 0)) {
      throw std::runtime_error("a rank was bound without MESHTRAIN_SHM_BIND=1: " + std::to_string(all[0]) + ", " +
                               std::to_string(all[1]));
    }
  });
  if (saved) {
    setenv("MESHTRAIN_SHM_BIND", keep.c_str(), 1);
  } else {
    unsetenv("MESHTRAIN_SHM_BIND");
  }
  return res;
}

TEST(ShmBindRanks, EachRankOnACpuOfItsOwnWhenAsked) {
  if (allowed_count() < 2) GTEST_SKIP() << "fewer than 2 CPUs allowed: binding is skipped by design";
  auto res = run_two("1", true);
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

TEST(ShmBindRanks, NoBindingByDefault) {
  if (allowed_count() < 2) GTEST_SKIP() << "fewer than 2 CPUs allowed: nothing to tell apart";
  auto res = run_two(nullptr, false);
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
  res = run_two("0", false);
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

}  // namespace
}  // namespace mt::comm
