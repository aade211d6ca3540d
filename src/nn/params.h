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

#include "nn/grad_out.h"
#include "nn/weight.h"
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

// Where copies of a tensor live besides its data-parallel replicas (which every tensor has), and what this
// rank's copy takes part in. The task that declares the model sets them from the layout (train/replicas.h);
// the gradient norm, the reductions and the whole-model files read them, never a tensor's name.
enum class CopyGroup : uint8_t {
  tp = 1,   // every tensor-parallel rank holds the whole tensor (LayerNorms, row-parallel biases)
  tie = 2,  // the first and the last pipeline stage each hold a copy (the tied embedding)
};
struct Replicas {
  uint8_t groups = 0;   // CopyGroup bits: the groups over which ranks hold copies
  bool counted = true;  // this copy counts in the global gradient norm (one copy of each element does)
  bool saved = true;    // this copy's values go into whole-model files (one copy of each element does)
  bool summed = false;  // its gradient is summed over the tie group after the backward (copies hold parts)
  bool in(CopyGroup g) const { return groups & (uint8_t)g; }
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
  Replicas replicas;
  float* data = nullptr;
  float* grad = nullptr;
  // Read by the model's matrix products (set where the model declares it; a LayerNorm's weight, a bias or the
  // position table are not). Under --precision bf16 the store then keeps a bf16 mirror of it, data16, which the
  // products read instead of rounding data themselves (ParamRegistry::enable_mirror); null: no mirror.
  bool products = false;
  const uint16_t* data16 = nullptr;
  // Read as float32 by something other than a product (a LayerNorm, a bias, the embedding lookup reading wte).
  // False only for a weight that products alone read: ZeRO 3 with the mirror gathers such a tensor in bf16
  // alone, and its data stays null while it is gathered (parallel/data/zero_stage.h).
  bool read_f32 = true;
  // What a product takes: the float32 values and the mirror (nn/weight.h).
  Weight weight() const { return {data, data16}; }
  // The gradient holds no value yet this step (ParamRegistry::begin_grads): its first writer overwrites it.
  bool grad_fresh = false;

  // Index into the full tensor of local element i (row-major in both).
  int64_t full_index(size_t i) const;
  // For a kernel that writes the whole gradient (a weight-gradient GEMM, a column sum): the destination, set
  // to overwrite if this is the step's first write. Counts as written.
  GradOut grad_out() {
    GradOut o(grad, grad_fresh);
    grad_fresh = false;
    return o;
  }
  // For code that adds to part of the gradient (an embedding's scatter): zeroed first if it holds no value yet.
  float* grad_acc() { return grad_out().accumulator(numel); }
};

class ParamRegistry {
 public:
  ParamRegistry();
  // Declares a parameter; buffers exist only after finalize().
  Param& add(const std::string& name, std::vector<int64_t> full_shape, Shard shard = {}, int group = 0);
  // Allocates the flat buffers (zeroed) and points every Param at its slice. ZeRO leaves out the full
  // parameter buffer (stage 3) or gradient buffer (stages 2, 3) and binds the pointers itself. shared_data puts
  // the flat parameters in the job's shared heap when there is one (AlignedBuffer::shared): ZeRO 1 and 2 all-gather
  // them in place, so they are the send buffer that peers read.
  void finalize(bool allocate_data = true, bool allocate_grad = true, bool shared_data = false);
  // Number of groups (max group + 1).
  int num_groups() const;

  bool finalized() const { return finalized_; }
  std::deque<Param>& params() { return params_; }
  const std::deque<Param>& params() const { return params_; }
  Param* find(const std::string& name);
  const Param* find(const std::string& name) const;
  Param& get(const std::string& name);
  const Param& get(const std::string& name) const;

  float* data() { return data_.data(); }
  float* grad() { return grad_.data(); }
  size_t size() const { return total_; }
  // Zeroes the gradient buffer (and forgets begin_grads: every write adds).
  void zero_grad();
  // Gradients of a new step (or of a fresh buffer that a ZeRO stage bound): instead of zeroing, mark the
  // tensors whose gradients lie in flat range [begin, begin + count) (all of them by default) as holding no
  // value; the first backward write of each overwrites it (GradOut), and settle_grads zeroes those that no
  // kernel wrote. With MESHTRAIN_CHECK_GRAD_WRITES=1 the marked gradients are filled with a NaN of a payload of
  // its own (additions carry it on), and settle_grads fails where it finds it: a kernel added to a gradient
  // nothing had written this step (tests set it; it costs the zeroing pass it replaces, and a scan).
  void begin_grads(size_t begin = 0, size_t count = SIZE_MAX);
  // Group g's backward is over (nn::GroupHooks calls it): zero the gradients of g that nothing wrote (an expert
  // that received no token), so every gradient holds its value before it is reduced or read.
  void settle_grads(int group);
  // Whether this registry checks (default: MESHTRAIN_CHECK_GRAD_WRITES=1; a value other than 0 or 1 throws).
  bool check_grad_writes() const { return check_; }
  void set_check_grad_writes(bool on) { check_ = on; }

  // The bf16 mirror of the tensors products read (Param::products), for --precision bf16. enable_mirror (after
  // finalize) adds a bf16 buffer beside the flat parameters and points each such tensor's data16 into it (filled
  // at once when the flat parameter buffer is allocated; else by the owner of the parameters, through
  // refresh_mirror over ranges whose tensors' data it has bound); refresh_mirror(begin, count) rounds the parameters of those tensors lying in flat
  // range [begin, begin + count) (all by default; a range may not cut a tensor) into it. Keeping it current is
  // its owner's job: the parameter store refreshes it after every change of the parameters (parallel/data).
  // Cost: 2 bytes per element of those tensors, one rounding pass over them per refresh.
  void enable_mirror();
  bool mirrored() const { return !mirror_.empty(); }
  void refresh_mirror(size_t begin = 0, size_t count = SIZE_MAX);

  // Initializers, drawn per element from the counter-based generator keyed by (seed, name, full index), so
  // any shard draws exactly its part of the full tensor.
  void init_normal(const std::string& name, uint64_t seed, float stddev);
  void init_constant(const std::string& name, float value);

 private:
  std::deque<Param> params_;  // deque: Param addresses stay valid as more are added
  std::map<std::string, size_t> index_;
  std::vector<size_t> group_first_;  // group -> index of its first parameter (size num_groups() + 1)
  AlignedBuffer data_, grad_;
  std::vector<uint16_t> mirror_;  // enable_mirror: bf16 copies, at the tensors' flat offsets
  size_t total_ = 0;
  bool finalized_ = false;
  bool check_;
};

}  // namespace mt::nn
