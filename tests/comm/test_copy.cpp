// copy_bytes against a byte-by-byte expectation: every length around the vector loop's edges, every
// source/destination misalignment within a cache line, ordinary and streaming stores; the bytes either side
// of the destination range must stay untouched.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "comm/copy.h"

namespace mt::comm {
namespace {

uint8_t src_byte(size_t i) { return static_cast<uint8_t>((i * 131 + 7) % 251); }

void check_copy(size_t n, size_t soff, size_t doff, bool stream) {
  constexpr size_t kGuard = 256;
  std::vector<uint8_t> src(n + 2 * kGuard + 64), dst(n + 2 * kGuard + 64, 0xEE);
  // Offsets from a 64-byte boundary, so soff/doff are the real misalignments.
  uint8_t* sbase = src.data() + (64 - reinterpret_cast<uintptr_t>(src.data()) % 64) % 64;
  uint8_t* dbase = dst.data() + (64 - reinterpret_cast<uintptr_t>(dst.data()) % 64) % 64;
  uint8_t* s = sbase + kGuard / 2 + soff;
  uint8_t* d = dbase + kGuard / 2 + doff;
  for (size_t i = 0; i < n; ++i) s[i] = src_byte(i);
  copy_bytes(d, s, n, stream);
  stream_fence();
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(d[i], src_byte(i)) << "n=" << n << " soff=" << soff << " doff=" << doff << " stream=" << stream
                                 << " at byte " << i;
  }
  for (uint8_t* p = dst.data(); p < d; ++p) ASSERT_EQ(*p, 0xEE) << "wrote before the destination, n=" << n;
  for (uint8_t* p = d + n; p < dst.data() + dst.size(); ++p) ASSERT_EQ(*p, 0xEE) << "wrote past the end, n=" << n;
}

TEST(CopyBytes, EveryLengthAndAlignmentAroundTheLoopEdges) {
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 80; ++n) lengths.push_back(n);
  for (size_t base : {kCopyLoopMinBytes, size_t{2048}, size_t{4096}, size_t{65536}}) {
    for (size_t n = base - 70; n <= base + 70; n += 3) lengths.push_back(n);
  }
  for (size_t n : lengths) {
    for (size_t soff : {0, 1, 16, 33, 63}) {
      for (size_t doff : {0, 1, 16, 32, 63}) {
        for (bool stream : {false, true}) check_copy(n, soff, doff, stream);
      }
    }
  }
}

TEST(CopyBytes, LargeStreamedCopy) {
  for (bool stream : {false, true}) check_copy((size_t{9} << 20) + 37, 16, 5, stream);
}

}  // namespace
}  // namespace mt::comm
