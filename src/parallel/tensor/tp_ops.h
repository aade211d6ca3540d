// nn::TensorParallelOps over a communicator (the tensor-parallel group of the mesh).
#pragma once

#include "comm/communicator.h"
#include "nn/tensor_parallel.h"

namespace mt::parallel {

class CommTensorParallelOps : public nn::TensorParallelOps {
 public:
  explicit CommTensorParallelOps(comm::Communicator& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  void all_reduce_sum(float* buf, size_t count) override {
    group_.all_reduce(buf, buf, count, comm::DType::f32, comm::ReduceOp::sum);
  }
  void all_reduce_max(float* buf, size_t count) override {
    group_.all_reduce(buf, buf, count, comm::DType::f32, comm::ReduceOp::max);
  }
  void all_gather(const float* local, float* full, size_t count) override {
    group_.all_gather(local, full, count, comm::DType::f32);
  }
  void all_gather_bf16(const uint16_t* local, uint16_t* full, size_t count) override {
    group_.all_gather(local, full, count, comm::DType::bf16);
  }
  void reduce_scatter(const float* full, float* local, size_t count) override {
    group_.reduce_scatter(full, local, count, comm::DType::f32, comm::ReduceOp::sum);
  }

 private:
  comm::Communicator& group_;
};

}  // namespace mt::parallel
