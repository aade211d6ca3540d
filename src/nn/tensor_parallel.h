// What a model needs from its tensor-parallel group, without depending on comm/: the group's rank and
// size and two in-place reductions. parallel/tensor implements it over a Communicator; nullptr (or size 1)
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
};

}  // namespace mt::nn
