// An optimizer whose flat state lives in a tier (state_store.h's StateTier; offload/state_swapper.h: a file
// under --offload-dir): step() walks the state tile by tile and runs the wrapped optimizer on each tile's
// part of the segments, the tier reading the next tiles ahead and writing the last ones behind.
//
// Exactness: a segment cut at tile boundaries becomes pieces whose param, grad, state and offset move by the
// same amount, the way ZeRO's shards already cut tensors; an optimizer whose step updates each element from
// that element's parameter, gradient, state, the step's scalars and the statistics phase's whole-tensor sums
// (AdamW, SGD) gives the same bits on the pieces as on the whole. The clipping scale (scale_next_grads) and
// the statistics phase's sums are handed to every tile's call.
#pragma once

#include <functional>
#include <memory>
#include <utility>

#include "optim/optimizer.h"

namespace mt::optim {

// Where a tile's parameters and gradients come from when the store keeps them outside memory too (--offload
// params, --offload grads: parallel/data/zero_stage.cpp's stage 3). They are laid out as the state (a segment's
// param and grad offsets equal its state offset); open(t, lo, hi) returns elements [lo, hi) of each, valid
// until close(t, lo, hi), which writes the updated parameters back. Tiles are opened in order 0, 1, ... (or in
// descending order: descending())
class TileSource {
 public:
  virtual ~TileSource() = default;
  virtual void begin(size_t tile_elems, size_t n) = 0;
  virtual std::pair<float*, const float*> open(size_t t, size_t lo, size_t hi) = 0;
  virtual void close(size_t t, size_t lo, size_t hi) = 0;
  virtual void end() = 0;
  // False when the source brings the gradients alone (ZeRO 2's gradient shard from a file): open() then returns
  // the caller's whole parameter buffer, reached at the segments' own param offsets.
  virtual bool params_as_state() const { return true; }
  // True: the tiles are opened in descending order (tiles - 1, ..., 0), the tier reading ahead in that order
  // (StateTier::set_descending); the update is the same.
  virtual bool descending() const { return false; }
};

class TiledOptimizer final : public Optimizer {
 public:
  // inner's store must have its tier attached, with at least one flat buffer.
  explicit TiledOptimizer(std::unique_ptr<Optimizer> inner);
  void step(float* params, const float* grads, const std::vector<Segment>& segments, float lr,
            int64_t step) override;
  // The same update with each tile's parameters and gradients from src (segments' grads laid out as the state,
  // and their params too unless src says otherwise).
  void step_from(TileSource& src, const std::vector<Segment>& segments, float lr, int64_t step);
  StateStore& state() override { return inner_->state(); }
  const StateStore& state() const override { return inner_->state(); }
  int stat_rounds() const override { return inner_->stat_rounds(); }
  size_t stat_count(int round, const nn::Param& p) const override { return inner_->stat_count(round, p); }
  PieceSums piece_sums(int round, int64_t step) override { return inner_->piece_sums(round, step); }
  void set_tensor_sums(int round, TensorSums sums) override { inner_->set_tensor_sums(round, std::move(sums)); }

  // The pieces of `segments` that fall in state elements [lo, hi), state offsets made relative to lo.
  static void cut(const std::vector<Segment>& segments, size_t lo, size_t hi, std::vector<Segment>& out);

 private:
  // Every tile in order: acquire its state, tile_step(t, lo, hi) on tile_ (the cut segments), release it.
  void run(const std::vector<Segment>& segments, TileSource* src,
           const std::function<void(size_t, size_t, size_t)>& tile_step);
  std::unique_ptr<Optimizer> inner_;
  std::vector<Segment> tile_;
};

}  // namespace mt::optim
