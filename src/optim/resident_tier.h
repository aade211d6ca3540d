// A state tier that keeps the flat buffers in memory (StateTier's interface over plain buffers). It exists so
// that the tiled update (optim/tiled_optimizer.h) can run with the optimizer state resident while the
// parameters or gradients stream from files (--offload params and/or grads without --offload optimizer):
// step_from() walks tiles of the state, and this tier's tiles are slices of the resident buffers, so nothing
// is copied and nothing is written behind. Same bits as the whole-buffer update for the same reason the file
// tier gives them (a segment cut at a tile boundary moves param, grad, state and offset alike).
#pragma once

#include <cstddef>
#include <vector>

#include "optim/state_store.h"
#include "tensor/buffer.h"

namespace mt::optim {

class ResidentTier final : public StateTier {
 public:
  // `buffers` flat buffers of n floats each, zeroed; tiles of tile_elems (> 0) elements. The buffers are
  // allocated at their first use (the memory plan, made before, counts them as resident_bytes()).
  ResidentTier(size_t buffers, size_t n, size_t tile_elems);
  void read(size_t j, size_t offset, size_t count, float* out) override;
  void write(size_t j, size_t offset, size_t count, const float* in) override;
  size_t tile_elems() const override { return T_; }
  size_t tiles() const override { return (n_ + T_ - 1) / T_; }
  void begin_update() override {}
  std::vector<float*> acquire(size_t t) override;
  void release(size_t) override {}
  void end_update() override {}
  size_t resident_bytes() const override { return bufs_.size() * n_ * sizeof(float); }
  bool in_memory() const override { return true; }

 private:
  std::vector<AlignedBuffer>& bufs();  // allocated (zeroed) at the first call
  size_t n_, T_;
  std::vector<AlignedBuffer> bufs_;
};

}  // namespace mt::optim
