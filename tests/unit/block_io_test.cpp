// The offload files' I/O engine (offload/block_io.h): aligned and unaligned ranges of a direct-I/O file come
// back as written, with io_uring (several blocks in flight) and with psync; a write that covers an edge block
// in part leaves the rest of that block as it was; a file shorter than the range is an error naming it.
#include "offload/block_io.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "offload/shard_file.h"
#include "offload/state_swapper.h"
#include "tensor/buffer.h"

namespace {

using mt::offload::BlockIo;
using mt::offload::kAlign;

struct TempFile {
  std::string dir;
  int fd = -1;
  bool direct = false;
  explicit TempFile(size_t bytes) {
    dir = (std::filesystem::temp_directory_path() / "mt_blockio_XXXXXX").string();
    EXPECT_NE(::mkdtemp(dir.data()), nullptr);
    fd = mt::offload::open_unnamed(dir, direct);
    EXPECT_EQ(::ftruncate(fd, (off_t)bytes), 0);
  }
  ~TempFile() {
    ::close(fd);
    std::filesystem::remove_all(dir);
  }
};

// io_uring not turned off for this host (kernel.io_uring_disabled absent or 0).
bool uring_allowed() {
  FILE* f = std::fopen("/proc/sys/kernel/io_uring_disabled", "r");
  if (!f) return true;
  int v = 0;
  const bool ok = std::fscanf(f, "%d", &v) == 1;
  std::fclose(f);
  return !ok || v == 0;
}

BlockIo::Options options(bool direct, bool uring, size_t block) {
  BlockIo::Options o;
  o.block = block;
  o.depth = 8;
  o.direct = direct;
  o.uring = uring;
  o.what = "test data in --offload-dir D";
  return o;
}

// A model of the file in memory beside the real one: random ranges written and read back through
// transfer_any (most of them not 4096-aligned, some longer than depth x block), the whole file compared.
void random_ranges(bool uring) {
  const size_t bytes = 3 * (size_t(1) << 20) + 5 * kAlign;
  TempFile f(bytes);
  BlockIo io(f.fd, options(f.direct, uring, 64 * 1024));  // 64 KiB blocks x 8: 512 KiB staged
  if (uring && BlockIo::uring_built() && uring_allowed()) {
    EXPECT_STREQ(io.engine(), "io_uring");
  }
  if (!uring) {
    EXPECT_STREQ(io.engine(), "psync");
  }
  std::vector<char> model(bytes, 0);
  io.transfer_any(true, 0, bytes, model.data());
  std::mt19937_64 rng(7);
  for (int it = 0; it < 60; it++) {
    const size_t off = rng() % bytes;
    const size_t len = 1 + rng() % std::min<size_t>(bytes - off, it % 3 == 0 ? bytes : 20000);
    std::vector<char> data(len + 3);
    for (char& c : data) c = (char)(rng() & 0xff);
    char* src = data.data() + it % 3;  // buffers at odd addresses too
    io.transfer_any(true, off, len, src);
    std::memcpy(model.data() + off, src, len);
    // A read of a range overlapping the one written.
    const size_t roff = off > 5000 ? off - 5000 : 0, rlen = std::min(bytes - roff, len + 10000);
    std::vector<char> back(rlen + 1);
    io.transfer_any(false, roff, rlen, back.data() + 1);
    ASSERT_EQ(std::memcmp(back.data() + 1, model.data() + roff, rlen), 0) << "iteration " << it;
  }
  std::vector<char> all(bytes);
  io.transfer_any(false, 0, bytes, all.data());
  EXPECT_EQ(std::memcmp(all.data(), model.data(), bytes), 0);
}

TEST(BlockIo, UnalignedRangesComeBackAsWrittenWithIoUring) { random_ranges(true); }
TEST(BlockIo, UnalignedRangesComeBackAsWrittenWithPsync) { random_ranges(false); }

TEST(BlockIo, APartialEdgeWriteKeepsTheRestOfItsBlock) {
  TempFile f(4 * kAlign);
  BlockIo io(f.fd, options(f.direct, true, kAlign));
  std::vector<char> ones(4 * kAlign, 1);
  io.transfer_any(true, 0, ones.size(), ones.data());
  // Both ends inside one block, then a range from inside block 1 to inside block 3.
  std::vector<char> twos(3 * kAlign, 2);
  io.transfer_any(true, 10, 20, twos.data());
  io.transfer_any(true, kAlign + 100, 2 * kAlign, twos.data());
  std::vector<char> back(4 * kAlign);
  io.transfer_any(false, 0, back.size(), back.data());
  for (size_t i = 0; i < back.size(); i++) {
    const bool written = (i >= 10 && i < 30) || (i >= kAlign + 100 && i < 3 * kAlign + 100);
    ASSERT_EQ(back[i], written ? 2 : 1) << "byte " << i;
  }
}

TEST(BlockIo, AlignedTransferUsesTheCallersMemoryAndNamesAShortFile) {
  TempFile f(8 * kAlign);
  BlockIo io(f.fd, options(f.direct, true, 2 * kAlign));
  char* buf = static_cast<char*>(std::aligned_alloc(kAlign, 16 * kAlign));
  for (size_t i = 0; i < 8 * kAlign; i++) buf[i] = (char)(i * 7);
  io.transfer(true, 0, 8 * kAlign, buf);
  std::memset(buf, 0, 8 * kAlign);
  io.transfer(false, 0, 8 * kAlign, buf);
  for (size_t i = 0; i < 8 * kAlign; i++) ASSERT_EQ(buf[i], (char)(i * 7)) << i;
  // Past the end of the file: an OffloadError naming what the file holds, not a hang or a silent zero.
  try {
    io.transfer(false, 4 * kAlign, 8 * kAlign, buf);
    ADD_FAILURE() << "a read past the end returned";
  } catch (const mt::offload::OffloadError& e) {
    EXPECT_NE(std::string(e.what()).find("test data in --offload-dir D ended at byte"), std::string::npos) << e.what();
  }
  std::free(buf);
}

// ShardFile on a directory that takes O_DIRECT (the test's temporary directory, ext4 here) moves its
// unaligned float ranges through the engine directly; the page-cache mode (direct = false) gives the same.
TEST(BlockIo, ShardFileUsesDirectIoWhereTheFilesystemTakesIt) {
  std::string dir = (std::filesystem::temp_directory_path() / "mt_blockio_XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  bool direct = false;
  ::close(mt::offload::open_unnamed(dir, direct));
  for (bool want : {true, false}) {
    mt::offload::ShardFile::Options o;
    o.dir = dir;
    o.kind = "parameters";
    o.n = 300001;
    o.timeout_s = 60;
    o.direct = want;
    mt::offload::ShardFile f(o);
    EXPECT_EQ(f.direct_io(), want && direct);
    std::vector<float> a(o.n), back(o.n);
    for (size_t i = 0; i < o.n; i++) a[i] = (float)i * 0.25f;
    f.write(0, o.n, a.data());
    f.write_copy(1001, 77, std::vector<float>(77, -1.0f).data());
    f.read(0, o.n, back.data());
    for (size_t i = 0; i < o.n; i++) ASSERT_EQ(back[i], i >= 1001 && i < 1078 ? -1.0f : a[i]) << i;
  }
  std::filesystem::remove_all(dir);
}

// The staging the memory plan counts (train/offload.h): nothing held until the first unaligned direct transfer,
// then depth blocks and two 4096-byte edge blocks (what staging_need() promised); an aligned transfer, or a file
// without direct I/O, never takes any.
TEST(BlockIo, StagingIsHeldFromItsFirstUseAndIsWhatItsNeedSays) {
  TempFile f(64 * kAlign);
  EXPECT_EQ(BlockIo(f.fd, options(false, true, 2 * kAlign)).staging_need(), 0u);
  {
    const bool direct = f.direct;  // the file's mode (O_DIRECT where the filesystem takes it)
    BlockIo io(f.fd, options(direct, true, 2 * kAlign));
    const size_t want = direct ? (size_t)io.depth() * 2 * kAlign + 2 * kAlign : 0;
    EXPECT_EQ(io.staging_need(), want);
    EXPECT_EQ(io.staging_bytes(), 0u);
    char* buf = static_cast<char*>(std::aligned_alloc(kAlign, 16 * kAlign));
    std::memset(buf, 1, 16 * kAlign);
    io.transfer_any(true, 0, 4 * kAlign, buf);  // aligned: the caller's memory
    EXPECT_EQ(io.staging_bytes(), 0u);
    io.transfer_any(true, 100, 5 * kAlign, buf + 3);  // unaligned
    EXPECT_EQ(io.staging_bytes(), want);
    std::free(buf);
  }
}

// A buffer congruent with its range (offload::congruent_pad): the whole 4096-byte blocks move the caller's memory
// and only the two partly covered edge blocks are staged (staged_bytes() counts the caller's bytes copied); the
// data comes back as written, and the bytes around the range in the file and in the buffer are left alone.
TEST(BlockIo, ACongruentBufferStagesOnlyItsEdgeBlocks) {
  TempFile f(64 * kAlign);
  BlockIo io(f.fd, options(f.direct, true, 2 * kAlign));
  if (!f.direct) GTEST_SKIP() << "the temporary directory does not take O_DIRECT";
  mt::AlignedBuffer ones(16 * kAlign), base(16 * kAlign);
  for (size_t i = 0; i < ones.size(); i++) ones[i] = 1.0f;
  io.transfer_any(true, 0, ones.bytes(), ones.data());
  const size_t off = 3 * 1024 + 5;  // floats: not on a 4096-byte boundary
  const size_t n = 5 * 1024 + 9;    // over four whole blocks between two partial ones
  const size_t pad = mt::offload::congruent_pad(base.data(), off);
  EXPECT_LT(pad, mt::offload::kCongruentSlack);
  EXPECT_EQ(((uintptr_t)(base.data() + pad) - off * sizeof(float)) % kAlign, 0u);
  EXPECT_EQ(pad % 16, off % 16);  // the element's place modulo 64 bytes, as in a 64-byte aligned shard
  float* p = base.data() + pad;
  for (size_t i = 0; i < n; i++) p[i] = 2.0f + (float)i;
  const uint64_t before = io.staged_bytes();
  io.transfer_any(true, off * sizeof(float), n * sizeof(float), p);
  const uint64_t wrote = io.staged_bytes() - before;
  EXPECT_GT(wrote, 0u);
  EXPECT_LT(wrote, 2 * kAlign);
  mt::AlignedBuffer back(16 * kAlign);
  float* q = back.data() + mt::offload::congruent_pad(back.data(), off);
  io.transfer_any(false, off * sizeof(float), n * sizeof(float), q);
  EXPECT_EQ(io.staged_bytes() - before - wrote, wrote);  // the read stages the same edge bytes
  for (size_t i = 0; i < n; i++) ASSERT_EQ(q[i], 2.0f + (float)i) << i;
  mt::AlignedBuffer all(16 * kAlign);
  io.transfer_any(false, 0, all.bytes(), all.data());
  for (size_t i = 0; i < all.size(); i++) ASSERT_EQ(all[i], i >= off && i < off + n ? 2.0f + (float)(i - off) : 1.0f) << i;
  // Not congruent (one float further on): all of it staged.
  const uint64_t b2 = io.staged_bytes();
  io.transfer_any(false, off * sizeof(float), n * sizeof(float), q + 1);
  EXPECT_EQ(io.staged_bytes() - b2, n * sizeof(float));
}

}  // namespace
