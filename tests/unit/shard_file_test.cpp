// --offload params / grads / activations' file (offload/shard_file.h), the tiled update over a TileSource
// (optim/tiled_optimizer.h: step_from) and the activation store's spill (nn/activation_store.h): ranges come
// back as written, a read queued after a write sees it, the tile source gives the same bits as the update in
// memory, a spilled block comes back unchanged and frees its memory meanwhile, and nothing is left in DIR.
#include "offload/shard_file.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "nn/activation_store.h"
#include "offload/state_swapper.h"
#include "optim/optimizer.h"
#include "optim/tiled_optimizer.h"

namespace {

using mt::offload::ShardFile;

std::string temp_dir() {
  std::string t = (std::filesystem::temp_directory_path() / "mt_shard_XXXXXX").string();
  EXPECT_NE(::mkdtemp(t.data()), nullptr);
  return t;
}

size_t entries(const std::string& dir) {
  size_t n = 0;
  for (auto it = std::filesystem::directory_iterator(dir); it != std::filesystem::directory_iterator(); ++it) n++;
  return n;
}

ShardFile::Options options(const std::string& dir, size_t n) {
  ShardFile::Options o;
  o.dir = dir;
  o.kind = "parameters";
  o.n = n;
  o.timeout_s = 60;
  return o;
}

TEST(ShardFile, RangesComeBackAsWrittenInQueueOrder) {
  const std::string dir = temp_dir();
  {
    const size_t n = 10007;
    ShardFile f(options(dir, n));
    EXPECT_EQ(entries(dir), 0u);  // unnamed
    std::vector<float> a(n);
    for (size_t i = 0; i < n; i++) a[i] = (float)i + 0.5f;
    f.write(0, n, a.data());
    // A write of a middle range, then a read of the whole queued behind it without waiting in between.
    std::vector<float> mid(1000, -3.0f), back(n, 0.0f);
    f.write_copy(123, mid.size(), mid.data());
    mid.assign(1000, 99.0f);  // the copy was taken: this does not reach the file
    f.wait(f.read_async(0, n, back.data()));
    for (size_t i = 0; i < n; i++) ASSERT_EQ(back[i], i >= 123 && i < 1123 ? -3.0f : (float)i + 0.5f) << i;
    f.write_owned(n - 7, std::vector<float>(7, 8.0f));
    std::vector<float> tail(7);
    f.read(n - 7, 7, tail.data());
    for (float v : tail) EXPECT_EQ(v, 8.0f);
    const mt::offload::IoCounters c = f.counters();
    EXPECT_EQ(c.bytes_written, (n + 1000 + 7) * 4);
    EXPECT_EQ(c.bytes_read, (n + 7) * 4);
  }
  EXPECT_EQ(entries(dir), 0u);
  std::filesystem::remove_all(dir);
}

TEST(ShardFile, GrowsByReserveAndRefusesAMissingDirectory) {
  const std::string dir = temp_dir();
  {
    ShardFile::Options o = options(dir, 0);
    o.kind = "activations";
    ShardFile f(o);
    EXPECT_EQ(f.size(), 0u);
    f.reserve(4096);
    EXPECT_EQ(f.size(), 4096u);
    std::vector<float> a(4096, 1.25f), b(4096);
    f.write(0, 4096, a.data());
    f.read(0, 4096, b.data());
    EXPECT_EQ(b[4095], 1.25f);
  }
  EXPECT_THROW(ShardFile(options(dir + "/missing", 16)), mt::InputError);
  std::filesystem::remove_all(dir);
}

// A tile source over vectors laid out as the state: the tiled update through it equals AdamW over the same
// vectors in memory, bit for bit.
class VectorTiles final : public mt::optim::TileSource {
 public:
  VectorTiles(std::vector<float>& p, const std::vector<float>& g) : p_(p), g_(g) {}
  void begin(size_t, size_t n) override { EXPECT_EQ(n, p_.size()); }
  std::pair<float*, const float*> open(size_t t, size_t lo, size_t hi) override {
    EXPECT_EQ(t, next_++);
    tp_.assign(p_.begin() + lo, p_.begin() + hi);  // copies: the update sees only [lo, hi)
    tg_.assign(g_.begin() + lo, g_.begin() + hi);
    return {tp_.data(), tg_.data()};
  }
  void close(size_t, size_t lo, size_t) override { std::copy(tp_.begin(), tp_.end(), p_.begin() + lo); }
  void end() override { ended_ = true; }
  bool ended_ = false;

