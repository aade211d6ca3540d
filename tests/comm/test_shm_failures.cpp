// Failure behaviour of the shm backend and the launcher: a killed worker, a stalled worker (deadline), a
// mismatched collective, a mismatched message, a throwing body, Ctrl-C to the launcher and a killed
// launcher. Each must end the whole job promptly with a message naming the rank, and leave nothing in
// /dev/shm and no processes behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "comm/launch.h"
#include "comm/shm/job.h"
#include "core/error.h"

namespace mt::comm {
namespace {

using Clock = std::chrono::steady_clock;

LaunchOptions shm_opts(int n, double timeout, double grace = 1) {
  LaunchOptions o;
  o.nproc = n;
  o.backend = "shm";
  o.timeout_s = timeout;
  o.grace_s = grace;
  return o;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// True once pid is gone or a zombie of someone else (a killed launcher's orphans are reaped by init).
bool process_gone(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  if (!f) return true;
  std::string stat;
  std::getline(f, stat);
  auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && (stat[close + 2] == 'Z' || stat[close + 2] == 'X');
}

TEST(ShmFailure, WorkerKilledDuringAllReduce) {
  auto t0 = Clock::now();
  LaunchResult r = run_ranks(shm_opts(3, 60), [](Communicator& w) {
    std::vector<float> a(250'000, 1.f);
    if (w.rank() == 1) {
      w.all_reduce(a.data(), a.data(), a.size(), DType::f32, ReduceOp::sum);  // all three are in the loop now
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        raise(SIGKILL);
      }).detach();
    }
    for (;;) w.all_reduce(a.data(), a.data(), a.size(), DType::f32, ReduceOp::sum);
  });
  double took = seconds_since(t0);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_TRUE(contains(r.failure, "SIGKILL")) << r.failure;
  EXPECT_LT(took, 10.0);
  ASSERT_EQ(r.rank_errors.size(), 3u);
  for (int q : {0, 2}) {
    const std::string& e = r.rank_errors[q];
    EXPECT_TRUE(contains(e, "all_reduce #") && contains(e, "group 'world'") && contains(e, "world rank 1 failed") &&
                contains(e, "SIGKILL"))
        << "rank " << q << ": " << e;
  }
  EXPECT_EQ(shm::count_segments(getpid()), 0);
}

TEST(ShmFailure, StalledPeerHitsDeadline) {
  auto t0 = Clock::now();
  LaunchResult r = run_ranks(shm_opts(2, 1.0, 0.2), [](Communicator& w) {
    std::vector<float> a(1000, 1.f);
    w.all_reduce(a.data(), a.data(), a.size(), DType::f32, ReduceOp::sum);
    if (w.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(30));  // stalls; killed by the supervisor
    w.all_reduce(a.data(), a.data(), a.size(), DType::f32, ReduceOp::sum);
  });
  double took = seconds_since(t0);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.failed_rank, 0);
  EXPECT_EQ(r.waited_rank, 1) << "the headline names the rank waited for";
  EXPECT_TRUE(contains(r.failure, "all_reduce #2") && contains(r.failure, "timed out after 1 s") &&
              contains(r.failure, "waiting for rank 1"))
      << r.failure;
  EXPECT_GT(took, 0.9);
  EXPECT_LT(took, 6.0);
  EXPECT_TRUE(WIFSIGNALED(r.rank_status[1])) << "the stalled rank is stopped by the supervisor";
}

TEST(ShmFailure, PeerThatEndedEarlyIsAnErrorNotAHang) {
  auto t0 = Clock::now();
  LaunchResult r = run_ranks(shm_opts(2, 60), [](Communicator& w) {
    if (w.rank() == 1) return;  // a bug: rank 1 skips the all-reduce
    std::vector<float> a(1000, 1.f);
    w.all_reduce(a.data(), a.data(), a.size(), DType::f32, ReduceOp::sum);
  });
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.failed_rank, 0);
  EXPECT_TRUE(contains(r.failure, "all_reduce #1") && contains(r.failure, "has already ended (its body returned)"))
      << r.failure;
  EXPECT_LT(seconds_since(t0), 5.0);
}

TEST(ShmFailure, MismatchedCollectiveReportedOnEveryRank) {
  LaunchResult r = run_ranks(shm_opts(2, 30), [](Communicator& w) {
    std::vector<float> a(1000, 1.f), b(1000);
    w.barrier();
    if (w.rank() == 0) {
      w.all_reduce(a.data(), b.data(), 1000, DType::f32, ReduceOp::sum);
    } else {
      w.all_gather(a.data(), b.data(), 10, DType::f32);
    }
  });
  EXPECT_NE(r.exit_code, 0);
  for (int q : {0, 1}) {
    const std::string& e = r.rank_errors[q];
    EXPECT_TRUE(contains(e, "mismatched collectives") && contains(e, "all_reduce #2 (count=1000, f32, sum)") &&
                contains(e, "all_gather #2 (count=10, f32)"))
        << "rank " << q << ": " << e;
  }
}

