// Core binding of the shm ranks (comm/shm/bind.h). The rule (bind_width, bind_cpus_for) as pure arithmetic, and
// forked jobs: by default each rank of a 2-rank job ends up on CPUs of its own when ranks x threads fit the allowed
// CPUs, and nothing is bound when they do not, or with MESHTRAIN_SHM_BIND=0.
#include <gtest/gtest.h>
#include <sched.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/copy.h"
#include "comm/launch.h"
#include "comm/shm/bind.h"

namespace mt::comm {
namespace {

using shm::bind_cpus_for;
using shm::bind_width;

TEST(ShmBindRule, DefaultBindsWhenRanksTimesThreadsFitTheAllowedCpus) {
  const std::optional<bool> unset;
  EXPECT_EQ(bind_width(2, 1, 2, unset), 1);
  EXPECT_EQ(bind_width(2, 1, 8, unset), 1);
  EXPECT_EQ(bind_width(2, 2, 4, unset), 2);  // each rank keeps room for its 2 threads
  EXPECT_EQ(bind_width(4, 2, 8, unset), 2);
  EXPECT_EQ(bind_width(2, 2, 2, unset), 0);  // 4 threads on 2 CPUs: oversubscribed, never bound
  EXPECT_EQ(bind_width(3, 1, 2, unset), 0);  // more ranks than CPUs
  EXPECT_EQ(bind_width(8, 1, 2, unset), 0);
  EXPECT_EQ(bind_width(3, 3, 8, unset), 0);  // 9 threads on 8 CPUs
  EXPECT_EQ(bind_width(1, 1, 2, unset), 0);  // one rank: nothing to keep apart
  EXPECT_EQ(bind_width(2, 1, 0, unset), 0);  // affinity unknown
}

TEST(ShmBindRule, ZeroNeverBindsAndOneForcesOneCpuOrMoreWhileRanksDoNotOutnumberCpus) {
  EXPECT_EQ(bind_width(2, 1, 2, false), 0);
  EXPECT_EQ(bind_width(2, 1, 8, false), 0);
  EXPECT_EQ(bind_width(2, 2, 2, true), 1);  // forced although oversubscribed: one CPU each
  EXPECT_EQ(bind_width(2, 4, 6, true), 3);
  EXPECT_EQ(bind_width(1, 1, 2, true), 1);
  EXPECT_EQ(bind_width(3, 1, 2, true), 0);  // ranks outnumber CPUs: even forced, no binding
}

TEST(ShmBindRule, RankGetsTheAllowedCpusNumberedRankTimesWidthOnward) {
  cpu_set_t allowed, out;
  CPU_ZERO(&allowed);
  for (int c : {2, 5, 7, 9}) CPU_SET(c, &allowed);
  auto cpus = [&](int rank, int width) {
    std::vector<int> v;
    if (!bind_cpus_for(rank, width, allowed, &out)) return std::vector<int>{-1};
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &out)) v.push_back(c);
    return v;
  };
  EXPECT_EQ(cpus(0, 1), std::vector<int>({2}));
  EXPECT_EQ(cpus(1, 1), std::vector<int>({5}));
  EXPECT_EQ(cpus(3, 1), std::vector<int>({9}));
  EXPECT_EQ(cpus(0, 2), std::vector<int>({2, 5}));
  EXPECT_EQ(cpus(1, 2), std::vector<int>({7, 9}));
  EXPECT_EQ(cpus(2, 2), std::vector<int>({-1}));  // CPUs 4-5 of a set of 4
  EXPECT_EQ(cpus(4, 1), std::vector<int>({-1}));
  EXPECT_EQ(cpus(-1, 1), std::vector<int>({-1}));
  EXPECT_EQ(cpus(0, 0), std::vector<int>({-1}));
}

int allowed_count() {
  cpu_set_t s;
  CPU_ZERO(&s);
  if (sched_getaffinity(0, sizeof s, &s) != 0) return -1;
  return CPU_COUNT(&s);
}

int bound_cpus() {  // how many CPUs this process may use
  return allowed_count();
}

int first_cpu() {
  cpu_set_t s;
  CPU_ZERO(&s);
  if (sched_getaffinity(0, sizeof s, &s) != 0) return -1;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &s)) return c;
  return -1;
}

