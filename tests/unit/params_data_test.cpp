// Counter-based initialization, parameter shards, activation store and the global-batch rule.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/rng.h"
#include "data/batch.h"
#include "data/token_shard.h"
#include "nn/activation_store.h"
#include "nn/params.h"

TEST(CounterRng, DeterministicAndKeyed) {
  mt::CounterRng a(1, "w"), b(1, "w"), c(2, "w"), d(1, "v");
  EXPECT_EQ(a.bits(17), b.bits(17));
  EXPECT_NE(a.bits(17), c.bits(17));
  EXPECT_NE(a.bits(17), d.bits(17));
  EXPECT_NE(a.bits(17), a.bits(18));
  // Moments of 200k normals: mean within 5 sigma of 0, variance near 1.
  double s = 0, s2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; i++) {
    double x = a.normal(i);
    s += x;
    s2 += x * x;
  }
  EXPECT_LT(std::fabs(s / n), 5.0 / std::sqrt((double)n));
  EXPECT_NEAR(s2 / n, 1.0, 0.02);
}

TEST(ParamRegistry, ShardInitializesItsSliceOfTheFullTensor) {
  mt::nn::ParamRegistry full, shard0, shard1;
  full.add("w", {6, 4});
  shard0.add("w", {6, 4}, {1, 0, 2});  // columns [0, 2)
  shard1.add("w", {6, 4}, {0, 3, 6});  // rows [3, 6)
  for (auto* r : {&full, &shard0, &shard1}) {
    r->finalize();
    r->init_normal("w", 42, 1.0f);
  }
  const float* f = full.get("w").data;
  const float* s0 = shard0.get("w").data;
  const float* s1 = shard1.get("w").data;
  for (int i = 0; i < 6; i++)
    for (int j = 0; j < 2; j++) EXPECT_EQ(s0[i * 2 + j], f[i * 4 + j]);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4; j++) EXPECT_EQ(s1[i * 4 + j], f[(i + 3) * 4 + j]);
  EXPECT_EQ(shard0.size(), 12u);
  EXPECT_TRUE(full.get("w").decay);
}

TEST(ParamRegistry, FlatLayoutAndDecayFlags) {
  mt::nn::ParamRegistry r;
  r.add("a", {3});
  r.add("b", {2, 2});
  r.finalize();
  EXPECT_EQ(r.size(), 7u);
  EXPECT_EQ(r.get("b").offset, 3u);
  EXPECT_EQ(r.get("b").data, r.data() + 3);
  EXPECT_EQ(r.get("b").grad, r.grad() + 3);
  EXPECT_FALSE(r.get("a").decay);
  EXPECT_TRUE(r.get("b").decay);
}

TEST(ActivationStore, ReusesReleasedBuffers) {
  mt::nn::ActivationStore s;
  float* a = s.get(0, "x", 100);
  a[5] = 3.0f;
  EXPECT_EQ(s.get(0, "x", 100), a);  // same buffer, contents kept
  EXPECT_EQ(s.get(0, "x", 100)[5], 3.0f);
  s.get(1, "x", 100);
  EXPECT_EQ(s.live_bytes(), 800u);
  s.release(0);
  EXPECT_EQ(s.live_bytes(), 400u);
  EXPECT_EQ(s.get(2, "y", 100), a);  // from the free list
  EXPECT_EQ(s.total_bytes(), 800u);
}

// Token value = its position, so each window shows where it came from.
TEST(GptBatch, WindowsFollowTheGlobalRuleAndWrap) {
  std::string path = ::testing::TempDir() + "/batch_test.bin";
  std::vector<uint16_t> tok(100);
  for (int i = 0; i < 100; i++) tok[i] = (uint16_t)i;
  mt::write_token_shard(path, tok);
  mt::TokenShard shard(path);
  const int B = 3, T = 8;
  std::vector<int32_t> in(B * T), tg(B * T);
  mt::data::gpt_batch(shard, 2, B, T, 0, B, in.data(), tg.data());
  for (int j = 0; j < B; j++)
    for (int t = 0; t < T; t++) {
      int o = (2 * B + j) * T;  // 48, 56, 64
      EXPECT_EQ(in[j * T + t], (o + t) % 100);
      EXPECT_EQ(tg[j * T + t], (o + t + 1) % 100);
    }
  // Step 4 starts at 96: wraps inside the first window.
  mt::data::gpt_batch(shard, 4, B, T, 0, 1, in.data(), tg.data());
  EXPECT_EQ(in[3], 99);
  EXPECT_EQ(in[4], 0);
  EXPECT_EQ(tg[3], 0);
  // A slice of windows equals the same rows of the whole batch.
  std::vector<int32_t> in2(T), tg2(T);
  mt::data::gpt_batch(shard, 2, B, T, 2, 1, in2.data(), tg2.data());
  mt::data::gpt_batch(shard, 2, B, T, 0, B, in.data(), tg.data());
  for (int t = 0; t < T; t++) EXPECT_EQ(in2[t], in[2 * T + t]);
  std::filesystem::remove(path);
}

// A fused q|k|v weight [2, 3*4] split by heads across 2 ranks: rank 1 owns columns 2-3 of each block.
TEST(ParamRegistry, BlockedShardTakesTheSameSliceOfEachBlock) {
  mt::nn::ParamRegistry full, shard;
  full.add("w", {2, 12});
  shard.add("w", {2, 12}, {1, 2, 4, 3});
  full.finalize();
  shard.finalize();
  full.init_normal("w", 7, 1.0f);
  shard.init_normal("w", 7, 1.0f);
  const mt::nn::Param& p = shard.get("w");
  ASSERT_EQ(p.local_shape, (std::vector<int64_t>{2, 6}));
  const int cols[6] = {2, 3, 6, 7, 10, 11};
  for (int r = 0; r < 2; r++)
    for (int j = 0; j < 6; j++) {
      EXPECT_EQ(p.full_index(r * 6 + j), r * 12 + cols[j]);
      EXPECT_EQ(p.data[r * 6 + j], full.get("w").data[r * 12 + cols[j]]);
    }
}

// A buffer that cannot be allocated says how many bytes it wanted (issue 13, point 7) and stays empty.
TEST(AlignedBuffer, FailedAllocationNamesItsSize) {
  mt::AlignedBuffer b(16);
  const size_t count = size_t{1} << 60;  // 4 EiB (below the largest object size, 2^63 - 1 bytes): no host has it
  try {
    b.resize(count);
    FAIL() << "allocated 4 EiB";
  } catch (const mt::OutOfMemory& e) {
    EXPECT_EQ(e.bytes(), count * sizeof(float));
    EXPECT_NE(std::string(e.what()).find("cannot allocate " + std::to_string(count * sizeof(float)) + " bytes"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(b.data(), nullptr);
}
