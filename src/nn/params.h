// The parameter registry: every trainable tensor of a model, by name, with its full logical shape and the
// part of it this rank holds (the shard), packed into one flat parameter buffer and one flat gradient
// buffer. Optimizers, gradient reduction and ZeRO partitioning work on those flat buffers; checkpoints and
// initialization work per tensor, in full-tensor coordinates.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "tensor/buffer.h"

namespace mt::nn {

// Which part of the full tensor this rank holds: indices [begin, end) along `axis`, or all of it (axis -1).
// With blocks > 1 the axis is read as `blocks` equal blocks and the slice is taken in each of them (a fused
// q|k|v weight split by heads: blocks = 3); the local axis is then blocks * (end - begin) long.
struct Shard {
  int axis = -1;
  int64_t begin = 0, end = 0;
  int blocks = 1;
};

struct Param {
  std::string name;
  std::vector<int64_t> full_shape;
  Shard shard;
  std::vector<int64_t> local_shape;
  size_t offset = 0;  // into the flat buffers
  size_t numel = 0;   // local element count
  bool decay = false; // weight decay applies (tensors of 2 or more dimensions)
  int group = 0;       // the model's parameter group (a layer); groups are contiguous in the flat buffers
  // One of this rank's experts (nn/moe.h, local experts only): held by the ranks at this place of every
  // expert-parallel run, so its gradient is reduced over those replicas, not over the whole data-parallel
  // group. Within a group, expert tensors come after the others.
  bool expert = false;
  float* data = nullptr;
  float* grad = nullptr;

  // Index into the full tensor of local element i (row-major in both).
  int64_t full_index(size_t i) const;
};

class ParamRegistry {
 public:
  // Declares a parameter; buffers exist only after finalize().
  Param& add(const std::string& name, std::vector<int64_t> full_shape, Shard shard = {}, int group = 0);
  // Allocates the flat buffers (zeroed) and points every Param at its slice. ZeRO leaves out the full
  // parameter buffer (stage 3) or gradient buffer (stages 2, 3) and binds the pointers itself.
  void finalize(bool allocate_data = true, bool allocate_grad = true);
  // Number of groups (max group + 1).
  int num_groups() const;

  bool finalized() const { return finalized_; }
  std::deque<Param>& params() { return params_; }
  const std::deque<Param>& params() const { return params_; }
  Param* find(const std::string& name);
  Param& get(const std::string& name);
  const Param& get(const std::string& name) const;

  float* data() { return data_.data(); }
  float* grad() { return grad_.data(); }
  size_t size() const { return total_; }
  void zero_grad() { grad_.zero(); }

  // Initializers, drawn per element from the counter-based generator keyed by (seed, name, full index), so
  // any shard draws exactly its part of the full tensor.
  void init_normal(const std::string& name, uint64_t seed, float stddev);
  void init_constant(const std::string& name, float value);

 private:
  std::deque<Param> params_;  // deque: Param addresses stay valid as more are added
  std::map<std::string, size_t> index_;
  AlignedBuffer data_, grad_;
  size_t total_ = 0;
  bool finalized_ = false;
};

}  // namespace mt::nn
