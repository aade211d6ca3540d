// The optimizer state's disk tier (offload/state_swapper.h) and the tiled update over it
// (optim/tiled_optimizer.h): tiles come back as they were written, every tile is read before it is written and
// read ahead of its use within the bounded slots, the tiled update gives the same bits as the in-memory one,
// and bad directories or a full disk are clear errors at start that leave nothing behind.
#include "offload/state_swapper.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "optim/optimizer.h"
#include "optim/tiled_optimizer.h"

namespace {

using mt::offload::StateSwapper;

std::string temp_dir() {
  std::string t = (std::filesystem::temp_directory_path() / "mt_swapper_XXXXXX").string();
  EXPECT_NE(::mkdtemp(t.data()), nullptr);
  return t;
}

size_t entries(const std::string& dir) {
  size_t n = 0;
  for (auto it = std::filesystem::directory_iterator(dir); it != std::filesystem::directory_iterator(); ++it) n++;
  return n;
}

StateSwapper::Options options(const std::string& dir, size_t buffers, size_t n, int slots = 4) {
  StateSwapper::Options o;
  o.dir = dir;
  o.buffers = buffers;
  o.n = n;
  o.tile_bytes = 4096;  // 1024 floats per buffer per tile
  o.slots = slots;
  o.timeout_s = 60;
  o.record_events = true;
  return o;
}

// Element i of buffer j, distinct everywhere: exact in float32.
float value(size_t j, size_t i, int round) { return (float)(j * 1000000 + i) + 0.25f * (float)round; }

TEST(StateSwapper, TilesComeBackAsWrittenAndUpdatesPersist) {
  const std::string dir = temp_dir();
  const size_t B = 2, n = 10 * 1024 + 17;  // 11 tiles, the last one partial
  {
    StateSwapper s(options(dir, B, n));
    ASSERT_EQ(s.tiles(), 11u);
    std::vector<float> buf(n);
    for (size_t j = 0; j < B; j++) {
      for (size_t i = 0; i < n; i++) buf[i] = value(j, i, 0);
      s.write(j, 0, n, buf.data());
    }
    for (int round = 1; round <= 2; round++) {  // the second round starts from the tiles read ahead at the end
      s.begin_update();
      for (size_t t = 0; t < s.tiles(); t++) {
        std::vector<float*> w = s.acquire(t);
        for (size_t j = 0; j < B; j++)
          for (size_t i = t * 1024; i < std::min(n, (t + 1) * 1024); i++) {
            ASSERT_EQ(w[j][i - t * 1024], value(j, i, round - 1)) << "buffer " << j << " element " << i;
            w[j][i - t * 1024] = value(j, i, round);
          }
        s.release(t);
      }
      s.end_update();
    }
    for (size_t j = 0; j < B; j++) {
      s.read(j, 0, n, buf.data());
      for (size_t i = 0; i < n; i++) ASSERT_EQ(buf[i], value(j, i, 2)) << "buffer " << j << " element " << i;
    }
    // A partial range, across a tile boundary.
    std::vector<float> part(50);
    s.read(1, 1000, 50, part.data());
    for (size_t i = 0; i < 50; i++) ASSERT_EQ(part[i], value(1, 1000 + i, 2));
    EXPECT_EQ(entries(dir), 0u);  // the file has no name in the directory
  }
  EXPECT_EQ(entries(dir), 0u);
  std::filesystem::remove_all(dir);
}

// The order the I/O thread was given (what depends on the disk's speed against the caller's is left out): the
// first S tiles read ahead before any update, every tile read once and written once per update, read before
// its write, and tile t + S read only after tile t was written back (S slots bound the memory).
TEST(StateSwapper, ReadsAheadWithinItsSlotsAndWritesBehind) {
  const std::string dir = temp_dir();
  const int S = 3;
  StateSwapper s(options(dir, 1, 9 * 1024, S));
  s.begin_update();
  for (size_t t = 0; t < s.tiles(); t++) {
    s.acquire(t);
    s.release(t);
  }
  s.end_update();
  const std::vector<std::pair<bool, size_t>> log = s.issued();
  ASSERT_EQ(log.size(), 2 * 9u + S);  // + the next update's first S tiles, read ahead at the end
  for (int t = 0; t < S; t++) EXPECT_EQ(log[t], std::make_pair(false, (size_t)t)) << "read-ahead " << t;
  auto pos = [&](bool write, size_t t) {
    for (size_t i = 0; i < 2 * 9u; i++)
      if (log[i] == std::make_pair(write, t)) return (long)i;
    return -1L;
  };
  for (size_t t = 0; t < 9; t++) {
    ASSERT_GE(pos(false, t), 0) << t;
    ASSERT_GE(pos(true, t), 0) << t;
    EXPECT_LT(pos(false, t), pos(true, t)) << "tile " << t;
    if (t + S < 9) { EXPECT_LT(pos(true, t), pos(false, t + S)) << "tile " << t + S << " read before tile " << t << " left"; }
    if (t + 1 < (size_t)S) { EXPECT_LT(pos(false, t + 1), pos(true, t)) << "tile " << t + 1 << " not read ahead"; }
  }
  float x;
  s.read(0, 0, 1, &x);  // waits for the read-ahead
  const mt::offload::IoCounters c = s.counters();
  EXPECT_EQ(c.bytes_written, 9u * 4096);
  EXPECT_EQ(c.bytes_read, (9u + S) * 4096);
  std::filesystem::remove_all(dir);
}

// set_descending(true) (ZeRO 3's overlapped update): the update's tiles in the order tiles - 1, ..., 0, read ahead
// in that order (the first S read before any tile is acquired are the last S tiles; the next update's are read
// ahead at the end; each tile read before the one below it), and the values come back as in the ascending order;
// switching back drops the tiles read ahead for the other order and reads the current ones.
TEST(StateSwapper, ReadsAheadInDescendingOrder) {
  const std::string dir = temp_dir();
  const int S = 3;
  const size_t n = 7 * 1024 + 5;  // 8 tiles, the last partial
  StateSwapper s(options(dir, 1, n, S));
  std::vector<float> buf(n);
  for (size_t i = 0; i < n; i++) buf[i] = value(0, i, 0);
  s.write(0, 0, n, buf.data());
  const size_t T = s.tiles();
  ASSERT_EQ(T, 8u);
  auto update = [&](bool desc, int round) {
    s.set_descending(desc);
    s.begin_update();
    for (size_t k = 0; k < T; k++) {
      const size_t t = desc ? T - 1 - k : k;
      std::vector<float*> w = s.acquire(t);
      for (size_t i = t * 1024; i < std::min(n, (t + 1) * 1024); i++) {
        ASSERT_EQ(w[0][i - t * 1024], value(0, i, round - 1)) << "round " << round << " element " << i;
        w[0][i - t * 1024] = value(0, i, round);
      }
      s.release(t);
    }
    s.end_update();
  };
  const size_t before = s.issued().size();
  update(true, 1);
  std::vector<std::pair<bool, size_t>> log = s.issued();
  log.erase(log.begin(), log.begin() + (long)before);
  ASSERT_EQ(log.size(), 2 * T + S);
  for (int k = 0; k < S; k++) EXPECT_EQ(log[k], std::make_pair(false, T - 1 - k)) << "read-ahead " << k;
  for (int k = 0; k < S; k++) EXPECT_EQ(log[2 * T + k], std::make_pair(false, T - 1 - k)) << "next update's " << k;
  std::vector<long> read_at(T, -1);
  for (size_t i = 0; i < 2 * T; i++)
    if (!log[i].first) read_at[log[i].second] = (long)i;
  for (size_t t = 0; t + 1 < T; t++) EXPECT_GT(read_at[t], read_at[t + 1]) << "tile " << t << " read before " << t + 1;
  update(true, 2);
  update(false, 3);  // back to ascending: the descending read-ahead dropped, each tile's current values read
  s.read(0, 0, n, buf.data());
  for (size_t i = 0; i < n; i++) ASSERT_EQ(buf[i], value(0, i, 3)) << "element " << i;
  std::filesystem::remove_all(dir);
}

// set_read_ahead_later(true) (ZeRO 3 with the parameter shard in a file): end_update() reads nothing ahead; a
// later read_ahead() reads the next update's first S tiles, and one that comes during an update does so at its end.
TEST(StateSwapper, ReadsAheadWhenAskedWhenSetToLater) {
  const std::string dir = temp_dir();
  const int S = 3;
  StateSwapper s(options(dir, 1, 6 * 1024, S));
  s.set_read_ahead_later(true);
  auto update = [&](bool ask_inside) {
    s.begin_update();
    for (size_t t = 0; t < s.tiles(); t++) {
      s.acquire(t);
      if (ask_inside && t == 2) s.read_ahead();
      s.release(t);
    }
    s.end_update();
  };
  update(false);
  ASSERT_EQ(s.issued().size(), 2 * 6u) << "nothing read ahead at the update's end";
  s.read_ahead();
  std::vector<std::pair<bool, size_t>> log = s.issued();
  ASSERT_EQ(log.size(), 2 * 6u + S);
  for (int k = 0; k < S; k++) EXPECT_EQ(log[2 * 6 + k], std::make_pair(false, (size_t)k)) << "read-ahead " << k;
  update(true);  // starts from the S tiles read ahead; asks again during the update
  log = s.issued();
  ASSERT_EQ(log.size(), 2 * 6u + S + 2 * 6u - S + S) << "the read-ahead asked for during the update, at its end";
  for (int k = 0; k < S; k++) EXPECT_EQ(log[log.size() - S + k], std::make_pair(false, (size_t)k));
  float x;
  s.read(0, 0, 1, &x);
  std::filesystem::remove_all(dir);
}

TEST(StateSwapper, RefusesAMissingDirectoryOrAFile) {
  const std::string dir = temp_dir();
  try {
    StateSwapper s(options(dir + "/missing", 1, 100));
    FAIL() << "a missing directory was accepted";
  } catch (const mt::InputError& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/missing"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("create the directory"), std::string::npos) << e.what();
  }
  const std::string file = dir + "/plain";
  std::fclose(std::fopen(file.c_str(), "w"));
  try {
    StateSwapper s(options(file, 1, 100));
    FAIL() << "a file was accepted as a directory";
  } catch (const mt::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a directory"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

// The bytes allocated to the unnamed files this process holds open under dir (their /proc/self/fd links read
// "dir/#<inode> (deleted)" or "dir/<name> (deleted)"). Counted from the files themselves, not from the
// filesystem's free space, which other processes (tests running beside this one) change at the same time.
double open_unnamed_bytes(const std::string& dir) {
  double bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (ec || target.rfind(dir + "/", 0) != 0 || target.find(" (deleted)") == std::string::npos) continue;
    struct stat st {};
    if (::stat(e.path().c_str(), &st) == 0) bytes += (double)st.st_blocks * 512.0;
  }
  return bytes;
}

// /dev/shm is a tmpfs: the state's space is taken at start (fallocate) and given back with the swapper.
TEST(StateSwapper, TakesItsSpaceAtStartAndGivesItBack) {
  const std::string dir = "/dev/shm";
  if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << "no /dev/shm here";
  const double held_before = open_unnamed_bytes(dir);
  {
    // Counted only for unnamed files: a named file under /dev/shm would fail this too.
    StateSwapper s(options(dir, 2, 1 << 20));  // 8 MiB
    EXPECT_GE(open_unnamed_bytes(dir) - held_before, 7.9 * 1048576) << "the file's space was not reserved at start";
  }
  EXPECT_LT(open_unnamed_bytes(dir) - held_before, 1.0 * 1048576) << "the file's space was not given back";
}

// ---- The tiled update equals the in-memory one, bit for bit. ----

// Segments as ZeRO cuts them: pieces of tensors, state offsets packed, param and grad offsets elsewhere.
std::vector<mt::optim::Segment> pieces() {
  return {{100, 50, 0, 3000, true, 0, 7, nullptr},
          {5000, 3100, 3000, 1, false, 1, 0, nullptr},
          {6000, 4000, 3001, 2900, true, 2, 100, nullptr}};
}

template <class Make>
void expect_tiled_equals_memory(Make make, float clip) {
  const std::string dir = temp_dir();
  const size_t n = 5901, P = 9000, G = 7000;
  std::unique_ptr<mt::optim::Optimizer> mem = make(n);
  auto inner = make(n);
  StateSwapper::Options o = options(dir, inner->state().flat().size(), n, 2);
  inner->state().attach(std::make_unique<StateSwapper>(o));
  mt::optim::TiledOptimizer tiled(std::move(inner));
  std::vector<float> p1(P), p2(P), g(G);
  for (size_t i = 0; i < P; i++) p1[i] = p2[i] = std::sin(0.37f * (float)i);
  for (int step = 0; step < 3; step++) {
    for (size_t i = 0; i < G; i++) g[i] = std::cos(0.11f * (float)i + (float)step) * 0.01f;
    if (clip != 1.0f) {
      mem->scale_next_grads(clip);
      tiled.scale_next_grads(clip);
    }
    mem->step(p1.data(), g.data(), pieces(), 1e-2f, step);
    tiled.step(p2.data(), g.data(), pieces(), 1e-2f, step);
  }
  for (size_t i = 0; i < P; i++) ASSERT_EQ(std::memcmp(&p1[i], &p2[i], 4), 0) << "parameter " << i;
  for (size_t k : mem->state().flat()) {
    std::vector<float> a(n), b(n);
    mem->state().visit(k, false, [&](float* v, size_t m) { std::memcpy(a.data(), v, m * 4); });
    tiled.state().visit(k, false, [&](float* v, size_t m) { std::memcpy(b.data(), v, m * 4); });
    for (size_t i = 0; i < n; i++) ASSERT_EQ(std::memcmp(&a[i], &b[i], 4), 0) << mem->state().at(k).name << "[" << i << "]";
  }
  EXPECT_EQ(tiled.state().bytes(), 2u * o.buffers * 4096);  // two slots of one tile of every buffer
  EXPECT_EQ(tiled.state().offloaded_bytes(), o.buffers * n * 4);
  std::filesystem::remove_all(dir);
}

TEST(TiledOptimizer, AdamWEqualsTheInMemoryUpdate) {
  mt::optim::AdamWConfig c;
  c.weight_decay = 0.1f;
  expect_tiled_equals_memory([&](size_t n) { return std::make_unique<mt::optim::AdamW>(n, c); }, 0.5f);
}

TEST(TiledOptimizer, SgdEqualsTheInMemoryUpdate) {
  mt::optim::SgdConfig c;
  c.weight_decay = 0.1f;
  expect_tiled_equals_memory([&](size_t n) { return std::make_unique<mt::optim::Sgd>(n, c); }, 0.5f);
}

TEST(TiledOptimizer, CutsSegmentsAtTileBoundaries) {
  std::vector<mt::optim::Segment> out;
  mt::optim::TiledOptimizer::cut(pieces(), 2048, 3072, out);  // the first piece's tail, the second, the third's head
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].param, 100u + 2048);
  EXPECT_EQ(out[0].grad, 50u + 2048);
  EXPECT_EQ(out[0].state, 0u);
  EXPECT_EQ(out[0].count, 3000u - 2048);
  EXPECT_EQ(out[0].offset, 7u + 2048);
  EXPECT_EQ(out[1].param, 5000u);
  EXPECT_EQ(out[1].state, 3000u - 2048);
  EXPECT_EQ(out[1].count, 1u);
  EXPECT_EQ(out[1].offset, 0u);
  EXPECT_EQ(out[2].param, 6000u);
  EXPECT_EQ(out[2].grad, 4000u);
  EXPECT_EQ(out[2].state, 3001u - 2048);
  EXPECT_EQ(out[2].count, 3072u - 3001);
  EXPECT_EQ(out[2].offset, 100u);
}

}  // namespace
