// The optimizer's state behind one interface: buffers declared by name and shape. A flat buffer holds one
// float per parameter element this rank updates, indexed like the gradients (segments' state offsets): what
// ZeRO shards and checkpoints gather into whole tensors. Any other shape (Adafactor's row and column means)
// is a factored buffer, which the optimizer indexes itself and which files hold once, under its declared name and
// shape (train/consolidate.h says which rank's copy). Checkpoints
// (train/consolidate.h), the summary's memory figures and Local SGD's state averaging reach the state
// through the store, never through an optimizer's members; a tier behind it (offload) is the store's
// business.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "tensor/buffer.h"

namespace mt::optim {

class StateStore {
 public:
  struct Buffer {
    std::string name;
    std::vector<int64_t> shape;  // flat: {n}
    bool flat = true;
    AlignedBuffer data;
  };
  // A flat buffer of n floats, zeroed; returns its index.
  size_t declare_flat(const std::string& name, size_t n);
  // A factored buffer of the given shape, zeroed; returns its index.
  size_t declare(const std::string& name, std::vector<int64_t> shape);

  size_t count() const { return buffers_.size(); }
  const Buffer& at(size_t k) const { return buffers_[k]; }
  float* data(size_t k) { return buffers_[k].data.data(); }
  size_t size(size_t k) const { return buffers_[k].data.size(); }
  size_t bytes() const;
  // The flat buffers' indices in declaration order (what checkpoints hold, and their order in files).
  std::vector<size_t> flat() const;
  // The factored buffers' indices in declaration order. A factored buffer's name says what it holds: ranks that
  // declare the same name hold the same values (whole-tensor statistics, reduced over the groups that split the
  // tensor before the update), so files keep one copy; a per-shard buffer takes a per-shard name.
  std::vector<size_t> factored() const;

 private:
  std::deque<Buffer> buffers_;  // deque: a buffer stays where it is as more are declared
};

}  // namespace mt::optim
