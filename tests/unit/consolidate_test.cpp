// State consolidation without processes: whole tensors -> every rank's shards -> whole tensors, for GPT
// layouts over tensor parallelism (1, 2, 4), pipeline stages (1, 2, 4; interleaved 2 x 2 chunks), ZeRO
// shards over 1-4 data-parallel ranks (stages 1-3, small buckets so tensors straddle them) and parameter-server
// slices over 1-3 servers. Each rank's part is computed by the production code (StateConsolidator,
// zero_shards, the engine's buckets); the ranks' contributions are then summed here, as the replica
// all-reduce would. Values are distinct small numbers, so the sum is exact and an element counted twice (or
// never) shows as a mismatch.
#include "train/consolidate.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "comm/types.h"
#include "model/gpt.h"
#include "nn/params.h"
#include "nn/tensor_parallel.h"
#include "parallel/async/param_server.h"
#include "parallel/data/data_parallel.h"
#include "parallel/data/zero_shards.h"
#include "parallel/pipeline/placement.h"
#include "train/replicas.h"
#include "train/task.h"

namespace {

// A tensor-parallel "group" that only answers rank and size: declaring shards needs nothing else.
class FakeTp : public mt::nn::TensorParallelOps {
 public:
  FakeTp(int r, int n) : r_(r), n_(n) {}
  int rank() const override { return r_; }
  int size() const override { return n_; }
  void all_reduce_sum(float*, size_t) override { ADD_FAILURE() << "no collectives here"; }
  void all_reduce_max(float*, size_t) override { ADD_FAILURE() << "no collectives here"; }
  void all_gather(const float*, float*, size_t) override { ADD_FAILURE() << "no collectives here"; }
  void reduce_scatter(const float*, float*, size_t) override { ADD_FAILURE() << "no collectives here"; }

 private:
  int r_, n_;
};

mt::model::GptConfig shape() {
  mt::model::GptConfig c;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 16;
  c.vocab_size = 24;
  c.n_positions = 8;
  return c;
}

// Rank (t, j)'s registry: pipeline rank j of P holds chunks c = 0..V-1, the stages of the looped placement,
// of one block each (4 blocks over P * V stages), with the replica facts a run gives them.
void declare(mt::nn::ParamRegistry& reg, FakeTp* tp, int j, int P, int V) {
  const int S = P * V, per = shape().n_layer / S;
  const mt::pipeline::Placement pl = mt::pipeline::Placement::looped(P, V);
  std::vector<int> first;
  for (int s = 0; s <= S; s++) first.push_back(s * per);
  std::vector<std::unique_ptr<mt::model::Gpt>> chunks;
  for (int c = 0; c < V; c++) {
    const int s = pl.stage_of(j, c);
    if (S == 1)
      chunks.push_back(std::make_unique<mt::model::Gpt>(shape(), reg, tp));
    else
      chunks.push_back(std::make_unique<mt::model::Gpt>(shape(), reg, tp, mt::model::StageRange{s * per, (s + 1) * per, s, S}));
  }
  mt::train::set_replica_facts(reg, tp ? tp->rank() : 0, tp ? tp->size() : 1,
                               S > 1 ? mt::train::tied_tensors(shape(), first) : std::set<std::string>{}, j == 0);
}

struct Layout {
  int tp, P, V;
};

}  // namespace

