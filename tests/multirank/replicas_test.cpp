// Replica facts (train/replicas.h, nn::Replicas) on real ranks: a GPT split over tp 2 x pp 2 (4 forked
// ranks) with the tied embedding on the first and the last stage. Every rank's gradient holds the value of
// the whole model's gradient at the same place (v below: small integers, so float32 sums are exact); the
// global norm the synchronizer computes must count each element of the model once: the tp-replicated
// LayerNorms and biases once over the tp pair, the tied embedding once over the two stages.
#include "train/replicas.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "core/error.h"
#include "model/gpt.h"
#include "parallel/mesh/mesh.h"
#include "parallel/tensor/tp_ops.h"
#include "shm_ranks.h"
#include "train/grad_sync.h"
#include "train/task.h"

namespace {

// The whole model's gradient at element `index` of tensor `name`: -2 .. 2.
float v(const std::string& name, int64_t index) {
  return (float)(((int64_t)(std::hash<std::string>{}(name) % 5) + index) % 5) - 2.0f;
}

TEST(ReplicaFacts, NormCountsEachElementOnceUnderTpPpWithTiedEmbedding) {
  mt::model::GptConfig shape;
  shape.n_layer = 2, shape.n_head = 2, shape.n_embd = 8, shape.vocab_size = 16, shape.n_positions = 8;
  mt::nn::ParamRegistry whole;
  mt::model::Gpt(shape, whole);
  double want = 0;
  for (const mt::nn::Param& p : whole.params())
    for (size_t i = 0; i < p.numel; i++) want += (double)v(p.name, (int64_t)i) * v(p.name, (int64_t)i);
  want = std::sqrt(want);
  const std::vector<int> first{0, 1, 2};  // one block per stage
  ASSERT_EQ(mt::train::tied_tensors(shape, first).size(), 1u);
  auto res = mt::test::run_shm_ranks(
      4,
      [&](mt::comm::Communicator& world) {
        mt::parallel::Mesh mesh(&world, mt::parallel::MeshGrid(4, 1, 2, 2));
        mt::parallel::CommTensorParallelOps tp(*mesh.tp());
        const int j = mesh.coord().pp;
        mt::nn::ParamRegistry params;
        mt::model::Gpt g(shape, params, &tp, mt::model::StageRange{first[j], first[j + 1], j, 2});
        mt::train::set_replica_facts(params, tp.rank(), tp.size(), mt::train::tied_tensors(shape, first), j == 0);
        mt::trace::ChromeTrace tracer;
        mt::train::SyncOptions o;
        o.overlapped = false;  // a pipeline's executor passes no hooks
        const mt::train::StoreGroups on = mt::train::store_groups(o, mesh);
        mt::parallel::DataParallel store(params, on.group, o.engine, on.experts);
        auto sync = mt::train::make_grad_sync(o, mesh, store, params, &tracer);
        for (mt::nn::Param& p : params.params())
          for (size_t i = 0; i < p.numel; i++) p.grad[i] = v(p.name, p.full_index(i));
        const double got = sync->grad_norm();
        MT_REQUIRE(mt::Error, got == want, "rank ", world.rank(), ": norm ", got, ", the whole model's ", want);
      },
      30);
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

}  // namespace
