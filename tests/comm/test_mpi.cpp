// The MPI backend under mpirun (registered by extra.cmake as comm_mpi_np<N>, run with --gtest_filter=Mpi*):
// the same checks as the shm backend. Outside mpirun these tests skip.
#include <gtest/gtest.h>

#include "comm/launch.h"
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

}  // namespace
}  // namespace mt::comm