TEST(ShmFailure, MismatchedAllToAllVCounts) {
  LaunchResult r = run_ranks(shm_opts(2, 30), [](Communicator& w) {
    std::vector<float> a(20), b(20);
    size_t sc[2] = {3, 3}, rc[2] = {3, w.rank() == 0 ? size_t(4) : size_t(3)};
    w.all_to_all_v(a.data(), sc, nullptr, b.data(), rc, nullptr, DType::f32);
  });
  EXPECT_NE(r.exit_code, 0);
  for (int q : {0, 1}) {
    EXPECT_TRUE(contains(r.rank_errors[q], "rank 1 sends 3 elements to rank 0 but rank 0 expects 4"))
        << r.rank_errors[q];
  }
}

TEST(ShmFailure, MismatchedMessageSize) {
  LaunchResult r = run_ranks(shm_opts(2, 30), [](Communicator& w) {
    std::vector<float> a(12);
    if (w.rank() == 0) w.send(a.data(), 10, DType::f32, 1, 3);
    if (w.rank() == 1) w.recv(a.data(), 12, DType::f32, 0, 3);
  });
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_TRUE(contains(r.failure, "expects 48 bytes but the message has 40")) << r.failure;
}

TEST(ShmFailure, ThrowingBodyNamesRank) {
  LaunchResult r = run_ranks(shm_opts(4, 30), [](Communicator& w) {
    if (w.rank() == 2) throw InputError("bad shard file data/x.bin");
    w.barrier();
  });
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.failed_rank, 2);
  EXPECT_EQ(r.failure, "bad shard file data/x.bin");
  EXPECT_TRUE(contains(r.rank_errors[0], "barrier #1") && contains(r.rank_errors[0], "world rank 2 failed"))
      << r.rank_errors[0];
}

TEST(ShmFailure, UsableAfterFailureThrowsAtOnce) {
  LaunchResult r = run_ranks(shm_opts(2, 0.3, 0.1), [](Communicator& w) {
    std::vector<float> a(10);
    if (w.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(5));
      return;
    }
    Request q = w.iall_reduce(a.data(), a.data(), 10, DType::f32, ReduceOp::sum);
    Request q2 = w.iall_reduce(a.data(), a.data(), 10, DType::f32, ReduceOp::sum);
    try {
      q.wait();
    } catch (const CommError&) {
    }
    auto t0 = Clock::now();
    try {
      q2.wait();
    } catch (const CommError& e) {
      MT_REQUIRE(Error, contains(e.what(), "unusable after an earlier failure"), "unexpected: ", e.what());
      MT_REQUIRE(Error, seconds_since(t0) < 0.2, "second op should fail at once");
      throw;
    }
  });
  EXPECT_EQ(r.failed_rank, 0);
  EXPECT_TRUE(contains(r.failure, "unusable after an earlier failure")) << r.failure;
}

// Runs launch() in a child process that reports its workers' pids through a pipe once all of them are in
// the body; returns the launcher's pid and the worker pids.
struct Supervised {
  pid_t launcher;
  std::vector<pid_t> workers;
};
Supervised start_supervised(int n) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  pid_t launcher = fork();
  if (launcher == 0) {
    close(fds[0]);
    int rc = launch(shm_opts(n, 60), [&](Communicator& w) {
      pid_t me = getpid();
      MT_REQUIRE(Error, write(fds[1], &me, sizeof me) == sizeof me, "pipe");
      for (;;) w.barrier();  // until interrupted
    });
    _exit(rc);
  }
  close(fds[1]);
  Supervised s{launcher, {}};
  for (int i = 0; i < n; ++i) {
    pid_t p;
    EXPECT_EQ(read(fds[0], &p, sizeof p), static_cast<ssize_t>(sizeof p));
    s.workers.push_back(p);
  }
  close(fds[0]);
  return s;
}

TEST(ShmLaunch, CtrlCStopsAllWorkers) {
  Supervised s = start_supervised(3);
  kill(s.launcher, SIGINT);
  int st = 0;
  ASSERT_EQ(waitpid(s.launcher, &st, 0), s.launcher);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 128 + SIGINT);
  for (pid_t p : s.workers) EXPECT_TRUE(process_gone(p)) << "worker " << p << " survived";
  EXPECT_EQ(shm::count_segments(s.launcher), 0);
}

TEST(ShmLaunch, KilledLauncherTakesWorkersAlong) {
  Supervised s = start_supervised(2);
  kill(s.launcher, SIGKILL);
  int st = 0;
  ASSERT_EQ(waitpid(s.launcher, &st, 0), s.launcher);
  auto t0 = Clock::now();
  for (pid_t p : s.workers) {
    while (!process_gone(p) && seconds_since(t0) < 10) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_TRUE(process_gone(p)) << "worker " << p << " outlived its launcher";
  }
  EXPECT_EQ(shm::count_segments(s.launcher), 0);
}

TEST(ShmLaunch, RejectsBadOptions) {
  LaunchOptions o;
  o.backend = "tcp";
  EXPECT_THROW(validate(o), InputError);
  o.backend = "shm";
  o.timeout_s = 0;
  EXPECT_THROW(validate(o), InputError);
  o.timeout_s = 1;
  o.nproc = -2;
  EXPECT_THROW(validate(o), InputError);
}

}  // namespace
}  // namespace mt::comm
