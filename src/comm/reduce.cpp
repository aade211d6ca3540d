#include "comm/reduce.h"

#include <algorithm>
#include <cstring>

#include "comm/copy.h"
#include "core/error.h"

namespace mt::comm {

namespace {

constexpr size_t kBlock = 2048;

inline void load(float* __restrict acc, const void* src, size_t k, DType t) {
  if (t == DType::f32) {
    std::memcpy(acc, src, k * 4);
  } else {
    const bf16_t* s = static_cast<const bf16_t*>(src);
    for (size_t i = 0; i < k; ++i) acc[i] = bf16_to_f32(s[i]);
  }
}

inline void combine(float* __restrict acc, const void* src, size_t k, DType t, ReduceOp op) {
  if (t == DType::f32) {
    const float* __restrict s = static_cast<const float*>(src);
    if (op == ReduceOp::max) {
      for (size_t i = 0; i < k; ++i) acc[i] = std::max(acc[i], s[i]);
    } else {
      for (size_t i = 0; i < k; ++i) acc[i] += s[i];
    }
  } else {
    const bf16_t* __restrict s = static_cast<const bf16_t*>(src);
    if (op == ReduceOp::max) {
      for (size_t i = 0; i < k; ++i) acc[i] = std::max(acc[i], bf16_to_f32(s[i]));
    } else {
      for (size_t i = 0; i < k; ++i) acc[i] += bf16_to_f32(s[i]);
    }
  }
}

inline void store(void* dst, float* __restrict acc, size_t k, DType t, ReduceOp op, int divisor, bool stream) {
  if (op == ReduceOp::avg) {
    const float d = static_cast<float>(divisor);
    for (size_t i = 0; i < k; ++i) acc[i] = acc[i] / d;
  }
  if (t == DType::f32) {
    copy_bytes(dst, acc, k * 4, stream);
  } else if (!stream) {
    bf16_t* __restrict o = static_cast<bf16_t*>(dst);
    for (size_t i = 0; i < k; ++i) o[i] = f32_to_bf16(acc[i]);
  } else {
    alignas(64) bf16_t o[kBlock];
    for (size_t i = 0; i < k; ++i) o[i] = f32_to_bf16(acc[i]);
    copy_bytes(dst, o, k * sizeof(bf16_t), true);
  }
}

}  // namespace

void reduce_into(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype, ReduceOp op,
                 int divisor, bool stream) {
  MT_ASSERT(nsrc >= 1, "nsrc=", nsrc);
  const size_t es = dtype_size(dtype);
  // Two f32 sources and no division: one fused pass, no accumulator round trip (the hot 2-rank case).
  if (dtype == DType::f32 && nsrc == 2 && op == ReduceOp::sum && !stream) {
    const float* a = static_cast<const float*>(srcs[0]);
    const float* b = static_cast<const float*>(srcs[1]);
    float* o = static_cast<float*>(dst);
    for (size_t i = 0; i < count; ++i) o[i] = a[i] + b[i];
    return;
  }
  alignas(64) float acc[kBlock];
  for (size_t off = 0; off < count; off += kBlock) {
    const size_t k = std::min(kBlock, count - off);
    load(acc, static_cast<const char*>(srcs[0]) + off * es, k, dtype);
    for (int s = 1; s < nsrc; ++s) combine(acc, static_cast<const char*>(srcs[s]) + off * es, k, dtype, op);
    store(static_cast<char*>(dst) + off * es, acc, k, dtype, op, divisor, stream);
  }
}

void reduce_reference(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype, ReduceOp op,
                      int divisor) {
  auto get = [&](int s, size_t i) {
    return dtype == DType::f32 ? static_cast<const float*>(srcs[s])[i]
                               : bf16_to_f32(static_cast<const bf16_t*>(srcs[s])[i]);
  };
  for (size_t i = 0; i < count; ++i) {
    float a = get(0, i);
    for (int s = 1; s < nsrc; ++s) a = op == ReduceOp::max ? std::max(a, get(s, i)) : a + get(s, i);
    if (op == ReduceOp::avg) a = a / static_cast<float>(divisor);
    if (dtype == DType::f32) {
      static_cast<float*>(dst)[i] = a;
    } else {
      static_cast<bf16_t*>(dst)[i] = f32_to_bf16(a);
    }
  }
}

}  // namespace mt::comm
