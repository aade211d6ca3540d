#include "comm/types.h"

#include <string>

#include "core/error.h"

namespace mt::comm {

const char* dtype_name(DType t) { return t == DType::f32 ? "f32" : t == DType::bf16 ? "bf16" : "u8"; }

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
  }
  return "?";
}

const char* op_kind_name(OpKind k) {
  static const char* kNames[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                 "reduce",     "all_to_all",     "all_to_all_v", "send",
                                 "recv",       "barrier",        "split"};
  int i = static_cast<int>(k);
  return i >= 0 && i < kNumOpKinds ? kNames[i] : "?";
}

const char* algo_name(Algo a) {
  switch (a) {
    case Algo::automatic: return "auto";
    case Algo::direct: return "direct";
    case Algo::rs_ag: return "rs_ag";
  }
  return "?";
}

Algo parse_algo(const char* s) {
  std::string v = s;
  if (v == "auto") return Algo::automatic;
  if (v == "direct") return Algo::direct;
  if (v == "rs_ag") return Algo::rs_ag;
  throw InputError(str("unknown algorithm '", v, "': choose auto, direct or rs_ag"));
}

DType parse_dtype(const char* s) {
  std::string v = s;
  if (v == "f32") return DType::f32;
  if (v == "bf16") return DType::bf16;
  throw InputError(str("unknown dtype '", v, "': choose f32 or bf16"));
}

}  // namespace mt::comm
