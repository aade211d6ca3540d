// The flight recorder end to end under the shm launcher: a rank stalled (SIGSTOP) or killed (SIGKILL) by an
// injected fault before its K-th operation; the job ends within the deadline, the verdict names the rank, its
// host and where the others are, the rings are written to the flight file, nothing is left in /dev/shm and no
// rank process survives.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "comm/launch.h"
#include "comm/shm/job.h"
#include "core/error.h"

namespace mt::comm {
namespace {

using Clock = std::chrono::steady_clock;

std::string hostname() {
  char h[256] = {};
  gethostname(h, sizeof h - 1);
  return h;
}

bool gone(pid_t pid) { return kill(pid, 0) != 0; }

std::vector<pid_t> read_pids(const std::string& path) {
  std::vector<pid_t> out;
  std::ifstream f(path);
  int r;
  pid_t p;
  while (f >> r >> p) out.push_back(p);
  return out;
}

LaunchResult run_with_fault(const std::string& fault, double timeout, const std::string& flight_file = "") {
  LaunchOptions o;
  o.nproc = 4;
  o.backend = "shm";
  o.timeout_s = timeout;
  o.grace_s = 1;
  o.fault = fault;
  o.flight_file = flight_file;
  return run_ranks(o, [](Communicator& w) {
    float x[16] = {};
    for (int i = 0; i < 50; i++) w.all_reduce(x, x, 16, DType::f32, ReduceOp::sum);
  });
}

TEST(FlightEndToEnd, StalledRankIsNamedWithItsLastOperation) {
  const std::string pids = testing::TempDir() + "flight_e2e_pids.txt";
  const std::string file = testing::TempDir() + "flight_e2e.json";
  std::remove(file.c_str());
  setenv("MESHTRAIN_PIDS_FILE", pids.c_str(), 1);
  const auto t0 = Clock::now();
  LaunchResult r = run_with_fault("3:5:stop", 2, file);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  unsetenv("MESHTRAIN_PIDS_FILE");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_LT(took, 2 + 1 + 5) << "deadline 2 s + grace 1 s";
  EXPECT_EQ(r.waited_rank, 3) << r.failure;
  EXPECT_EQ(r.verdict, "all ranks but 3 entered all_reduce #5 on group world; rank 3 (host " + hostname() +
                           "; stopped (SIGSTOP or another stop signal)) has not entered it: its last operation was "
                           "all_reduce #4 on group world (done)");
  EXPECT_EQ(r.odd_ranks, std::vector<int>({3}));
  std::ifstream f(file);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_NE(ss.str().find("\"verdict\": \"all ranks but 3 entered all_reduce #5"), std::string::npos) << ss.str();
  EXPECT_NE(ss.str().find("\"rank\": 3,"), std::string::npos);
  for (pid_t p : read_pids(pids)) EXPECT_TRUE(gone(p)) << "rank process " << p << " survived";
  EXPECT_EQ(read_pids(pids).size(), 4u);
  EXPECT_EQ(shm::count_segments(getpid()), 0);
}

TEST(FlightEndToEnd, KilledRankIsNamedWithHowItDied) {
  const auto t0 = Clock::now();
  LaunchResult r = run_with_fault("1:7:kill", 30);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_LT(took, 10) << "a dead rank is known at once, well before the 30 s deadline";
  EXPECT_EQ(r.failed_rank, 1) << r.failure;
  EXPECT_EQ(r.verdict, "all ranks but 1 entered all_reduce #7 on group world; rank 1 (host " + hostname() +
                           "; killed by signal 9 (SIGKILL)) has not entered it: its last operation was all_reduce #6 "
                           "on group world (done)");
  EXPECT_TRUE(r.lost_ranks.empty());
  EXPECT_EQ(shm::count_segments(getpid()), 0);
}

TEST(FlightEndToEnd, LostRankIsReported) {
  LaunchResult r = run_with_fault("2:3:lose", 30);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.lost_ranks, std::vector<int>({2}));
  EXPECT_EQ(r.odd_ranks, std::vector<int>({2}));
}

TEST(FlightEndToEnd, BadFaultSpecIsRefusedBeforeAnyRankStarts) {
  EXPECT_THROW(run_with_fault("3:0:stop", 2), InputError);
}

TEST(FlightEndToEnd, SuccessfulJobHasNoVerdict) {
  LaunchResult r = run_with_fault("", 30);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(r.verdict.empty());
}

int open_fds() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) n += e.path().filename() != "." ? 1 : 0;
  return n;
}

// Many short jobs in this process, each with a random fault (kill or stop, random rank, random operation,
// some past the job's end so that it succeeds): every one ends within its bound, and the launcher keeps no
// file descriptor, /dev/shm entry or process of any of them.
TEST(FlightEndToEnd, RepeatedFaultyJobsLeakNothing) {
  std::mt19937 rng(29);
  const int fds_before = open_fds();
  const std::string pids = testing::TempDir() + "flight_soak_pids.txt";
  setenv("MESHTRAIN_PIDS_FILE", pids.c_str(), 1);
  int failed = 0, stopped = 0;
  for (int job = 0; job < 12; job++) {
    const int n = 2 + static_cast<int>(rng() % 3);
    const int rank = static_cast<int>(rng() % n);
    const int at = 1 + static_cast<int>(rng() % 60);  // the body issues 50 all-reduces: some faults never fire
    const bool stop = rng() % 3 == 0;
    LaunchOptions o;
    o.nproc = n;
    o.backend = "shm";
    o.timeout_s = stop ? 1 : 30;
    o.grace_s = 0.5;
    o.fault = str(rank, ":", at, stop ? ":stop" : ":kill");
    const auto t0 = Clock::now();
    LaunchResult r = run_ranks(o, [](Communicator& w) {
      float x[16] = {};
      for (int i = 0; i < 50; i++) w.all_reduce(x, x, 16, DType::f32, ReduceOp::sum);
    });
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    SCOPED_TRACE(o.fault + " on " + std::to_string(n) + " ranks: " + r.failure + " | " + r.verdict);
    EXPECT_EQ(r.exit_code, at <= 50 ? 1 : 0);
    EXPECT_LT(took, 10);
    if (at <= 50) {
      failed++;
      stopped += stop;
      EXPECT_EQ(r.odd_ranks, std::vector<int>({rank}));
      EXPECT_NE(r.verdict.find(str("all ranks but ", rank, " entered all_reduce #", at, " on group world")),
                std::string::npos);
    }
    for (pid_t p : read_pids(pids)) EXPECT_TRUE(gone(p)) << "rank process " << p << " survived";
    EXPECT_EQ(shm::count_segments(getpid()), 0);
  }
  unsetenv("MESHTRAIN_PIDS_FILE");
  EXPECT_EQ(open_fds(), fds_before);
  EXPECT_GT(failed, 6);  // the premise: most jobs had a fault, some of them a stall
  EXPECT_GT(stopped, 0);
}

}  // namespace
}  // namespace mt::comm
