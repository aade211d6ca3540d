// The gradient exchange apart from the parameter store (train/grad_sync.h): the run builds the store over
// store_groups() and hands it to the exchange. On 2 forked ranks: the exact exchange gives its store the
// data-parallel group and reduces through it, both with the hooks run during backward and without them (a
// pipeline's executor), the gradients holding small integers so the sums are exact; the methods that move
// gradients themselves give their store no group.
#include "train/grad_sync.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "parallel/data/data_parallel.h"
#include "parallel/mesh/mesh.h"
#include "shm_ranks.h"

namespace {

using namespace mt::train;

// Rank r's gradient of element i: r + 1 + i; the sum over 2 ranks: 3 + 2 i.
void run_exact(bool overlapped) {
  auto res = mt::test::run_shm_ranks(
      2,
      [&](mt::comm::Communicator& world) {
        mt::parallel::Mesh mesh(&world, mt::parallel::MeshGrid(2, 2, 1, 1));
        SyncOptions o;
        o.overlapped = overlapped;
        const StoreGroups on = store_groups(o, mesh);
        MT_REQUIRE(mt::Error, on.group == mesh.dp() && on.group && on.group->size() == 2, "exact: store over dp");
        mt::nn::ParamRegistry params;
        params.add("a", {5});
        params.add("b", {2, 3}, {}, 1);
        mt::parallel::DataParallel store(params, on.group, o.engine, on.experts);
        mt::trace::ChromeTrace tracer;
        auto sync = make_grad_sync(o, mesh, store, params, &tracer);
        sync->begin_step(0);
        const StepHooks hooks = sync->hooks();
        if (overlapped) hooks.micro_batch(0, 1);
        for (int k = (int)params.params().size() - 1; k >= 0; k--) {  // backward: the last group first
          mt::nn::Param& p = params.params()[k];
          if (overlapped) hooks.params->before_backward(p.group);
          for (size_t i = 0; i < p.numel; i++) p.grad_acc()[i] = (float)(world.rank() + 1 + i);
          if (overlapped) hooks.params->after_backward(p.group);
        }
        sync->reduce(0);
        for (const mt::nn::Param& p : params.params())
          for (size_t i = 0; i < p.numel; i++)
            MT_REQUIRE(mt::Error, p.grad[i] == 3.0f + 2.0f * i, p.name, "[", i, "] = ", p.grad[i], ", want ",
                       3 + 2 * i);
        // The norm over the reduced gradient: a = 3 5 7 9 11, b = 3 5 7 9 11 13.
        const double want = std::sqrt(2 * (9 + 25 + 49 + 81 + 121) + 169.0);
        MT_REQUIRE(mt::Error, sync->grad_norm() == want, "norm ", sync->grad_norm(), ", want ", want);
      },
      30);
  EXPECT_EQ(res.exit_code, 0) << "overlapped " << overlapped << ": rank " << res.failed_rank << ": " << res.failure;
}

TEST(GradSync, ExactExchangeReducesThroughTheStoreWithAndWithoutHooks) {
  run_exact(true);
  run_exact(false);
}

TEST(GradSync, MethodsThatMoveGradientsThemselvesGiveTheStoreNoGroup) {
  auto res = mt::test::run_shm_ranks(
      2,
      [&](mt::comm::Communicator& world) {
        mt::parallel::Mesh mesh(&world, mt::parallel::MeshGrid(2, 2, 1, 1));
        for (SyncMethod m : {SyncMethod::compressed, SyncMethod::local_sgd, SyncMethod::parameter_server}) {
          SyncOptions o;
          o.method = m;
          const StoreGroups on = store_groups(o, mesh);
          MT_REQUIRE(mt::Error, !on.group && !on.experts, "method ", (int)m, " gives its store a group");
        }
      },
      30);
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

}  // namespace
