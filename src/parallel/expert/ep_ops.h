// nn::ExpertParallelOps over a communicator (the expert-parallel group of the mesh: ep ranks of one
// data-parallel group). Counts travel as raw bytes by all-to-all, token rows by all-to-all(v): only the rows
// of admitted tokens, and a rank's rows for its own experts never leave it.
// Cost per exchange on P ranks: one all-to-all of P * Le * 8 bytes for counts (forward only), and one
// all-to-all(v) whose bytes are exactly the rows bound for other ranks.
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "nn/expert_parallel.h"

namespace mt::parallel {

class CommExpertParallelOps : public nn::ExpertParallelOps {
 public:
  explicit CommExpertParallelOps(comm::Communicator& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  void exchange_counts(const int64_t* send, int64_t* recv, size_t per_rank) override {
    group_.all_to_all(send, recv, per_rank * sizeof(int64_t), comm::DType::u8);
  }
  void exchange_rows(const float* send, const size_t* send_floats, float* recv, const size_t* recv_floats) override {
    group_.all_to_all_v(send, send_floats, nullptr, recv, recv_floats, nullptr, comm::DType::f32);
  }

 private:
  comm::Communicator& group_;
};

}  // namespace mt::parallel
