// What a model needs from its tensor-parallel group, without depending on comm/: the group's rank and
// size, two in-place reductions, and (sequence parallelism) the all-gather / reduce-scatter of a buffer split
// into size() equal consecutive parts, part r on rank r. parallel/tensor implements it over a Communicator; nullptr (or size 1)
// means no tensor parallelism.
#pragma once

#include <cstddef>

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
};

}  // namespace mt::nn