// Runs 2 ranks of `threads` threads with MESHTRAIN_SHM_BIND set to `bind` (nullptr: unset); each rank all-gathers
// (CPUs it may use, its first CPU) and rank 0 checks them: with expect_bound, each rank on exactly `threads` CPUs
// and the two first CPUs apart; else both ranks keep the parent's whole set. A failed check ends the job.
LaunchResult run_two(const char* bind, int threads, bool expect_bound) {
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
  o.threads_per_rank = threads;
  const int parent_cpus = allowed_count();
  auto res = run_ranks(o, [&](Communicator& w) {
    float mine[2] = {float(bound_cpus()), float(first_cpu())};
    std::vector<float> all(4);
    w.all_gather(mine, all.data(), 4, DType::f32);  // count is the gathered total: two values per rank
    const std::string got = std::to_string(all[0]) + "/" + std::to_string(all[1]) + ", " + std::to_string(all[2]) +
                            "/" + std::to_string(all[3]);
    if (expect_bound) {
      if (all[0] != threads || all[2] != threads || all[1] == all[3])
        throw std::runtime_error("ranks not on " + std::to_string(threads) + " CPU(s) of their own: " + got);
    } else if (all[0] != parent_cpus || all[2] != parent_cpus) {
      throw std::runtime_error("a rank was bound (CPUs/first CPU per rank): " + got);
    }
  });
  if (saved) {
    setenv("MESHTRAIN_SHM_BIND", keep.c_str(), 1);
  } else {
    unsetenv("MESHTRAIN_SHM_BIND");
  }
  return res;
}

TEST(ShmBindRanks, EachRankOnCpusOfItsOwnByDefaultWhenTheyFit) {
  if (allowed_count() < 2) GTEST_SKIP() << "fewer than 2 CPUs allowed: binding is skipped by design";
  auto res = run_two(nullptr, 1, true);
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
  res = run_two("1", 1, true);
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

TEST(ShmBindRanks, NoBindingWhenOversubscribedOrTurnedOff) {
  const int cpus = allowed_count();
  if (cpus < 2) GTEST_SKIP() << "fewer than 2 CPUs allowed: nothing to tell apart";
  auto res = run_two("0", 1, false);
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
  // 2 ranks of cpus/2 + 1 threads each do not fit: the default leaves them free.
  res = run_two(nullptr, cpus / 2 + 1, false);
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

// The single-copy threshold follows the job's binding: a 64 KB all-gather of bound ranks copies once (no copy into
// the slots: the calling thread's copy-in counters do not move), of unbound ranks (MESHTRAIN_SHM_BIND=0) it goes
// through the slots (they move). Both results are checked.
LaunchResult gather_64k(const char* bind, bool expect_single_copy) {
  if (bind) setenv("MESHTRAIN_SHM_BIND", bind, 1);
  LaunchOptions o;
  o.nproc = 2;
  o.backend = "shm";
  o.timeout_s = 60;
  auto res = run_ranks(o, [&](Communicator& w) {
    const size_t n = 64 * 1024 / sizeof(float), half = n / 2;
    std::vector<float> mine(half, float(w.rank() + 1)), all(n, 0.f);
    const CopyInPolicy& p = copy_in_policy();
    const int64_t before = p.ordinary_copies() + p.streamed_copies();
    w.all_gather(mine.data(), all.data(), n, DType::f32);
    const int64_t copies_in = p.ordinary_copies() + p.streamed_copies() - before;
    for (size_t i = 0; i < n; ++i) {
      if (all[i] != float(i < half ? 1 : 2)) throw std::runtime_error("wrong value at " + std::to_string(i));
    }
    if (expect_single_copy != (copies_in == 0))
      throw std::runtime_error(std::to_string(copies_in) + " copies into the slots, expected " +
                               (expect_single_copy ? "none" : "some"));
  });
  unsetenv("MESHTRAIN_SHM_BIND");
  return res;
}

TEST(ShmBindRanks, BoundRanksCopyOnceFrom32KBAndUnboundOnesUseTheSlots) {
  if (allowed_count() < 2) GTEST_SKIP() << "fewer than 2 CPUs allowed: the ranks cannot be bound";
  if (std::getenv("MESHTRAIN_SHM_BIND") || std::getenv("MESHTRAIN_SHM_CMA_GATHER_KB") ||
      std::getenv("MESHTRAIN_SHM_CMA"))
    GTEST_SKIP() << "the environment sets MESHTRAIN_SHM_BIND / _CMA / _CMA_GATHER_KB";
  auto res = gather_64k(nullptr, true);
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
  res = gather_64k("0", false);
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

}  // namespace
}  // namespace mt::comm
