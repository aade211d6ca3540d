// The compressed gradient exchange (parallel/compress/exchange.h) over the data-parallel group of each
// tensor-parallel coordinate: 4 forked shm ranks as dp 2 x tp 2 (parallel::Mesh), each holding its tp shard of
// two matrices (one split by columns, one by rows) and a whole copy of a vector (a LayerNorm's: replica facts
// from train/replicas.h). Checks: at the lossless limits (topk:1, PowerSGD at a rank where nothing is
// compressed) the exchanged gradient is the serial sum of the two dp ranks' shards of the same columns / rows,
// bit for bit; for every codec the dp ranks end equal and the tp ranks' copies of the vector end equal (the
// codec's draws and residuals do not depend on the tp rank); under --compress-adaptive the tp ranks decide
// each layer's setting from the layer's whole norm, so the copies stay equal even when only one tp rank's
// shard changes (a rank deciding from its shard alone would pick a different setting). Under dp 2 x pp 2, the
// tied tensor's copies on the first and last stage end equal after the compressed exchange (randk: each
// stage's draws differ, so only summing the exchanged parts gives both the same) and after Local SGD's
// reduce, where each is the sum of the two stages' parts.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "nn/params.h"
#include "parallel/compress/exchange.h"
#include "parallel/data/data_parallel.h"
#include "parallel/mesh/mesh.h"
#include "shm_ranks.h"
#include "train/grad_sync.h"
#include "train/replicas.h"

