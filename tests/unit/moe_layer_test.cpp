// The MoE MLP layer (nn/moe.h): finite-difference gradients of every input and parameter, and expert
// parallelism over ranks-as-threads against the one-rank layer: same outputs, same input gradients, the
// same expert gradients (not twice them: the bug DeepSpeed and PyTorch both shipped), the router's
// gradient summing to the one-rank one, exactly the admitted rows moved, and uneven routing (every token
// to one expert, a rank receiving nothing) neither hanging nor erring.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "gradcheck.h"
#include "nn/activation_store.h"
#include "nn/moe.h"

namespace mt::nn {
namespace {

// P ranks as threads of this process; each call is collective (every rank calls it, in the same order).
class ThreadGroup {
 public:
  explicit ThreadGroup(int P) : P_(P), bar_(P), ptr_(P), counts_(P) {}
  int size() const { return P_; }
  void counts(int me, const int64_t* send, int64_t* recv, size_t per) {
    ptr_[me] = send;
    bar_.arrive_and_wait();
    for (int r = 0; r < P_; r++)
      std::memcpy(recv + r * per, static_cast<const int64_t*>(ptr_[r]) + me * per, per * sizeof(int64_t));
    bar_.arrive_and_wait();
  }
  void rows(int me, const float* send, const size_t* send_floats, float* recv, const size_t* recv_floats) {
    ptr_[me] = send;
    counts_[me] = send_floats;
    bar_.arrive_and_wait();
    size_t at = 0;
    for (int r = 0; r < P_; r++) {
      size_t off = 0;
      for (int q = 0; q < me; q++) off += counts_[r][q];
      EXPECT_EQ(counts_[r][me], recv_floats[r]) << "rank " << me << " expects another count from rank " << r;
      if (recv_floats[r] > 0)  // a rank that sends nothing may pass null (memcpy from null is undefined)
        std::memcpy(recv + at, static_cast<const float*>(ptr_[r]) + off, recv_floats[r] * sizeof(float));
      at += recv_floats[r];
    }
    bar_.arrive_and_wait();
  }

 private:
  int P_;
  std::barrier<> bar_;
  std::vector<const void*> ptr_;
  std::vector<const size_t*> counts_;
};

class ThreadEp : public ExpertParallelOps {
 public:
  ThreadEp(ThreadGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_.size(); }
  void exchange_counts(const int64_t* send, int64_t* recv, size_t per_rank) override {
    g_.counts(rank_, send, recv, per_rank);
  }
  void exchange_rows(const float* send, const size_t* sf, float* recv, const size_t* rf) override {
    g_.rows(rank_, send, sf, recv, rf);
  }