TEST(Consolidate, WholeToShardsToWholeForEveryLayout) {
  mt::nn::ParamRegistry full;
  mt::model::Gpt whole_model(shape(), full);
  full.finalize();
  std::vector<float> whole(full.size());
  for (size_t i = 0; i < whole.size(); i++) whole[i] = (float)(i % 1000) * 0.25f + 1.0f;  // exact, nonzero

  const std::vector<Layout> layouts = {{1, 1, 1}, {2, 1, 1}, {4, 1, 1}, {1, 2, 1}, {1, 4, 1},
                                       {2, 2, 1}, {4, 2, 1}, {2, 4, 1}, {1, 2, 2}, {2, 2, 2}};
  for (const Layout& L : layouts) {
    for (int zero = 0; zero <= 3; zero++) {
      for (int N = 1; N <= 4; N++) {
        if (zero == 0 && N > 1) continue;  // ZeRO 0 keeps everything on every rank
        std::vector<float> sum(full.size(), 0.0f);
        for (int t = 0; t < L.tp; t++) {
          for (int j = 0; j < L.P; j++) {
            FakeTp tp(t, L.tp);
            mt::nn::ParamRegistry reg;
            declare(reg, L.tp > 1 ? &tp : nullptr, j, L.P, L.V);
            mt::parallel::DataParallelOptions o;
            o.zero = zero;
            o.bucket_mb = 200.0 * 4 / 1048576.0;  // ~200 floats: buckets cut through tensors
            mt::parallel::DataParallel engine(reg, nullptr, o);  // finalizes reg; its buckets are what ZeRO shards
            const mt::train::StateConsolidator sc(reg, full, {}, nullptr);
            // whole -> this rank's flat buffer -> each dp rank's ZeRO shard -> flat buffer -> contribution.
            std::vector<float> local(reg.size(), -1.0f), back(reg.size(), -7.0f);
            sc.extract(whole.data(), local.data());
            const auto buckets = engine.bucket_ranges();
            size_t total = 0;
            for (int r = 0; r < N; r++) {
              std::vector<float> shard(mt::parallel::shard_size(buckets, N, r));
              total += shard.size();
              mt::parallel::take_shard(buckets, N, r, local.data(), shard.data());
              mt::parallel::place_shard(buckets, N, r, shard.data(), back.data());
            }
            ASSERT_EQ(total, reg.size()) << "ZeRO shards must tile the flat buffer";
            ASSERT_EQ(back, local) << "ZeRO " << zero << " over " << N;
            std::vector<float> part(full.size(), 0.0f);
            sc.contribute(back.data(), part.data());
            for (size_t i = 0; i < sum.size(); i++) sum[i] += part[i];
          }
        }
        ASSERT_EQ(sum, whole) << "tp " << L.tp << " pp " << L.P << " x " << L.V << " zero " << zero << " dp " << N;
      }
    }
  }
}

TEST(Consolidate, EngineLoadsAndGathersItsShardOnOneRank) {
  // The engine's own load/gather (no group: one rank holds every shard) round-trips for every stage.
  for (int zero = 0; zero <= 3; zero++) {
    mt::nn::ParamRegistry reg;
    mt::model::Gpt m(shape(), reg);
    mt::parallel::DataParallelOptions o;
    o.zero = zero;
    o.bucket_mb = 300.0 * 4 / 1048576.0;
    mt::parallel::DataParallel engine(reg, nullptr, o);
    std::vector<float> flat(reg.size());
    for (size_t i = 0; i < flat.size(); i++) flat[i] = (float)i + 0.5f;
    engine.load_full_params(flat.data());
    std::vector<float> state(engine.state_size()), back;
    engine.load_full_state(flat.data(), state.data());
    engine.full_params(back);
    EXPECT_EQ(back, flat) << "zero " << zero;
    engine.full_state(state.data(), back);
    EXPECT_EQ(back, flat) << "zero " << zero;
  }
}

TEST(Consolidate, ParameterServerSlicesTileTheBuffer) {
  // Server s holds PsLayout::slice(psi, s) (what PsSource places); placing every slice and summing (the
  // all-reduce over the world) is the buffer.
  for (size_t psi : {1u, 7u, 1000u, 1001u}) {
    for (int S = 1; S <= 3; S++) {
      std::vector<float> flat(psi), sum(psi, 0.0f);
      for (size_t i = 0; i < psi; i++) flat[i] = (float)i + 1;
      for (int s = 0; s < S; s++) {
        const mt::comm::Shard sh = mt::parallel::PsLayout{2, S, 0}.slice(psi, s);
        std::vector<float> placed(psi, 0.0f);
        for (size_t i = 0; i < sh.count; i++) placed[sh.offset + i] = flat[sh.offset + i];
        for (size_t i = 0; i < psi; i++) sum[i] += placed[i];
      }
      EXPECT_EQ(sum, flat) << psi << " over " << S;
    }
  }
}
