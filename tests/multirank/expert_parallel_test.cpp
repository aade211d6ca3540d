// Expert parallelism on real ranks (forked processes over the shm backend): the MoE layer with its experts
// split over P ranks, each rank routing its own tokens, against the one-process layer over all tokens:
// outputs, input gradients and expert gradients equal (a rank's experts see the same rows in the same
// order), router gradients summed over ranks equal the one-process ones, and the all-to-all(v) carries
// exactly the admitted rows bound for other ranks (the communicator's byte counters). Uneven routing (every
// token to experts 0 and 1, so some ranks receive nothing) must neither hang nor fail.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "nn/activation_store.h"
#include "nn/moe.h"
#include "parallel/expert/ep_ops.h"
#include "tensor/blas.h"
#include "shm_ranks.h"

namespace {

using mt::nn::Param;
constexpr int kN = 32, kC = 8, kH = 12, kE = 4;

std::vector<float> draw(size_t n, const std::string& stream, float scale) {
  mt::CounterRng rng(5, stream);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = (float)rng.normal(i) * scale;
  return v;
}

void fill(mt::nn::ParamRegistry& params, bool forced) {
  for (Param& p : params.params()) {
    auto v = draw(p.numel, p.name, p.name.find("router") != std::string::npos ? 1.0f : 0.3f);
    std::copy(v.begin(), v.end(), p.data);
    if (forced && p.name.find("router") != std::string::npos) {
      std::fill(p.data, p.data + p.numel, 0.0f);
      p.data[0] = 5.0f;  // input channel 0 -> expert 0 first, expert 1 second
      p.data[1] = 3.0f;
    }
  }
}

struct Result {
  std::vector<float> out, dx;
  std::vector<std::vector<float>> grads;  // per parameter, registry order
  mt::nn::Routing routing;
};

std::vector<float> inputs(bool forced) {
  auto x = draw((size_t)kN * kC, "x", 1.0f);
  if (forced)
    for (int t = 0; t < kN; t++) x[(size_t)t * kC] = 2.0f + 0.01f * t;
  return x;
}

Result one_process(const mt::nn::RouterConfig& rc, bool forced) {
  mt::nn::ParamRegistry params;
  mt::nn::MoeMlp moe(rc, 0, kC, kH, "h.0.mlp.", params, 0);
  params.finalize();
  fill(params, forced);
  auto x = inputs(forced), dy = draw((size_t)kN * kC, "dy", 1.0f);
  std::vector<float> zero((size_t)kN * kC, 0.0f);
  Result r{std::vector<float>((size_t)kN * kC), std::vector<float>((size_t)kN * kC), {}, {}};
  mt::nn::ActivationStore store;
  moe.forward(store, 0, x.data(), zero.data(), r.out.data(), kN, {});
  moe.backward(store, 0, x.data(), dy.data(), r.dx.data(), kN, 0.1f, 0.01f);
  for (Param& p : params.params()) r.grads.emplace_back(p.grad, p.grad + p.numel);
  r.routing = moe.routing(store, 0);
  return r;
}

void run(int P, const mt::nn::RouterConfig& rc, bool forced) {
  const Result ref = one_process(rc, forced);
  mt::nn::ParamRegistry names;  // the one-process layer's parameter names, to find a rank's in it
  mt::nn::MoeMlp all(rc, 0, kC, kH, "h.0.mlp.", names, 0);
  auto res = mt::test::run_shm_ranks(P, [&](mt::comm::Communicator& world) {
    mt::parallel::CommExpertParallelOps ep(world);
    mt::nn::ParamRegistry params;
    mt::nn::MoeMlp moe(rc, 0, kC, kH, "h.0.mlp.", params, 0, &ep);
    params.finalize();
    fill(params, forced);
    const int n = kN / P, r = world.rank();
    const size_t o = (size_t)r * n * kC;
    auto x = inputs(forced), dy = draw((size_t)kN * kC, "dy", 1.0f);
    std::vector<float> zero((size_t)n * kC, 0.0f), out((size_t)n * kC), dx((size_t)n * kC);
    mt::nn::ActivationStore store;
    world.reset_counters();
    moe.forward(store, 0, x.data() + o, zero.data(), out.data(), n, {});
    moe.backward(store, 0, x.data() + o, dy.data() + o, dx.data(), n, 0.1f, 0.01f);
    const uint64_t rows_bytes = world.counters().bytes_sent[(int)mt::comm::OpKind::all_to_all_v];
    auto close = [](float a, float b) { return std::fabs(a - b) <= 1e-5f * (1 + std::fabs(b)); };
    for (size_t i = 0; i < out.size(); i++) {
      MT_REQUIRE(mt::Error, close(out[i], ref.out[o + i]), "output ", o + i, ": ", out[i], " vs ", ref.out[o + i]);
      MT_REQUIRE(mt::Error, close(dx[i], ref.dx[o + i]), "dx ", o + i, ": ", dx[i], " vs ", ref.dx[o + i]);
    }
    size_t k = 0;
    for (const Param& q : names.params()) {
      const std::vector<float>& g = ref.grads[k++];
      Param* p = params.find(q.name);
      if (q.name.find("router") != std::string::npos) {
        std::vector<float> sum(p->grad, p->grad + p->numel);
        world.all_reduce(sum.data(), sum.data(), sum.size(), mt::comm::DType::f32, mt::comm::ReduceOp::sum);
        for (size_t i = 0; i < sum.size(); i++)
          MT_REQUIRE(mt::Error, std::fabs(sum[i] - g[i]) <= 1e-5f * (1 + std::fabs(g[i])), "router grad ", i, ": ",
                     sum[i], " vs ", g[i]);
      } else if (p) {
        for (size_t i = 0; i < p->numel; i++)
          MT_REQUIRE(mt::Error, close(p->grad[i], g[i]), q.name, "[", i, "] on rank ", r, ": ", p->grad[i],
                     " vs one process ", g[i], " (ratio ", p->grad[i] / g[i], ")");
      }
    }
    // Admitted choices of my tokens whose expert lives elsewhere: each row goes out twice (dispatch in
    // forward and backward) and the rows other ranks' tokens sent me come back twice (combine).
    const int Le = kE / P;
    uint64_t mine_out = 0;
    std::vector<float> to(P, 0.0f);
    for (int t = r * n; t < (r + 1) * n; t++)
      for (int c = 0; c < rc.top_k; c++)
        if (ref.routing.admitted(t, c)) {
          const int owner = ref.routing.expert[(size_t)t * rc.top_k + c] / Le;
          if (owner != r) mine_out++;
        }
    uint64_t theirs_in = 0;
    for (int t = 0; t < kN; t++)
      for (int c = 0; c < rc.top_k; c++)
        if (t / n != r && ref.routing.admitted(t, c) && ref.routing.expert[(size_t)t * rc.top_k + c] / Le == r)
          theirs_in++;
    const uint64_t want = 2 * (mine_out + theirs_in) * kC * sizeof(float);
    MT_REQUIRE(mt::Error, rows_bytes == want, "rank ", r, " sent ", rows_bytes, " bytes of rows, want ", want);
  });
  EXPECT_EQ(res.exit_code, 0) << "ep " << P << ": rank " << res.failed_rank << ": " << res.failure;
}

}  // namespace

TEST(ExpertParallel, EqualsOneProcess) {
  for (int P : {2, 4})
    for (int K : {1, 2}) {
      SCOPED_TRACE("ep " + std::to_string(P) + " top-" + std::to_string(K));
      run(P, {kE, K, 1.25, 8, mt::nn::SecondPolicy::all}, false);
    }
}

TEST(ExpertParallel, UnevenRoutingNeitherHangsNorFails) {
  for (double F : {0.0, 1.0})
    for (int P : {2, 4}) {
      SCOPED_TRACE("ep " + std::to_string(P) + " F " + std::to_string(F));
      run(P, {kE, 2, F, 8, mt::nn::SecondPolicy::all}, true);
    }
}
