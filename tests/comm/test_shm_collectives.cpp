// Every operation of the shm backend against the serial reference, for world sizes 1 to 8 (oversubscribed on
// small machines), sizes 0, 1, a prime and a few MB, both dtypes; sub-groups running at the same time;
// non-blocking operations; counters.
#include <gtest/gtest.h>
#include <cstdlib>
#include <unistd.h>

#include <thread>

#include "comm/copy.h"
#include "comm/launch.h"
#include "comm/shm/job.h"
#include "comm/shm/shm_comm.h"
#include "tests/comm/comm_checks.h"
#include "tests/comm/shm_launch.h"

namespace mt::comm {
namespace {

using namespace mt::comm::testing;

void expect_ok(const LaunchResult& r) {
  EXPECT_EQ(r.exit_code, 0) << "rank " << r.failed_rank << ": " << r.failure;
}

// 600'000 f32 elements = 2.4 MB: several slots' worth, so chunking and double buffering are exercised.
const std::vector<size_t> kSizes = {0, 1, 13, 1031, 600'000};
const std::vector<size_t> kSmallSizes = {0, 1, 13, 70'001};

class ShmWorld : public ::testing::TestWithParam<int> {};

TEST_P(ShmWorld, AllCollectivesMatchReference) {
  expect_ok(run_ranks(shm_opts(GetParam()), [](Communicator& w) { check_all_ops(w, kSizes); }));
}

TEST_P(ShmWorld, PointToPoint) {
  expect_ok(run_ranks(shm_opts(GetParam()), [](Communicator& w) { check_p2p(w, {0, 1, 13, 300'000}); }));
}

INSTANTIATE_TEST_SUITE_P(Sizes, ShmWorld, ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8));

// Above kStreamMinBytes the copy-out uses streaming stores: check that path too (17.6 MB, 2 ranks).
TEST(ShmLarge, StreamingCopyOut) {
  static_assert(4'400'003 * 4 > kStreamMinBytes);
  expect_ok(run_ranks(shm_opts(2), [](Communicator& w) {
    const size_t n = 4'400'003;
    check_all_reduce(w, n, DType::f32, ReduceOp::sum, false);
    check_all_gather(w, n, DType::f32, false);
    w.set_algorithm(Algo::rs_ag);
    check_reduce(w, n, DType::f32, ReduceOp::sum, 1);
  }));
}

// With MESHTRAIN_SHM_CMA=0 broadcasts of 64 KB and more take the staged pipeline instead of the single-copy
// path (which the tests above take): check it against the reference too.
TEST(ShmLarge, StagedBroadcastWithoutCma) {
  setenv("MESHTRAIN_SHM_CMA", "0", 1);
  LaunchResult res = run_ranks(shm_opts(3), [](Communicator& w) {
    for (size_t s : {size_t{20'000}, size_t{600'003}}) {
      for (int root = 0; root < w.size(); ++root) check_broadcast(w, s, DType::f32, root);
      check_broadcast(w, s, DType::bf16, 1);
    }
  });
  unsetenv("MESHTRAIN_SHM_CMA");
  expect_ok(res);
}

// Many one-chunk collectives in a row: the writers' slot offsets rotate and wrap (claim_slot), with shards
// and all_to_all_v blocks of different sizes on different ranks; every result against the reference.
TEST(ShmSlots, RotatingOffsetsStayConsistent) {
  expect_ok(run_ranks(shm_opts(3), [](Communicator& w) {
    for (int rep = 0; rep < 40; ++rep) {
      const size_t s = 1000 + size_t(rep) * 1777;  // 4..290 KB of f32
      check_all_gather(w, s, DType::f32, rep % 2 == 0);
      check_reduce_scatter(w, s, DType::f32, ReduceOp::sum, false);
      check_all_reduce(w, s, DType::f32, ReduceOp::sum, false);
      check_all_to_all(w, s / 3 + 1, DType::f32, false);
      check_all_to_all_v(w, s / 9 + 1, DType::f32);
      check_broadcast(w, s / 4, DType::bf16, rep % 3);
    }
  }));
}

// Two halves of the world (even and odd ranks) run the whole suite at the same time.
TEST(ShmSplit, TwoSubgroupsConcurrently) {
  expect_ok(run_ranks(shm_opts(6), [](Communicator& w) {
    auto g = w.split(w.rank() % 2, -w.rank(), w.rank() % 2 ? "odd" : "even");
    MT_REQUIRE(Error, g && g->size() == 3, "bad split size");
    // key = -rank: ranks are ordered by descending world rank.
    MT_REQUIRE(Error, g->rank() == (w.size() - 1 - w.rank()) / 2, "bad split order: world ", w.rank(), " -> ",
               g->rank());
    check_all_ops(*g, kSmallSizes);
    check_p2p(*g, {1, 100'000});
    w.barrier();
  }));
}

// A 2x2 mesh: rows ("tp") and columns ("dp"); non-blocking collectives on one group overlap blocking ones
// on the other, and neither sees the other's data.
TEST(ShmSplit, MeshGroupsOverlapWithoutMixing) {
  expect_ok(run_ranks(shm_opts(4), [](Communicator& w) {
    const int r = w.rank();
    auto tp = w.split(r / 2, r, "tp");
    auto dp = w.split(r % 2, r, "dp");
    auto none = w.split(-1, 0);
    MT_REQUIRE(Error, !none, "colour < 0 must give no group");
    const size_t n = 200'000;
    std::vector<float> a(n, float(r)), b(n, float(10 * r)), c(n);
    Request q = dp->iall_reduce(a.data(), a.data(), n, DType::f32, ReduceOp::sum);
    tp->all_reduce(b.data(), c.data(), n, DType::f32, ReduceOp::sum);
    q.wait();
    float want_dp = float(r % 2) + float(r % 2 + 2), want_tp = 10.f * float((r / 2) * 2) + 10.f * float((r / 2) * 2 + 1);
    for (size_t i = 0; i < n; i += 997) {
      MT_REQUIRE(Error, a[i] == want_dp && c[i] == want_tp, "rank ", r, " dp ", a[i], " (want ", want_dp, ") tp ",
                 c[i], " (want ", want_tp, ")");
    }
    // Each group driven from its own thread at the same time.
    std::thread other([&] { check_all_ops(*tp, {0, 13, 30'011}); });
    check_all_ops(*dp, {0, 13, 30'011});
    other.join();
    // Sub-groups of sub-groups.
    auto solo = tp->split(tp->rank(), 0, "solo");
    MT_REQUIRE(Error, solo->size() == 1 && solo->rank() == 0, "solo group");
    check_all_reduce(*solo, 13, DType::f32, ReduceOp::sum, false);
  }));
}

TEST(ShmNonBlocking, ManyOutstandingThenWait) {
  expect_ok(run_ranks(shm_opts(3), [](Communicator& w) {
    const int n = w.size(), r = w.rank();
    const size_t k = 50'000;
    std::vector<std::vector<float>> bufs(6, std::vector<float>(k));
    std::vector<float> gathered(k * 2);
    std::vector<Request> reqs;
    for (int j = 0; j < 6; ++j) {
      std::fill(bufs[j].begin(), bufs[j].end(), float(r + j));
      reqs.push_back(w.iall_reduce(bufs[j].data(), bufs[j].data(), k, DType::f32, ReduceOp::sum));
    }
    Shard s = shard_of(k * 2, n, r);
    std::vector<float> mine(s.count, float(r));
    reqs.push_back(w.iall_gather(mine.data(), gathered.data(), k * 2, DType::f32));
    reqs.push_back(w.ibarrier());
    // A blocking collective issued now runs after the pending ones.
    std::vector<float> x(7, 1.f);
    w.all_reduce(x.data(), x.data(), 7, DType::f32, ReduceOp::sum);
    MT_REQUIRE(Error, x[0] == float(n), "blocking after non-blocking");
    wait_all(reqs);
    for (int j = 0; j < 6; ++j) {
      float want = float(n * (n - 1) / 2 + n * j);
      MT_REQUIRE(Error, bufs[j][0] == want && bufs[j][k - 1] == want, "iall_reduce ", j, " got ", bufs[j][0]);
    }
    for (int p = 0; p < n; ++p) {
      Shard sp = shard_of(k * 2, n, p);
      MT_REQUIRE(Error, gathered[sp.offset] == float(p), "iall_gather block ", p);
    }
  }));
}

TEST(ShmNonBlocking, ProgressesWithoutWaitCalls) {
  // Rank 0 starts an all-reduce and does not wait for a while; rank 1's blocking all-reduce must still finish,
  // which needs rank 0's progress thread.
  expect_ok(run_ranks(shm_opts(2), [](Communicator& w) {
    std::vector<float> a(300'000, 1.f);
    if (w.rank() == 0) {
      Request q = w.iall_reduce(a.data(), a.data(), a.size(), DType::f32, ReduceOp::sum);
      std::vector<float> ack(1);
      // Rank 1 sends this only after its all-reduce completed, which needs rank 0's part to have run
      // already (its last step included): the progress thread did that while we were not waiting.
      w.recv(ack.data(), 1, DType::f32, 1, 5);
      q.wait();
    } else {
      w.all_reduce(a.data(), a.data(), a.size(), DType::f32, ReduceOp::sum);
      float one = 1;
      w.send(&one, 1, DType::f32, 0, 5);
    }
    MT_REQUIRE(Error, a[0] == 2.f && a.back() == 2.f, "result");
  }));
}

TEST(ShmP2P, ReceiveLargerThanTheRingDrainsWhileTheReceiverWaitsElsewhere) {
  // Rank 1 posts a receive larger than the p2p ring and then waits in a barrier (a collective: no p2p calls);
  // rank 0's blocking send of that message can end only while rank 1's progress thread drains the ring, and
  // rank 0 joins the barrier after it. (A posted receive that fits the ring needs no thread: the rank's own
  // next call reads it; one larger than the ring does.)
  expect_ok(run_ranks(shm_opts(2, 20), [](Communicator& w) {
    const size_t n = mt::comm::shm::kChannelBytes / sizeof(float) * 3 / 2 + 7;  // one and a half rings
    std::vector<float> a(n);
    if (w.rank() == 0) {
      for (size_t i = 0; i < n; i++) a[i] = float(i % 1000);
      w.send(a.data(), n, DType::f32, 1, 9);
      w.barrier();
    } else {
      Request r = w.irecv(a.data(), n, DType::f32, 0, 9);
      w.barrier();
      r.wait();
      for (size_t i = 0; i < n; i += 4099) MT_REQUIRE(Error, a[i] == float(i % 1000), "element ", i, " ", a[i]);
      MT_REQUIRE(Error, a[n - 1] == float((n - 1) % 1000), "last element ", a[n - 1]);
    }
  }));
}

TEST(ShmCounters, BytesPerOpKind) {
  expect_ok(run_ranks(shm_opts(4), [](Communicator& w) {
    const size_t n = 1000;  // 4000 bytes, shards of 1000 bytes
    std::vector<float> a(n), b(n);
    w.all_reduce(a.data(), b.data(), n, DType::f32, ReduceOp::sum);
    w.all_gather(a.data() + shard_of(n, 4, w.rank()).offset, b.data(), n, DType::f32);
    w.all_to_all(a.data(), b.data(), n / 4, DType::bf16);
    if (w.rank() == 0) w.send(a.data(), 10, DType::f32, 1, 0);
    if (w.rank() == 1) w.recv(a.data(), 10, DType::f32, 0, 0);
    Counters c = w.counters();
    auto k = [](OpKind o) { return static_cast<int>(o); };
    MT_REQUIRE(Error, c.bytes_sent[k(OpKind::all_reduce)] == 6000 && c.bytes_recv[k(OpKind::all_reduce)] == 6000,
               "all_reduce bytes ", c.bytes_sent[k(OpKind::all_reduce)]);
    MT_REQUIRE(Error, c.bytes_sent[k(OpKind::all_gather)] == 3000, "all_gather bytes");
    MT_REQUIRE(Error, c.bytes_sent[k(OpKind::all_to_all)] == 3 * 500, "all_to_all bytes ",
               c.bytes_sent[k(OpKind::all_to_all)]);
    MT_REQUIRE(Error, c.calls[k(OpKind::all_reduce)] == 1, "calls");
    if (w.rank() == 0) MT_REQUIRE(Error, c.bytes_sent[k(OpKind::send)] == 40, "send bytes");
    if (w.rank() == 1) MT_REQUIRE(Error, c.bytes_recv[k(OpKind::recv)] == 40, "recv bytes");
    MT_REQUIRE(Error, w.collectives_issued() == 3, "seq");
  }));
}

TEST(ShmLaunch, NothingLeftInDevShm) {
  expect_ok(run_ranks(shm_opts(3), [](Communicator& w) {
    MT_REQUIRE(Error, shm::count_segments(getppid()) == 0, "segment visible in /dev/shm while running");
    w.barrier();
  }));
  EXPECT_EQ(shm::count_segments(getpid()), 0);
}

}  // namespace
}  // namespace mt::comm