namespace {

using mt::nn::ParamRegistry;
using mt::parallel::Mesh;
using mt::parallel::MeshGrid;

constexpr int kDp = 2, kTp = 2;
constexpr int64_t kRows = 8, kCols = 12;

// Full shapes: "w" [8, 12] split by columns (tp rank t holds columns [6t, 6t + 6)), "v" [12, 8] split by rows,
// "ln" [12] whole on both tp ranks; "w" and "ln" are layer 0, "v" layer 1.
void build_registry(ParamRegistry& p, int t) {
  const int64_t half = kCols / kTp;
  p.add("w", {kRows, kCols}, {1, t * half, (t + 1) * half, 1}, 0);
  p.add("ln", {kCols}, {}, 0);
  p.add("v", {kCols, kRows}, {0, t * half, (t + 1) * half, 1}, 1);
  p.finalize();
  mt::train::set_replica_facts(p, t, kTp, {}, true);
}

// Data-parallel rank d's gradient of element `full` (row-major index into the full tensor) of tensor `name` at
// `step`: a function of the full tensor's element, so both tp ranks' shards are parts of one gradient and
// both copies of "ln" are equal. scale_w0 multiplies the part of "w" that tp rank 0 holds.
float grad_value(const std::string& name, int d, int64_t step, int64_t full) {
  const mt::CounterRng rng(900 + d, name + "/" + std::to_string(step));
  return (float)rng.normal((uint64_t)full);
}
void fill_grad(ParamRegistry& p, int d, int64_t step, float scale_w0 = 1.0f) {
  for (mt::nn::Param& x : p.params())
    for (size_t i = 0; i < x.numel; i++) {
      const int64_t full = x.full_index(i);
      const bool w0 = x.name == "w" && full % kCols < kCols / kTp;
      x.grad[i] = grad_value(x.name, d, step, full) * (w0 ? scale_w0 : 1.0f);
    }
}

void run_mesh(const std::string& what, const std::function<void(const Mesh&)>& body) {
  auto res = mt::test::run_shm_ranks(kDp * kTp, [&](mt::comm::Communicator& world) {
    const Mesh mesh(&world, MeshGrid(kDp * kTp, kDp, kTp, 1));
    body(mesh);
  });
  EXPECT_EQ(res.exit_code, 0) << what << ": rank " << res.failed_rank << ": " << res.failure;
}

// The `count` floats at `v` are bit-identical on every rank of `group`.
void require_same(mt::comm::Communicator* group, const float* v, size_t count, const std::string& what) {
  const int n = group->size();
  std::vector<float> all(count * n);
  group->all_gather(v, all.data(), all.size(), mt::comm::DType::f32);
  for (int q = 1; q < n; q++)
    MT_REQUIRE(mt::Error, std::memcmp(all.data() + q * count, all.data(), sizeof(float) * count) == 0, what, ": rank ",
               q, " of the group differs from rank 0");
}

class SplitExchange : public ::testing::TestWithParam<std::string> {};

TEST_P(SplitExchange, OverTheDpGroupOfEachTpCoordinate) {
  const std::string spec_text = GetParam();
  const bool lossless = spec_text == "topk:1" || spec_text == "powersgd:64";
  run_mesh(spec_text, [&](const Mesh& mesh) {
    const int d = mesh.coord().dp, t = mesh.coord().tp;
    ParamRegistry params;
    build_registry(params, t);
    mt::compress::GradientExchange ex(params, mesh.dp(), mt::compress::parse_compress_spec(spec_text), {}, 1234,
                                      mesh.tp());
    for (int64_t step = 0; step < 3; step++) {
      fill_grad(params, d, step);
      ex.exchange(step);
      const std::string at =
          spec_text + " step " + std::to_string(step) + " (dp " + std::to_string(d) + ", tp " + std::to_string(t) + ")";
      require_same(mesh.dp(), params.grad(), params.size(), at + ": the dp ranks' exchanged gradients");
      const mt::nn::Param& ln = params.get("ln");
      require_same(mesh.tp(), ln.grad, ln.numel, at + ": the tp ranks' copies of ln");
      if (!lossless) continue;
      for (const mt::nn::Param& x : params.params())
        for (size_t i = 0; i < x.numel; i++) {
          const int64_t full = x.full_index(i);
          const float want = grad_value(x.name, 0, step, full) + grad_value(x.name, 1, step, full);
          MT_REQUIRE(mt::Error, x.grad[i] == want, at, ": ", x.name, "[", full, "] = ", x.grad[i],
                     ", the sum over this coordinate's dp ranks is ", want);
        }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Compress, SplitExchange,
                         ::testing::Values("topk:1", "powersgd:64", "topk:0.2", "randk:0.25", "qsgd:3", "nuqsgd:2",
                                           "sign", "powersgd:2"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == ':' || c == '.') c = '_';
                           return name;
                         });

TEST(SplitExchangeAdaptive, TpRanksDecideFromTheWholeLayer) {
  // qsgd:2 (heavy) / qsgd:6 (light), decisions every K = 2 steps, eta 2. From step 2 on, only tp rank 0's
  // columns of "w" are 10x larger: its shard's norm grows ~10x, tp rank 1's not at all. Deciding from the
  // layer's whole norm (both shards and "ln" once), both tp ranks put layer 0 on the light setting at step 4;
  // from its shard alone tp rank 1 would choose heavy and quantize its copy of "ln" differently.
  const int K = 2;
  run_mesh("adaptive qsgd:2", [&](const Mesh& mesh) {
    const int d = mesh.coord().dp, t = mesh.coord().tp;
    ParamRegistry params;
    build_registry(params, t);
    mt::compress::GradientExchange ex(params, mesh.dp(), mt::compress::parse_compress_spec("qsgd:2"), {true, K, 2.0},
                                      1234, mesh.tp());
    for (int64_t step = 0; step < 3 * K; step++) {
      fill_grad(params, d, 0, step >= K ? 10.0f : 1.0f);
      ex.exchange(step);
      const std::string at =
          "step " + std::to_string(step) + " (dp " + std::to_string(d) + ", tp " + std::to_string(t) + ")";
      std::vector<float> levels(ex.light_layers().begin(), ex.light_layers().end());
      require_same(mesh.tp(), levels.data(), levels.size(), at + ": the tp ranks' light layers");
      if (step == 2 * K)
        MT_REQUIRE(mt::Error, levels[0] == 1, at, ": layer 0's norm grew ~10x: it should be on the light setting");
      const mt::nn::Param& ln = params.get("ln");
      require_same(mesh.tp(), ln.grad, ln.numel, at + ": the tp ranks' copies of ln");
    }
  });
}

// dp 2 x pp 2: stage j holds "s<j>" and the tied "e" (first stage: group 0; last: group 1). Rank (d, j)'s part
// of e's gradient, element i: 1 + i + 10 d + 100 j (small integers: every sum is exact).
void run_tied(mt::train::SyncMethod method, const std::string& spec) {
  auto res = mt::test::run_shm_ranks(4, [&](mt::comm::Communicator& world) {
    const Mesh mesh(&world, MeshGrid(4, 2, 1, 2));
    const int d = mesh.coord().dp, j = mesh.coord().pp;
    ParamRegistry params;
    if (j == 0) params.add("e", {6, 4}, {}, 0);
    params.add("s" + std::to_string(j), {j == 0 ? 10 : 7}, {}, j == 0 ? 0 : 1);
    if (j == 1) params.add("e", {6, 4}, {}, 1);
    mt::train::SyncOptions o;
    o.method = method;
    o.compress = mt::compress::parse_compress_spec(spec);
    o.local_every = 1;
    const mt::train::StoreGroups on = mt::train::store_groups(o, mesh);
    mt::parallel::DataParallel store(params, on.group, o.engine, on.experts);
    mt::train::set_replica_facts(params, 0, 1, {"e"}, j == 0);
    mt::trace::ChromeTrace tracer;
    auto sync = mt::train::make_grad_sync(o, mesh, store, params, &tracer);
    for (int64_t step = 0; step < 3; step++) {
      sync->begin_step(step);
      for (mt::nn::Param& p : params.params())
        for (size_t i = 0; i < p.numel; i++) p.grad_acc()[i] = (float)(1 + i + 10 * d + 100 * j + step);
      sync->reduce(step);
      const mt::nn::Param& e = params.get("e");
      const std::string at =
          spec + " step " + std::to_string(step) + " (dp " + std::to_string(d) + ", stage " + std::to_string(j) + ")";
      require_same(mesh.group(mt::parallel::MeshGroup::tie), e.grad, e.numel, at + ": the tied copies");
      if (method != mt::train::SyncMethod::local_sgd) continue;
      for (size_t i = 0; i < e.numel; i++) {  // each rank steps on 2 x its share: 2 (part(d, 0) + part(d, 1))
        const float want = 2.0f * (float)(2 * (1 + i + 10 * d + step) + 100);
        MT_REQUIRE(mt::Error, e.grad[i] == want, at, ": e[", i, "] = ", e.grad[i], ", want ", want);
      }
    }
  });
  EXPECT_EQ(res.exit_code, 0) << spec << ": rank " << res.failed_rank << ": " << res.failure;
}

TEST(SplitExchangeTied, CopiesOnFirstAndLastStageEndEqual) {
  run_tied(mt::train::SyncMethod::compressed, "randk:0.25");
  run_tied(mt::train::SyncMethod::compressed, "qsgd:2");
  run_tied(mt::train::SyncMethod::local_sgd, "");
}

}  // namespace