 private:
  std::vector<float>& p_;
  const std::vector<float>& g_;
  std::vector<float> tp_, tg_;
  size_t next_ = 0;
};

// AdamW (weight decay 0.1) whose state lives in files under dir, tile_bytes at a time through two slots: the
// optimizer a TiledOptimizer wraps in the tests below.
mt::optim::AdamWConfig adamw_config() {
  mt::optim::AdamWConfig c;
  c.weight_decay = 0.1f;
  return c;
}
std::unique_ptr<mt::optim::AdamW> swapped_adamw(const std::string& dir, size_t n, size_t tile_bytes) {
  auto opt = std::make_unique<mt::optim::AdamW>(n, adamw_config());
  mt::offload::StateSwapper::Options o;
  o.dir = dir;
  o.buffers = opt->state().flat().size();
  o.n = n;
  o.tile_bytes = tile_bytes;
  o.slots = 2;
  o.timeout_s = 60;
  opt->state().attach(std::make_unique<mt::offload::StateSwapper>(o));
  return opt;
}

TEST(TiledOptimizer, TileSourceEqualsTheInMemoryUpdate) {
  const std::string dir = temp_dir();
  const size_t n = 5000;  // 5 tiles of 1024, the last partial
  // Segments laid out as the state (stage 3's shard): three tensors' pieces.
  std::vector<mt::optim::Segment> segs = {{0, 0, 0, 2000, true, 0, 0, nullptr},
                                          {2000, 2000, 2000, 1, false, 1, 0, nullptr},
                                          {2001, 2001, 2001, 2999, true, 2, 5, nullptr}};
  auto mem = std::make_unique<mt::optim::AdamW>(n, adamw_config());
  mt::optim::TiledOptimizer tiled(swapped_adamw(dir, n, 4096));
  std::vector<float> p1(n), p2(n), g(n);
  for (size_t i = 0; i < n; i++) p1[i] = p2[i] = std::sin(0.37f * (float)i);
  for (int step = 0; step < 3; step++) {
    for (size_t i = 0; i < n; i++) g[i] = std::cos(0.11f * (float)i + (float)step) * 0.01f;
    mem->scale_next_grads(0.5f);
    tiled.scale_next_grads(0.5f);
    mem->step(p1.data(), g.data(), segs, 1e-2f, step);
    VectorTiles src(p2, g);
    tiled.step_from(src, segs, 1e-2f, step);
    EXPECT_TRUE(src.ended_);
  }
  for (size_t i = 0; i < n; i++) ASSERT_EQ(std::memcmp(&p1[i], &p2[i], 4), 0) << "parameter " << i;
  std::filesystem::remove_all(dir);
}

TEST(ActivationStore, ASpilledBlockComesBackUnchangedAndFreesItsMemory) {
  const std::string dir = temp_dir();
  {
    mt::nn::ActivationStore st;
    ShardFile::Options o = options(dir, 0);
    o.kind = "activations";
    st.set_tier(std::make_unique<ShardFile>(o));
    const size_t n = 3000;
    for (int l = 0; l < 4; l++) {
      float* a = st.get(0, "h" + std::to_string(l) + ".a", n);
      float* b = st.get(0, "h" + std::to_string(l) + ".b", n / 3);
      for (size_t i = 0; i < n; i++) a[i] = (float)(l * 10000 + (int)i);
      for (size_t i = 0; i < n / 3; i++) b[i] = -(float)(l * 10000 + (int)i);
      if (l > 0) st.spill(0, "h" + std::to_string(l - 1) + ".");
    }
    float* other = st.get(0, "h10.a", 16);  // "h1." is not a prefix of "h10.": it stays
    other[0] = 7.0f;
    st.spill(0, "h1.");  // nothing of block 1 is live any more; waits for h2's writes
    const size_t block = mt::AlignedBuffer(n).bytes() + mt::AlignedBuffer(n / 3).bytes();
    // Live: h3 and h10.a; h0's buffers went to h3, h1's and h2's are on the free list once written: 3 blocks
    // in all (4 without the spill).
    EXPECT_EQ(st.live_bytes(), block + mt::AlignedBuffer(16).bytes());
    EXPECT_EQ(st.total_bytes(), 3 * block + mt::AlignedBuffer(16).bytes());
    EXPECT_EQ(st.get(0, "h10.a", 16)[0], 7.0f);
    st.fetch(0, "h1.");
    st.fetch(0, "h0.");
    for (int l : {0, 1, 2}) {
      const float* a = st.get(0, "h" + std::to_string(l) + ".a", n);
      const float* b = st.get(0, "h" + std::to_string(l) + ".b", n / 3);
      for (size_t i = 0; i < n; i++) ASSERT_EQ(a[i], (float)(l * 10000 + (int)i)) << l << " a " << i;
      for (size_t i = 0; i < n / 3; i++) ASSERT_EQ(b[i], -(float)(l * 10000 + (int)i)) << l << " b " << i;
    }
    st.drop(0, "h2.");
    st.release(0);
    EXPECT_EQ(st.live_bytes(), 0u);
  }
  EXPECT_EQ(entries(dir), 0u);
  std::filesystem::remove_all(dir);
}

}  // namespace
