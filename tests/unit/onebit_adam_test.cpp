// 1-bit Adam: the optimizer (optim/onebit_adam.h) equals AdamW bit for bit before the freeze step and applies
// the frozen-variance update after it; the compressed momentum with error feedback on both sides
// (parallel/compress/onebit.h) against values worked out by hand from the rule.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "nn/params.h"
#include "optim/onebit_adam.h"
#include "optim/optimizer.h"
#include "parallel/compress/codec.h"
#include "parallel/compress/onebit.h"

namespace {

using mt::optim::Segment;

std::vector<float> random_vec(size_t n, const std::string& key, double scale = 1.0) {
  const mt::CounterRng rng(9, key);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = (float)(scale * rng.normal(i));
  return v;
}

// Two segments (one decayed), 4 warm-up steps with a clipping factor on one of them: parameters and both
// moments equal AdamW's bit for bit. Then (step 4, 5) m is the exchanged momentum, v is untouched and the update
// uses v's bias correction of step K = 4.
TEST(OnebitAdam, WarmupIsAdamWBitForBitThenVarianceFrozen) {
  const size_t n = 37;
  const std::vector<Segment> segs = {{0, 0, 0, 20, true, 0}, {20, 20, 20, 17, false, 1}};
  mt::optim::AdamWConfig a{0.9f, 0.95f, 1e-8f, 0.1f};
  mt::optim::AdamW adamw(n, a);
  mt::optim::OnebitAdam onebit(n, {a, 4});
  std::vector<float> p1 = random_vec(n, "p"), p2 = p1;
  for (int s = 0; s < 4; s++) {
    const std::vector<float> g = random_vec(n, "g" + std::to_string(s));
    if (s == 2) {
      adamw.scale_next_grads(0.3f);
      onebit.scale_next_grads(0.3f);
    }
    EXPECT_FALSE(onebit.compressing(s));
    adamw.step(p1.data(), g.data(), segs, 1e-2f, s);
    onebit.step(p2.data(), g.data(), segs, 1e-2f, s);
    ASSERT_EQ(0, std::memcmp(p1.data(), p2.data(), 4 * n)) << "step " << s;
    for (size_t k = 0; k < 2; k++)
      ASSERT_EQ(0, std::memcmp(adamw.state().data(k), onebit.state().data(k), 4 * n)) << "state " << k;
  }
  const std::vector<float> v_frozen(onebit.state().data(1), onebit.state().data(1) + n);
  for (int s = 4; s < 6; s++) {
    EXPECT_TRUE(onebit.compressing(s));
    const std::vector<float> M = random_vec(n, "M" + std::to_string(s), 0.1);
    std::vector<float> want = p2;
    const double bc1 = 1 - std::pow(0.9, s + 1), bc2 = 1 - std::pow(0.95, 4);
    for (size_t i = 0; i < n; i++) {
      const double wd = i < 20 ? 0.1 : 0.0;
      want[i] = (float)(p2[i] - 1e-2 * ((double)M[i] / bc1 / (std::sqrt((double)v_frozen[i] / bc2) + 1e-8) +
                                        wd * p2[i]));
    }
    onebit.scale_next_grads(0.5f);  // ignored: the exchange applies clipping before mixing
    onebit.step(p2.data(), M.data(), segs, 1e-2f, s);
    for (size_t i = 0; i < n; i++) EXPECT_NEAR(p2[i], want[i], 1e-6 * (1 + std::fabs(want[i]))) << i;
    EXPECT_EQ(0, std::memcmp(onebit.state().data(0), M.data(), 4 * n));        // m = the exchanged momentum
    EXPECT_EQ(0, std::memcmp(onebit.state().data(1), v_frozen.data(), 4 * n));  // v frozen
  }
}

// Two workers and the server on one tensor of 4 (all values exact in float32):
//   worker 1: y = [1, -2, 3, -4], scale 2.5: c = [2.5, -2.5, 2.5, -2.5], e = [-1.5, .5, .5, -1.5]
//   worker 2: y = [2, 2, -2, 0], scale 1.5 (sign 0 -> +): c = [1.5, 1.5, -1.5, 1.5], e = [.5, .5, -.5, -1.5]
//   server: z = mean = [2, -.5, .5, -.5], scale .875: M' = [.875, -.875, .875, -.875], e_s = [1.125, .375, -.375, .375]
TEST(OnebitMomentum, WorkerAndServerErrorFeedbackByHand) {
  const size_t n = 4, bytes = mt::compress::payload_bytes({mt::compress::Method::sign}, n);
  std::vector<uint8_t> c1(bytes), c2(bytes);
  std::vector<float> e1(n, 0.0f), e2(n, 0.0f), es(n, 0.0f), out(n);
  const std::vector<float> y1 = {1, -2, 3, -4}, y2 = {2, 2, -2, 0};
  mt::compress::sign_compress_with_error(y1.data(), e1.data(), n, c1.data());
  mt::compress::sign_compress_with_error(y2.data(), e2.data(), n, c2.data());
  EXPECT_EQ(e1, (std::vector<float>{-1.5f, 0.5f, 0.5f, -1.5f}));
  EXPECT_EQ(e2, (std::vector<float>{0.5f, 0.5f, -0.5f, -1.5f}));
  const uint8_t* both[] = {c1.data(), c2.data()};
  mt::compress::sign_server_with_error(both, 2, es.data(), n, out.data());
  EXPECT_EQ(out, (std::vector<float>{0.875f, -0.875f, 0.875f, -0.875f}));
  EXPECT_EQ(es, (std::vector<float>{1.125f, 0.375f, -0.375f, 0.375f}));
  // The next round carries both errors: worker 1 sends y1 again: y = [-.5, -1.5, 3.5, -5.5], scale 2.75.
  mt::compress::sign_compress_with_error(y1.data(), e1.data(), n, c1.data());
  EXPECT_EQ(e1, (std::vector<float>{2.25f, 1.25f, 0.75f, -2.75f}));
}

// One rank, b1 = 0.5, through the exchange: the momentum mixes the gradient into the last synchronized M.
//   step 0: M = 0, g = [1, -2, 3, -4]: m = [.5, -1, 1.5, -2], scale 1.25: M' = [1.25, -1.25, 1.25, -1.25],
//           e_w = [-.75, .25, .25, -.75], the server's input is already a scaled sign vector: e_s = 0
//   step 1: M = M', g = 0: m = [.625, -.625, .625, -.625], y = m + e_w = [-.125, -.375, .875, -1.375],
//           scale .6875: M'' = [-.6875, -.6875, .6875, -.6875], e_w = [.5625, .3125, .1875, -.6875]
TEST(OnebitMomentum, ExchangeMixesGradientIntoMomentumByHand) {
  mt::nn::ParamRegistry p;
  p.add("w", {4}, {}, 0);
  p.finalize();
  mt::compress::OnebitMomentumExchange ex(p, nullptr, 0.5f);
  std::vector<float> M(4, 0.0f), g = {0.5f, -1, 1.5f, -2}, out(4);
  ex.exchange(g.data(), 2.0f, M.data(), out.data());  // g_scale 2: the clipping factor applies before mixing
  EXPECT_EQ(out, (std::vector<float>{1.25f, -1.25f, 1.25f, -1.25f}));
  EXPECT_EQ(ex.worker_error(0), (std::vector<float>{-0.75f, 0.25f, 0.25f, -0.75f}));
  EXPECT_EQ(ex.server_error(0), (std::vector<float>(4, 0.0f)));
  M = out;
  g.assign(4, 0.0f);
  ex.exchange(g.data(), 1.0f, M.data(), g.data());  // out may alias g
  EXPECT_EQ(g, (std::vector<float>{-0.6875f, -0.6875f, 0.6875f, -0.6875f}));
  EXPECT_EQ(ex.worker_error(0), (std::vector<float>{0.5625f, 0.3125f, 0.1875f, -0.6875f}));
}

}  // namespace
