// Vocabulary of the communication layer: element types, reduce operations, operation kinds, algorithm
// choices, the balanced block partition every sharded collective uses, and bf16 <-> f32 conversion.
// Legend: n = group size, r = this rank in the group, S = bytes of the full message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace mt::comm {

// Element types on the wire. bf16 is reduced with float32 accumulation: each element is widened, all n
// contributions are combined in float32, and the result is rounded to bf16 once (round to nearest even).
// u8 is raw bytes (packed, compressed payloads): moved by all_gather, broadcast, all_to_all(_v) and
// point-to-point, never reduced (a reduction of u8 is an error).
enum class DType : uint8_t { f32, bf16, u8 };
// avg = sum / n (a true division, so small-integer inputs give exact, backend-independent results).
enum class ReduceOp : uint8_t { sum, avg, max };

enum class OpKind : uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  reduce,
  all_to_all,
  all_to_all_v,
  send,
  recv,
  barrier,
  split,
  kCount
};
constexpr int kNumOpKinds = static_cast<int>(OpKind::kCount);

// Algorithm for all-reduce / reduce (the operations with a latency/bandwidth trade-off).
//  direct: every rank publishes its whole input and reduces all n inputs itself. 1 synchronisation per
//          chunk; each rank reads n*S. Latency-optimal: the choice for small messages.
//  rs_ag:  reduce-scatter then all-gather through shared buffers, chunked and double-buffered. 2
//          synchronisations per chunk; each rank reads S + S + S(n-1)/n and writes S + S/n. Bandwidth-
//          optimal (the shared-memory equivalent of a ring): the choice for large messages.
//  automatic: direct up to kDirectMaxBytes, rs_ag above (see ShmCommunicator).
enum class Algo : uint8_t { automatic, direct, rs_ag };

const char* dtype_name(DType t);
const char* reduce_op_name(ReduceOp op);
const char* op_kind_name(OpKind k);
const char* algo_name(Algo a);
// Parses "auto" | "direct" | "rs_ag"; throws mt::InputError listing the choices otherwise.
Algo parse_algo(const char* s);
// Parses "f32" | "bf16"; throws mt::InputError otherwise.
DType parse_dtype(const char* s);

inline size_t dtype_size(DType t) { return t == DType::f32 ? 4 : t == DType::bf16 ? 2 : 1; }

// The balanced block partition of `count` elements over n ranks: the first count % n ranks own one
// element more. reduce_scatter and all_gather use it, so ZeRO-style flat buffers need no padding.
struct Shard {
  size_t offset = 0;
  size_t count = 0;
};
inline Shard shard_of(size_t count, int n, int r) {
  size_t base = count / n, extra = count % n, ur = static_cast<size_t>(r);
  return {ur * base + (ur < extra ? ur : extra), base + (ur < extra ? 1 : 0)};
}

using bf16_t = uint16_t;
inline float bf16_to_f32(bf16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline bf16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return static_cast<bf16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<bf16_t>(u >> 16);
}

}  // namespace mt::comm
