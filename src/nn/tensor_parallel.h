// What a model needs from its tensor-parallel group, without depending on comm/: the group's rank and
// size, two in-place reductions, and (sequence parallelism) the all-gather / reduce-scatter of a buffer split
// into size() equal consecutive parts, part r on rank r. parallel/tensor implements it over a Communicator; nullptr (or size 1)
// means no tensor parallelism.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mt::nn {

class TensorParallelOps {
 public:
  virtual ~TensorParallelOps() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void all_reduce_sum(float* buf, size_t count) = 0;
  virtual void all_reduce_max(float* buf, size_t count) = 0;
  // full[count] = the parts in rank order; local = this rank's part, count / size() floats.
  virtual void all_gather(const float* local, float* full, size_t count) = 0;
  // local = part r of the sum over the group of full[count].
  virtual void reduce_scatter(const float* full, float* local, size_t count) = 0;
  // all_gather of bf16 values (an activation kept in bf16 under --precision bf16). This default widens them,
  // gathers float32 and rounds back (exact: every value is a bf16); a communicator moves the 2 bytes instead.
  virtual void all_gather_bf16(const uint16_t* local, uint16_t* full, size_t count);
};

}  // namespace mt::nn