 private:
  ThreadGroup& g_;
  int rank_;
};

constexpr int kC = 6, kH = 8, kLayers = 2;

// A layer with its registry, parameters drawn from the counter-based generator (the same values on any rank).
struct Layer {
  ParamRegistry params;
  std::unique_ptr<MoeMlp> moe;
  Layer(const RouterConfig& rc, ExpertParallelOps* ep = nullptr) {
    moe = std::make_unique<MoeMlp>(rc, 1, kC, kH, "h.1.mlp.", params, 0, ep);
    params.finalize();
    for (Param& p : params.params()) {
      CounterRng rng(17, p.name);
      const float s = p.name.find("router") != std::string::npos ? 0.8f : 0.4f;
      for (size_t i = 0; i < p.numel; i++) p.data[i] = (float)rng.normal((uint64_t)p.full_index(i)) * s;
    }
  }
};

TEST(MoeLayer, GradientsMatchFiniteDifferences) {
  const int N = 8;
  for (int K : {1, 2}) {
    SCOPED_TRACE("top-" + std::to_string(K));
    const RouterConfig rc{4, K, 1.0, 4, SecondPolicy::all};  // cap = ceil(K * 4 / 4) = K: some drops
    Layer L(rc);
    auto x = testing::randn((size_t)N * kC, 1, "x", 1.0f);
    auto res = testing::randn((size_t)N * kC, 2, "res", 1.0f);
    auto R = testing::randn((size_t)N * kC, 3, "R", 1.0f);
    const float aux_scale = 0.1f, z_scale = 0.01f;
    ActivationStore store;
    std::vector<float> out((size_t)N * kC), dx((size_t)N * kC);
    L.moe->forward(store, 0, x.data(), res.data(), out.data(), N, {});
    const Routing routing = L.moe->routing(store, 0);
    EXPECT_GT(routing.dropped, 0) << "the case should drop something";
    L.params.zero_grad();
    L.moe->backward(store, 0, x.data(), R.data(), dx.data(), N, aux_scale, z_scale);
    // The load-balancing term's f is a constant; finite differences must not flip a choice either.
    auto fixed_loss = [&]() {
      ActivationStore s;
      L.moe->forward(s, 0, x.data(), res.data(), out.data(), N, {});
      const Routing& r = L.moe->routing(s, 0);
      EXPECT_EQ(r.expert, routing.expert) << "a choice flipped under the finite difference";
      EXPECT_EQ(r.slot, routing.slot);
      double aux = 0;
      for (int g = 0; g < N / 4; g++)
        for (int e = 0; e < 4; e++) {
          double P = 0;
          for (int t = g * 4; t < g * 4 + 4; t++) P += r.probs[t * 4 + e];
          aux += 4.0 * routing.first_share[g * 4 + e] * P / 4;
        }
      return testing::dot(out.data(), R) + aux_scale * aux + z_scale * r.z_sum;
    };
    testing::expect_grad("dx", x, dx, fixed_loss);
    for (Param& p : L.params.params()) {
      std::vector<float> w(p.data, p.data + p.numel), g(p.grad, p.grad + p.numel);
      auto f = [&]() {
        std::memcpy(p.data, w.data(), w.size() * sizeof(float));
        return fixed_loss();
      };
      testing::expect_grad(p.name, w, g, f);
      std::memcpy(p.data, w.data(), w.size() * sizeof(float));
    }
  }
}

// Runs the layer over N tokens at ep = 1 and over P ranks (rank r: tokens [r N/P, (r+1) N/P)) and compares.
void compare_ep(int P, const RouterConfig& rc, const std::vector<float>& x, int N,
                const std::function<void(Layer&)>& tweak = nullptr) {
  const float aux_scale = 0.2f, z_scale = 0.02f;
  auto dy = testing::randn((size_t)N * kC, 5, "dy", 1.0f);
  std::vector<float> zero((size_t)N * kC, 0.0f);
  Layer one(rc);
  if (tweak) tweak(one);
  std::vector<float> out1((size_t)N * kC), dx1((size_t)N * kC);
  ActivationStore s1;
  one.moe->forward(s1, 0, x.data(), zero.data(), out1.data(), N, {});
  one.moe->backward(s1, 0, x.data(), dy.data(), dx1.data(), N, aux_scale, z_scale);

  ThreadGroup group(P);
  std::vector<std::unique_ptr<ThreadEp>> eps;
  std::vector<std::unique_ptr<Layer>> layers;
  for (int r = 0; r < P; r++) {
    eps.push_back(std::make_unique<ThreadEp>(group, r));
    layers.push_back(std::make_unique<Layer>(rc, eps.back().get()));
    if (tweak) tweak(*layers.back());
  }
  const int n = N / P;
  std::vector<float> outP((size_t)N * kC), dxP((size_t)N * kC);
  std::vector<std::thread> threads;
  for (int r = 0; r < P; r++)
    threads.emplace_back([&, r]() {
      ActivationStore s;
      const size_t o = (size_t)r * n * kC;
      layers[r]->moe->forward(s, 0, x.data() + o, zero.data() + o, outP.data() + o, n, {});
      layers[r]->moe->backward(s, 0, x.data() + o, dy.data() + o, dxP.data() + o, n, aux_scale, z_scale);
    });
  for (auto& t : threads) t.join();

  for (size_t i = 0; i < out1.size(); i++) {
    ASSERT_NEAR(outP[i], out1[i], 1e-5f * (1 + std::fabs(out1[i]))) << "output " << i;
    ASSERT_NEAR(dxP[i], dx1[i], 1e-5f * (1 + std::fabs(dx1[i]))) << "input gradient " << i;
  }
  // Every expert's gradient on its owner equals the one-rank gradient (the same rows, in the same order).
  int64_t moved_rows = 0;
  for (int r = 0; r < P; r++) {
    for (Param& p : layers[r]->params.params()) {
      const Param& q = one.params.get(p.name);
      if (p.name.find("router") != std::string::npos) continue;
      for (size_t i = 0; i < p.numel; i++)
        ASSERT_NEAR(p.grad[i], q.grad[i], 1e-5f * (1 + std::fabs(q.grad[i]))) << p.name << "[" << i << "]";
    }
    // The router is replicated: its gradients over the ranks add up to the one-rank gradient.
    const MoeStats& st = layers[r]->moe->stats();
    moved_rows += (int64_t)(st.exchange_bytes / (sizeof(float) * kC));
  }
  const Param& r1 = one.params.get("h.1.mlp.router.weight");
  for (size_t i = 0; i < r1.numel; i++) {
    double sum = 0;
    for (int r = 0; r < P; r++) sum += layers[r]->params.get("h.1.mlp.router.weight").grad[i];
    ASSERT_NEAR(sum, r1.grad[i], 1e-5 * (1 + std::fabs(r1.grad[i]))) << "router grad " << i;
  }
  // Bytes: each admitted pair whose expert is on another rank crosses 4 times (dispatch and combine, forward
  // and backward); nothing else moves.
  const Routing& R = one.moe->routing(s1, 0);
  const int Le = rc.experts / P;
  int64_t remote = 0;
  for (int t = 0; t < N; t++)
    for (int k = 0; k < rc.top_k; k++)
      if (R.admitted(t, k) && R.expert[(size_t)t * rc.top_k + k] / Le != t / n) remote++;
  EXPECT_EQ(moved_rows, 4 * remote);
}

TEST(MoeLayer, ExpertParallelEqualsOneRank) {
  const int N = 16;
  auto x = testing::randn((size_t)N * kC, 9, "x", 1.0f);
  for (int P : {2, 4})
    for (int K : {1, 2}) {
      SCOPED_TRACE("ep " + std::to_string(P) + " top-" + std::to_string(K));
      compare_ep(P, {4, K, 1.25, 4, SecondPolicy::all}, x, N);
    }
}

TEST(MoeLayer, UnevenRoutingNeitherHangsNorErrs) {
  // A router that sends every token to expert 0 first and expert 1 second (input channel 0 is positive and
  // dominates): with 4 experts over P ranks, the ranks holding experts 2 and 3 receive nothing, and with
  // capacity 3 most choices are dropped. Dropless too: one rank then computes every token.
  const int N = 16;
  std::vector<float> x((size_t)N * kC, 0.0f);
  for (int t = 0; t < N; t++) x[(size_t)t * kC] = 1.0f + 0.01f * t;
  auto force = [](Layer& L) {
    Param& w = L.params.get("h.1.mlp.router.weight");  // [C, E]
    std::fill(w.data, w.data + w.numel, 0.0f);
    w.data[0] = 5.0f;
    w.data[1] = 3.0f;
  };
  for (double F : {0.0, 0.75})
    for (int P : {2, 4}) {
      SCOPED_TRACE("ep " + std::to_string(P) + " F " + std::to_string(F));
      compare_ep(P, {4, 2, F, 4, SecondPolicy::all}, x, N, force);
    }
}

}  // namespace
}  // namespace mt::nn
