// The resident state tier (optim/resident_tier.h) under the tiled update (optim/tiled_optimizer.h): the update
// tile by tile over resident state gives the same bits as the optimizer on the whole buffers, from step() and
// from a tile source that brings only the gradients (params_as_state false: ZeRO 2's --offload grads), and the
// store counts the state as resident, not offloaded.
#include "optim/resident_tier.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "optim/optimizer.h"
#include "optim/tiled_optimizer.h"

namespace {

// Segments as ZeRO 2 cuts them: state and grads packed (equal offsets), params at their flat offsets.
std::vector<mt::optim::Segment> pieces() {
  return {{100, 0, 0, 3000, true, 0, 7, nullptr},
          {5000, 3000, 3000, 1, false, 1, 0, nullptr},
          {6000, 3001, 3001, 2900, true, 2, 100, nullptr}};
}
constexpr size_t kN = 5901, kP = 9000, kTile = 1024;

// The gradients from a vector, tile by tile into a buffer of the tile's size; the parameters the caller's.
class GradOnlyTiles final : public mt::optim::TileSource {
 public:
  GradOnlyTiles(std::vector<float>& p, const std::vector<float>& g) : p_(p), g_(g) {}
  bool params_as_state() const override { return false; }
  void begin(size_t, size_t) override {}
  std::pair<float*, const float*> open(size_t, size_t lo, size_t hi) override {
    tg_.assign(g_.begin() + lo, g_.begin() + hi);
    return {p_.data(), tg_.data()};
  }
  void close(size_t, size_t, size_t) override {}
  void end() override { ended_ = true; }
  bool ended_ = false;

 private:
  std::vector<float>& p_;
  const std::vector<float>& g_;
  std::vector<float> tg_;
};

std::unique_ptr<mt::optim::AdamW> adamw() {
  mt::optim::AdamWConfig c;
  c.weight_decay = 0.1f;
  return std::make_unique<mt::optim::AdamW>(kN, c);
}

void expect_state_equal(mt::optim::Optimizer& a, mt::optim::Optimizer& b) {
  for (size_t k : a.state().flat()) {
    std::vector<float> x(kN), y(kN);
    a.state().visit(k, false, [&](float* v, size_t m) { std::memcpy(x.data(), v, m * 4); });
    b.state().visit(k, false, [&](float* v, size_t m) { std::memcpy(y.data(), v, m * 4); });
    for (size_t i = 0; i < kN; i++) ASSERT_EQ(std::memcmp(&x[i], &y[i], 4), 0) << a.state().at(k).name << "[" << i << "]";
  }
}

TEST(ResidentTier, TiledUpdateEqualsTheWholeBufferUpdate) {
  auto mem = adamw();
  auto inner = adamw();
  inner->state().attach(std::make_unique<mt::optim::ResidentTier>(inner->state().flat().size(), kN, kTile));
  mt::optim::TiledOptimizer tiled(std::move(inner));
  std::vector<float> p1(kP), p2(kP), p3(kP), g(kP);
  for (size_t i = 0; i < kP; i++) p1[i] = p2[i] = p3[i] = std::sin(0.37f * (float)i);
  auto mem2 = adamw();
  auto inner2 = adamw();
  inner2->state().attach(std::make_unique<mt::optim::ResidentTier>(inner2->state().flat().size(), kN, kTile));
  mt::optim::TiledOptimizer from_source(std::move(inner2));
  for (int step = 0; step < 3; step++) {
    for (size_t i = 0; i < kP; i++) g[i] = std::cos(0.11f * (float)i + (float)step) * 0.01f;
    mem->scale_next_grads(0.5f);
    tiled.scale_next_grads(0.5f);
    from_source.scale_next_grads(0.5f);
    mem->step(p1.data(), g.data(), pieces(), 1e-2f, step);
    tiled.step(p2.data(), g.data(), pieces(), 1e-2f, step);
    GradOnlyTiles src(p3, g);
    from_source.step_from(src, pieces(), 1e-2f, step);
    EXPECT_TRUE(src.ended_);
  }
  for (size_t i = 0; i < kP; i++) {
    ASSERT_EQ(std::memcmp(&p1[i], &p2[i], 4), 0) << "parameter " << i << " (step)";
    ASSERT_EQ(std::memcmp(&p1[i], &p3[i], 4), 0) << "parameter " << i << " (step_from, grads alone)";
  }
  expect_state_equal(*mem, tiled);
  expect_state_equal(*mem, from_source);
  // Resident: every byte of the state counted in memory, none offloaded.
  EXPECT_EQ(tiled.state().bytes(), tiled.state().flat().size() * kN * 4);
  EXPECT_EQ(tiled.state().offloaded_bytes(), 0u);
}

TEST(ResidentTier, ReadAndWriteReachTheTilesBuffers) {
  mt::optim::ResidentTier t(2, 3000, kTile);
  EXPECT_EQ(t.tiles(), 3u);
  std::vector<float> in(500, 3.5f), out(500);
  t.write(1, 2000, 500, in.data());
  t.begin_update();
  EXPECT_EQ(t.acquire(1)[1][2000 - kTile], 3.5f);
  EXPECT_EQ(t.acquire(1)[0][2000 - kTile], 0.0f);  // zeros until written, as a fresh buffer
  t.acquire(1)[1][2001 - kTile] = -1.0f;
  t.release(1);
  t.end_update();
  t.read(1, 2000, 500, out.data());
  EXPECT_EQ(out[0], 3.5f);
  EXPECT_EQ(out[1], -1.0f);
}

}  // namespace
