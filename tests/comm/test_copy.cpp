// copy_bytes against a byte-by-byte expectation: every length around the vector loop's edges, every
// source/destination misalignment within a cache line, ordinary and streaming stores; the bytes either side
// of the destination range must stay untouched. CopyInPolicy's choice of stores for copies into shared
// memory, driven by made-up rates (no timing), and copy_in's bytes through every kind of plan.
#include <gtest/gtest.h>

#include <algorithm>
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

constexpr double kGB = 1e9;
constexpr size_t kBig = CopyInPolicy::kMeasureMinBytes;

// Seconds that `bytes` take at `gbps`.
double at(size_t bytes, double gbps) { return double(bytes) / (gbps * kGB); }

TEST(CopyInPolicy, StreamsAfterTwoSlowCopiesInARowAndProbesItsWayBack) {
  CopyInPolicy p(16 * kGB, 25 * kGB);
  // Ordinary: every measured copy is timed whole.
  CopyInPolicy::Plan plan = p.plan(kBig);
  EXPECT_FALSE(plan.stream);
  EXPECT_EQ(plan.timed_bytes, kBig);
  // One slow copy (a preemption, a page fault) is not enough; a fast one resets the count.
  p.observe(kBig, at(kBig, 2));
  EXPECT_FALSE(p.streaming());
  p.observe(kBig, at(kBig, 50));
  p.observe(kBig, at(kBig, 2));
  EXPECT_FALSE(p.streaming());
  p.observe(kBig, at(kBig, 15.9));
  EXPECT_TRUE(p.streaming());
  EXPECT_EQ(p.switches(), 1);
  // Streaming: untimed except every kProbeEvery-th measured copy, whose first kProbeBytes are the probe.
  const size_t n = 4 * CopyInPolicy::kProbeBytes;
  for (int i = 1; i < CopyInPolicy::kProbeEvery; ++i) {
    plan = p.plan(n);
    EXPECT_TRUE(plan.stream);
    EXPECT_EQ(plan.timed_bytes, 0u) << "copy " << i;
  }
  plan = p.plan(n);
  EXPECT_TRUE(plan.stream);
  EXPECT_EQ(plan.timed_bytes, CopyInPolicy::kProbeBytes);
  p.observe(plan.timed_bytes, at(plan.timed_bytes, 20));  // between the thresholds: stay
  EXPECT_TRUE(p.streaming());
  for (int i = 1; i < CopyInPolicy::kProbeEvery; ++i) EXPECT_EQ(p.plan(n).timed_bytes, 0u);
  plan = p.plan(kBig);  // a probe never exceeds the copy
  EXPECT_EQ(plan.timed_bytes, std::min(kBig, CopyInPolicy::kProbeBytes));
  p.observe(plan.timed_bytes, at(plan.timed_bytes, 26));
  EXPECT_FALSE(p.streaming());
  EXPECT_EQ(p.switches(), 2);
  EXPECT_EQ(p.streamed_copies(), 2 * CopyInPolicy::kProbeEvery);
  EXPECT_EQ(p.ordinary_copies(), 1);
}

// Copies under kProbeMinBytes are never timed and never streamed; those under kMeasureMinBytes are timed only
// as every kProbeEvery-th probe, in both modes, so a run of small messages still finds its way back.
TEST(CopyInPolicy, SmallCopiesAreOnlyProbed) {
  CopyInPolicy p(16 * kGB, 25 * kGB);
  const size_t small = CopyInPolicy::kProbeMinBytes, tiny = small - 1;
  for (int i = 0; i < 3 * CopyInPolicy::kProbeEvery; ++i) EXPECT_EQ(p.plan(tiny).timed_bytes, 0u);
  for (int round = 0; round < 2; ++round) {
    for (int i = 1; i < CopyInPolicy::kProbeEvery; ++i) {
      CopyInPolicy::Plan plan = p.plan(small);
      EXPECT_FALSE(plan.stream);
      EXPECT_EQ(plan.timed_bytes, 0u);
    }
    EXPECT_EQ(p.plan(small).timed_bytes, small);
    p.observe(small, at(small, 1));  // slow: twice in a row switches
  }
  ASSERT_TRUE(p.streaming());
  for (int i = 0; i < 3 * CopyInPolicy::kProbeEvery; ++i) {
    CopyInPolicy::Plan plan = p.plan(tiny);
    EXPECT_FALSE(plan.stream) << "below kProbeMinBytes: ordinary stores even while streaming";
    EXPECT_EQ(plan.timed_bytes, 0u);
  }
  // Copies below the vector loop's size are memcpy whatever the mode: not counted as either kind.
  const int64_t streamed = p.streamed_copies(), ordinary = p.ordinary_copies();
  p.plan(kCopyLoopMinBytes - 1);
  EXPECT_EQ(p.streamed_copies(), streamed);
  EXPECT_EQ(p.ordinary_copies(), ordinary);
  for (int i = 1; i < CopyInPolicy::kProbeEvery; ++i) {
    CopyInPolicy::Plan plan = p.plan(small);
    EXPECT_TRUE(plan.stream);
    EXPECT_EQ(plan.timed_bytes, 0u);
  }
  CopyInPolicy::Plan probe = p.plan(small);
  EXPECT_EQ(probe.timed_bytes, small);
  p.observe(small, at(small, 30));
  EXPECT_FALSE(p.streaming());
}

TEST(CopyInPolicy, FixedNeverTimesNorSwitches) {
  for (bool stream : {false, true}) {
    CopyInPolicy p = CopyInPolicy::fixed(stream);
    for (int i = 0; i < 2 * CopyInPolicy::kProbeEvery; ++i) {
      CopyInPolicy::Plan plan = p.plan(kBig * 4);
      EXPECT_EQ(plan.stream, stream);
      EXPECT_EQ(plan.timed_bytes, 0u);
      p.observe(kBig, at(kBig, stream ? 1000 : 0.001));
    }
    EXPECT_EQ(p.streaming(), stream);
    EXPECT_EQ(p.switches(), 0);
  }
}

// copy_in's bytes are right whichever plan a copy gets: ordinary and timed, streamed, or probe + streamed
// (the probe's ordinary head and the streamed rest meet at an arbitrary offset).
TEST(CopyIn, EveryPlanCopiesTheBytes) {
  // Thresholds no copy reaches: the first two copies are ordinary and timed, then the policy streams for
  // good, with a probe (ordinary head, streamed rest) every kProbeEvery-th copy.
  CopyInPolicy p(1e30, 1e30);
  const size_t n = CopyInPolicy::kProbeBytes + 4099;
  std::vector<uint8_t> src(n + 3), dst(n + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = src_byte(i);
  const int calls = 2 * CopyInPolicy::kProbeEvery + 4;  // two probes among them
  for (int call = 0; call < calls; ++call) {
    std::fill(dst.begin(), dst.end(), 0xEE);
    copy_in(dst.data() + 5, src.data() + 3, n, p);
    stream_fence();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(dst[5 + i], src_byte(i + 3)) << "call " << call << " byte " << i;
    for (size_t i = 0; i < 5; ++i) ASSERT_EQ(dst[i], 0xEE);
    for (size_t i = 5 + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xEE);
  }
  EXPECT_TRUE(p.streaming());
  EXPECT_EQ(p.ordinary_copies(), 2);
  EXPECT_EQ(p.streamed_copies(), calls - 2);
}

}  // namespace
}  // namespace mt::comm
