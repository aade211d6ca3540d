// The reduction kernels and bf16 conversion: the fast path against the one-element-at-a-time reference,
// bit for bit, on values that are not small integers (so rounding matters).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "comm/copy.h"
#include "comm/reduce.h"

namespace mt::comm {
namespace {

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties go to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even): rounds up.
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-INFINITY)), -INFINITY);
}

TEST(ReduceInto, MatchesReferenceBitForBit) {
  for (DType t : {DType::f32, DType::bf16}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
      for (int nsrc : {1, 2, 3, 7}) {
        const size_t n = 5000;
        const size_t e = dtype_size(t);
        std::vector<std::vector<char>> in(nsrc, std::vector<char>(n * e));
        std::vector<const void*> ptrs;
        for (int s = 0; s < nsrc; ++s) {
          for (size_t i = 0; i < n; ++i) {
            float v = std::sin(float(i * 13 + s * 101)) * 3.7f;
            if (t == DType::f32) {
              std::memcpy(&in[s][i * 4], &v, 4);
            } else {
              bf16_t h = f32_to_bf16(v);
              std::memcpy(&in[s][i * 2], &h, 2);
            }
          }
          ptrs.push_back(in[s].data());
        }
        std::vector<char> fast(n * e), ref(n * e);
        reduce_into(fast.data(), ptrs.data(), nsrc, n, t, op, nsrc);
        reduce_reference(ref.data(), ptrs.data(), nsrc, n, t, op, nsrc);
        EXPECT_EQ(fast, ref) << dtype_name(t) << " " << reduce_op_name(op) << " nsrc=" << nsrc;
        // In place: the destination is the first source.
        std::vector<char> first = in[0];
        ptrs[0] = first.data();
        reduce_into(first.data(), ptrs.data(), nsrc, n, t, op, nsrc);
        EXPECT_EQ(first, ref) << "in place " << dtype_name(t) << " " << reduce_op_name(op);
        // Streaming stores (the shm slot path), into a destination at an odd offset so the vector loop's
        // unaligned head and tail are both taken.
        ptrs[0] = in[0].data();
        std::vector<char> streamed(n * e + 3 * e);
        reduce_into(streamed.data() + 3 * e, ptrs.data(), nsrc, n, t, op, nsrc, /*stream=*/true);
        stream_fence();
        EXPECT_EQ(std::vector<char>(streamed.begin() + 3 * e, streamed.end()), ref)
            << "streamed " << dtype_name(t) << " " << reduce_op_name(op) << " nsrc=" << nsrc;
      }
    }
  }
}

}  // namespace
}  // namespace mt::comm
