// What an MoE layer needs from its expert-parallel group, without depending on comm/: the group's rank and
// size, an all-to-all of counts and an all-to-all(v) of float rows. parallel/expert implements it over a
// Communicator; nullptr (or size 1) means every expert is on this rank.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "tensor/buffer.h"

namespace mt::nn {

class ExpertParallelOps {
 public:
  virtual ~ExpertParallelOps() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // recv[r * per_rank + i] = what rank r sent as send[rank() * per_rank + i].
  virtual void exchange_counts(const int64_t* send, int64_t* recv, size_t per_rank) = 0;
  // send holds send_floats[r] floats for each rank r, packed in rank order; recv gets recv_floats[r] from
  // each rank r, packed in rank order (the caller knows them from exchange_counts).
  virtual void exchange_rows(const float* send, const size_t* send_floats, float* recv, const size_t* recv_floats) = 0;
  // Room for at least `floats` floats, for the send side of exchange_rows: valid until the next call, reused by
  // every layer of this group (the exchanges are blocking: a buffer is free again when exchange_rows returns). In
  // the job's shared heap when there is one (AlignedBuffer::shared), where peers read the rows with ordinary
  // loads instead of process_vm_readv. Grows by at least a quarter when it grows, never shrinks: a run's sizes
  // settle after a few steps and the buffer is not released and faulted in again per call.
  float* send_buffer(size_t floats) {
    if (floats > send_.size()) send_.resize(std::max(floats, send_.size() + send_.size() / 4));
    return send_.data();
  }

 private:
  AlignedBuffer send_ = AlignedBuffer::shared(0);
};

}  // namespace mt::nn
