// The Local SGD exchange (train/grad_sync.h, method local SGD) on 2 forked ranks: exact data parallelism during
// the warm-up, then each rank's own gradient (scaled to the global-batch mean's size) and its own replica, the
// replicas averaged over dp every H steps. SGD without momentum at lr 1/2 and gradients of small integers keep
// every value exact, so parameters are compared bit for bit against the arithmetic written out below.
#include <gtest/gtest.h>

#include "core/error.h"
#include "optim/optimizer.h"
#include "parallel/data/data_parallel.h"
#include "parallel/mesh/mesh.h"
#include "sgd_exchange_rig.h"
#include "shm_ranks.h"
#include "train/grad_sync.h"

namespace {

using namespace mt::train;

// Warm-up 1 step, then H = 2: step 0 exact, step 1 local, step 2 local then averaged. Rank r's gradient of
// element i at step s: r + 1 + i + s. Parameters start at 0; p -= lr g with lr = 1/2:
//   after 0: p = -(1/2)(g_0 + g_1) = -(3 + 2i)/2 on both ranks
//   after 1: p_r = -(3 + 2i)/2 - 2 (r + 2 + i) / 2      (local: own gradient x dp)
//   after 2: p_r -= (r + 3 + i), then the mean over r: -(3 + 2i)/2 - (6 + 2i) = -7.5 - 3i
TEST(LocalSgdExchange, WarmupExactThenLocalStepsThenAveraged) {
  auto res = mt::test::run_shm_ranks(
      2,
      [&](mt::comm::Communicator& world) {
        const int r = world.rank();
        mt::parallel::Mesh mesh(&world, mt::parallel::MeshGrid(2, 2, 1, 1));
        SyncOptions o;
        o.method = SyncMethod::local_sgd;
        o.local_every = 2;
        o.local_warmup = 1;
        mt::test::SgdExchangeRig rig(o, mesh, store_groups(o, mesh));
        const bool want_synced[3] = {true, false, true};
        for (int64_t s = 0; s < 3; s++) {
          const nlohmann::json row = rig.step(s, r);
          MT_REQUIRE(mt::Error, row.value("synced", !want_synced[s]) == want_synced[s], "step ", s, " synced ",
                     row.dump());
          for (const mt::nn::Param& p : rig.params.params())
            for (size_t i = 0; i < p.numel; i++) {
              const float fi = (float)i, p0 = -(3 + 2 * fi) / 2;
              const float want = s == 0 ? p0 : s == 1 ? p0 - (r + 2 + fi) : -7.5f - 3 * fi;
              MT_REQUIRE(mt::Error, p.data[i] == want, "rank ", r, " step ", s, " ", p.name, "[", i, "] = ", p.data[i],
                         ", want ", want);
            }
        }
      },
      30);
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

}  // namespace
