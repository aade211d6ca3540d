// A weight as the products read it: its float32 values and, under --precision bf16, the bf16 mirror the
// parameter store keeps of it (nn::Param::data16: the same values rounded to bf16 once per step, after the
// update; parallel/data). A Precision::bf16 product reads the mirror when there is one and otherwise rounds
// the float32 values itself: the same bits either way, the mirror only saves the rounding pass per product.
// Converts from a plain float32 pointer, so a caller without a store (a test, a reference) passes one.
#pragma once

#include <cstdint>

namespace mt::nn {

struct Weight {
  const float* f32 = nullptr;     // may be null where only the mirror exists (never under Precision::fp32)
  const uint16_t* b16 = nullptr;  // null: no mirror
  Weight(const float* w) : f32(w) {}  // NOLINT(google-explicit-constructor): every float32 weight is one
  Weight(const float* w, const uint16_t* w16) : f32(w), b16(w16) {}
};

}  // namespace mt::nn
