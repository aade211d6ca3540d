// The MPI backend under mpirun (registered by extra.cmake as comm_mpi_np<N>, run with --gtest_filter=Mpi*):
// the same checks as the shm backend. Outside mpirun these tests skip.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>

#include "comm/launch.h"
#include "comm/mpi/hier_allgather.h"
#include "comm/mpi/hier_allreduce.h"
#include "comm/mpi/mpi_comm.h"
#include "tests/comm/comm_checks.h"

namespace mt::comm {
namespace {

using namespace mt::comm::testing;

LaunchOptions mpi_opts() {
  LaunchOptions o;
  o.backend = "mpi";
  o.timeout_s = 120;
  return o;
}

#define MT_NEED_MPIRUN() \
  if (!under_mpirun()) GTEST_SKIP() << "runs under mpirun only (ctest comm_mpi_np*)"

TEST(Mpi, AllCollectivesMatchReference) {
  MT_NEED_MPIRUN();
  EXPECT_EQ(run_ranks(mpi_opts(), [](Communicator& w) { check_all_ops(w, {0, 1, 13, 1031, 600'000}); }).exit_code, 0);
}

TEST(Mpi, PointToPoint) {
  MT_NEED_MPIRUN();
  EXPECT_EQ(run_ranks(mpi_opts(), [](Communicator& w) { check_p2p(w, {0, 1, 13, 100'000}); }).exit_code, 0);
}

TEST(Mpi, SubgroupsConcurrentlyAndNonBlocking) {
  MT_NEED_MPIRUN();
  EXPECT_EQ(run_ranks(mpi_opts(),
                      [](Communicator& w) {
                        auto g = w.split(w.rank() % 2, w.rank(), "half");
                        check_all_ops(*g, {0, 1, 13, 20'011});
                        std::vector<float> a(1000, float(w.rank())), b(1000, 1.f);
                        Request q = w.iall_reduce(a.data(), a.data(), 1000, DType::f32, ReduceOp::max);
                        g->all_reduce(b.data(), b.data(), 1000, DType::f32, ReduceOp::sum);
                        q.wait();
                        MT_REQUIRE(Error, a[999] == float(w.size() - 1) && b[0] == float(g->size()), "overlap");
                      })
                .exit_code,
            0);
}

TEST(Mpi, MismatchedCollectiveReported) {
  MT_NEED_MPIRUN();
  EXPECT_EQ(run_ranks(mpi_opts(),
                      [](Communicator& w) {
                        if (w.size() < 2) return;
                        std::vector<float> a(1000), b(1000);
                        try {
                          if (w.rank() == 0) {
                            w.all_reduce(a.data(), b.data(), 1000, DType::f32, ReduceOp::sum);
                          } else {
                            w.all_gather(a.data(), b.data(), 10, DType::f32);
                          }
                        } catch (const CommError& e) {
                          std::string m = e.what();
                          MT_REQUIRE(Error, m.find("mismatched collectives") != std::string::npos, m);
                          return;
                        }
                        throw Error("mismatch not detected");
                      })
                .exit_code,
            0);
}

// Rank p's element i: signs and magnitudes from 2^-10 to 2^10 mixed, so float32 sums depend on their order.
float order_sensitive_input(int p, size_t i) {
  uint64_t x = (uint64_t(p) + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t(i) + 7) * 0xC2B2AE3D27D4EB4Full;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  const float mant = 1.0f + float(x & 0xFFFFFF) / float(1 << 24);
  const int e = int((x >> 24) % 21) - 10;
  return std::ldexp((x >> 45) & 1 ? -mant : mant, e);
}

// Every split of the world into hosts of k contiguous ranks (k = 1 .. n dividing n, made up with MPI_Comm_split
// on one machine) gives the left fold over ranks in rank order, bit for bit, for sum and max, in and out of
// place, at sizes 0, 1, fewer elements than ranks per host, and uneven chunks; the inputs are such that another
// order (the right fold) gives other bits somewhere when n >= 3.
TEST(Mpi, HierarchicalAllReduceIsTheRankOrderFoldForEveryHostSplit) {
  MT_NEED_MPIRUN();
  EXPECT_EQ(run_ranks(mpi_opts(),
                      [](Communicator& w) {
                        const int n = w.size(), r = w.rank();
                        long differ = 0;
                        for (int k = 1; k <= n; ++k) {
                          if (n % k) continue;
                          MPI_Comm node;
                          MPI_Comm_split(MPI_COMM_WORLD, r / k, r, &node);
                          {
                            mpi::HierAllReduce h(MPI_COMM_WORLD, node);
                            MT_REQUIRE(Error, h.hosts() == n / k && h.per_host() == k, "shape");
                            for (size_t count : {size_t(0), size_t(1), size_t(3), size_t(1031), size_t(100'003)}) {
                              for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
                                std::vector<float> in(count), out(count, NAN), want(count);
                                for (size_t i = 0; i < count; ++i) {
                                  in[i] = order_sensitive_input(r, i);
                                  float a = order_sensitive_input(0, i), b = order_sensitive_input(n - 1, i);
                                  for (int p = 1; p < n; ++p) {
                                    const float x = order_sensitive_input(p, i);
                                    a = op == ReduceOp::max ? std::max(a, x) : a + x;
                                  }
                                  for (int p = n - 2; p >= 0; --p) b = order_sensitive_input(p, i) + b;
                                  want[i] = a;
                                  if (op == ReduceOp::sum && b != a) ++differ;
                                }
                                auto what = [] { return std::string("test all-reduce"); };
                                h.run(in.data(), out.data(), count, op, 60, what);
                                MT_REQUIRE(Error, std::memcmp(out.data(), want.data(), count * 4) == 0, "hosts of ", k,
                                           ", count ", count, ", ", reduce_op_name(op), ": not the rank-order fold");
                                h.run(in.data(), in.data(), count, op, 60, what);
                                MT_REQUIRE(Error, std::memcmp(in.data(), want.data(), count * 4) == 0, "hosts of ", k,
                                           ", count ", count, ", ", reduce_op_name(op), ", in place");
                              }
                            }
                          }
                          MPI_Comm_free(&node);
                        }
                        MT_REQUIRE(Error, n < 3 || differ > 0, "the inputs do not depend on the order");
                        // Hosts that are not contiguous rank ranges are refused on every rank.
                        if (n >= 4 && n % 2 == 0) {
                          MPI_Comm node;
                          MPI_Comm_split(MPI_COMM_WORLD, r % 2, r, &node);
                          bool refused = false;
                          try {
                            mpi::HierAllReduce h(MPI_COMM_WORLD, node);
                          } catch (const CommError& e) {
                            refused = std::string(e.what()).find("contiguous") != std::string::npos;
                          }
                          MPI_Comm_free(&node);
                          MT_REQUIRE(Error, refused, "a split into ranks {0, 2, ..} and {1, 3, ..} was not refused");
                        }
                        // On one machine every rank shares the host: the flat MPI all-reduce is kept.
                        auto* m = dynamic_cast<mpi::MpiCommunicator*>(&w);
                        MT_REQUIRE(Error, m && m->hierarchical() == nullptr, "one host, yet hierarchical");
                      })
                .exit_code,
            0);
}

// The hierarchical all-reduce is the default where OpenMPI's MPI_Iallreduce crosses hosts with more bytes: every
// rank count from 4 that is not a power of two (2 x 3, 3 x 2, 2 x 5, 3 x 4, ...), never 4, 8, 16 (where both send
// about 2 (H - 1) S between hosts) nor fewer than 4 ranks (no host split then). A pure rule: no mpirun needed.
TEST(HierAllReduceDefault, WhereOpenMpiCrossesHostsWithMoreBytes) {
  for (int n = 1; n <= 64; ++n) {
    const bool pow2 = (n & (n - 1)) == 0;
    EXPECT_EQ(mpi::HierAllReduce::default_for(n), n >= 4 && !pow2) << n << " ranks";
  }
}

// The hierarchical all-gather for every split into hosts of k contiguous ranks (made up on one machine): the
// result is every rank's shard in rank order (element i of the full vector is the byte pattern of (i, its owner)),
// for 4- and 2-byte elements, in and out of place, at sizes 0, 1, fewer elements than ranks, and uneven shards;
// and the window is reused across calls of growing and shrinking sizes (double-buffered slots).
TEST(Mpi, HierarchicalAllGatherForEveryHostSplit) {
  MT_NEED_MPIRUN();
  EXPECT_EQ(run_ranks(mpi_opts(),
                      [](Communicator& w) {
                        const int n = w.size(), r = w.rank();
                        for (int k = 1; k <= n; ++k) {
                          if (n % k) continue;
                          MPI_Comm node;
                          MPI_Comm_split(MPI_COMM_WORLD, r / k, r, &node);
                          {
                            mpi::HierAllReduce h(MPI_COMM_WORLD, node);
                            for (size_t elem : {size_t(4), size_t(2)}) {
                              for (size_t count : {size_t(0), size_t(1), size_t(3), size_t(100'003), size_t(1031)}) {
                                std::vector<unsigned char> want(count * elem);
                                for (size_t i = 0; i < count; ++i) {
                                  int owner = 0;
                                  while (!(i < shard_of(count, n, owner).offset + shard_of(count, n, owner).count)) ++owner;
                                  for (size_t b = 0; b < elem; ++b) want[i * elem + b] = uint8_t(i * 7 + b * 31 + owner * 101);
                                }
                                const Shard own = shard_of(count, n, r);
                                std::vector<unsigned char> mine(want.begin() + own.offset * elem,
                                                                want.begin() + (own.offset + own.count) * elem);
                                std::vector<unsigned char> out(count * elem, 0xEE);
                                auto what = [] { return std::string("test all-gather"); };
                                mpi::hier_all_gather(h, mine.data(), out.data(), count, elem, 60, what);
                                MT_REQUIRE(Error, out == want, "hosts of ", k, ", count ", count, ", ", elem,
                                           "-byte elements: not every shard in rank order");
                                std::vector<unsigned char> in_place(count * elem, 0xEE);
                                std::memcpy(in_place.data() + own.offset * elem, mine.data(), mine.size());
                                mpi::hier_all_gather(h, in_place.data() + own.offset * elem, in_place.data(), count,
                                                     elem, 60, what);
                                MT_REQUIRE(Error, in_place == want, "hosts of ", k, ", count ", count, ", ", elem,
                                           "-byte elements, in place");
                              }
                            }
                          }
                          MPI_Comm_free(&node);
                        }
                        // On one machine every rank shares the host: the flat MPI all-gather is kept.
                        auto* m = dynamic_cast<mpi::MpiCommunicator*>(&w);
                        MT_REQUIRE(Error, m && !m->hierarchical_all_gather(), "one host, yet hierarchical all-gather");
                      })
                .exit_code,
            0);
}

}  // namespace
}  // namespace mt::comm
