// Optimizers over flat buffers. The parameter registry packs every tensor into one flat buffer; an
// optimizer sees that buffer as a list of segments (a tensor, or the part of it a ZeRO shard owns), each
// with its weight-decay flag. State buffers are flat too, indexed like the parameters, so sharding the
// optimizer is slicing the same buffers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/params.h"
#include "optim/state_store.h"
#include "tensor/buffer.h"

namespace mt::optim {

// A run of `count` elements: parameters at params[param ...], gradients at grads[grad ...], optimizer state
// at [state ...]. Without ZeRO all three are the flat-buffer offset; under ZeRO the state is this rank's
// compact shard, the gradients are the full buffer (stage 1) or the shard (2, 3), and the parameters the
// full buffer (1, 2) or the shard (3).
struct Segment {
  size_t param = 0;
  size_t grad = 0;
  size_t state = 0;
  size_t count = 0;
  bool decay = false;
  int tensor = -1;                      // index of the parameter in the registry (for per-tensor statistics)
  size_t offset = 0;                    // the piece's first element within the tensor's local part (row-major)
  const nn::Param* param_of = nullptr;  // the tensor: full and local shape, shard (null for hand-made pieces)
};

// A piece's part of one round of per-tensor sums (the statistics phase): adds to out[0, n), n the round's
// count for the piece's tensor, from the piece's parameters p[0, s.count) and reduced gradients g[0, s.count).
using PieceSums = std::function<void(const Segment& s, const float* p, const float* g, double* out)>;

// One round's whole-tensor sums: tensor t's (registry index) at sums[first[t], first[t + 1]).
struct TensorSums {
  std::vector<size_t> first;  // size T + 1
  std::vector<double> sums;
  const double* of(int t) const { return sums.data() + first[(size_t)t]; }
  size_t count(int t) const { return first[(size_t)t + 1] - first[(size_t)t]; }
};

// One segment per registered tensor, in registry order (all offsets the flat offset).
std::vector<Segment> segments_of(const nn::ParamRegistry& params);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Updates params[s.param + i] from grads[s.grad + i] (state at s.state + i) for every segment s, i < s.count.
  // step counts from 0.
  virtual void step(float* params, const float* grads, const std::vector<Segment>& segments, float lr,
                    int64_t step) = 0;
  // The state, declared in the store by the optimizer's constructor (state_store.h). Virtual: an optimizer
  // that wraps another (tiled_optimizer.h) answers with the wrapped one's store.
  virtual StateStore& state() { return state_; }
  virtual const StateStore& state() const { return state_; }
  // The next step() uses gradients multiplied by `factor` (float32 product, as if the buffer had been
  // scaled first) and leaves the gradient buffer as it is: global-norm clipping fused into the update, one
  // read-modify-write pass over the gradients fewer. Applies to one step, then resets to 1.
  void scale_next_grads(float factor) { grad_scale_ = factor; }

  // ---- The optional statistics phase (LAMB's per-tensor norms, Adafactor's row and column sums and then the
  // RMS of its update): before step(), for round j = 0 .. stat_rounds() - 1, the parameter store asks
  // stat_count(j, p) sums of each registry tensor p, adds up every piece it owns with piece_sums(j, step),
  // reduces them over the groups that split each tensor (dp under ZeRO, tp for tensors split there) and hands
  // the whole sums to set_tensor_sums(j, ...). A later round's pieces may read what earlier rounds were handed
  // (Adafactor's second round needs the new row and column moments). piece_sums reads the state and the
  // pending gradient scale as step() will; only step() changes parameters and state. A tensor asked for no
  // sums in a round takes no room in it. None by default. ----
  virtual int stat_rounds() const { return 0; }
  virtual size_t stat_count(int /*round*/, const nn::Param& /*p*/) const { return 0; }
  virtual PieceSums piece_sums(int /*round*/, int64_t /*step*/) { return {}; }
  virtual void set_tensor_sums(int /*round*/, TensorSums sums) { tensor_sums_ = std::move(sums); }

 protected:
  float grad_scale_ = 1.0f;
  TensorSums tensor_sums_;  // the last round's, as set_tensor_sums keeps it by default
  StateStore state_;
};

struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
};

// AdamW (Loshchilov & Hutter), decoupled decay on segments with decay = true, t = step + 1:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + wd * p)
class AdamW : public Optimizer {
 public:
  AdamW(size_t n, const AdamWConfig& cfg);
  void step(float* params, const float* grads, const std::vector<Segment>& segments, float lr, int64_t step) override;

 private:
  AdamWConfig cfg_;
  size_t m_, v_;  // flat state buffers "adamw.m", "adamw.v"
};

struct SgdConfig {
  float momentum = 0.9f, weight_decay = 0.0f;
};

// SGD with momentum (PyTorch's form): g' = g + wd p (decay segments only); buf = mu buf + g'; p -= lr buf.
class Sgd : public Optimizer {
 public:
  Sgd(size_t n, const SgdConfig& cfg);
  void step(float* params, const float* grads, const std::vector<Segment>& segments, float lr, int64_t step) override;

 private:
  SgdConfig cfg_;
  size_t buf_;                 // flat state buffer "sgd.momentum"
  std::vector<float> scaled_;  // one segment's gradients times the clipping scale, when there is one
};

// Linear warmup then cosine decay to min_lr:
//   s < W: lr (s+1)/W;   W <= s < S: min_lr + (lr - min_lr)(1 + cos(pi (s-W)/(S-W)))/2;   s >= S: min_lr.
struct LrSchedule {
  double lr = 0, min_lr = 0;
  int64_t warmup = 0, total = 0;
  float at(int64_t step) const;
};

// Global L2 norm of g[0, n) (sum of squares in double).
double global_norm(const float* g, size_t n);
// Scales g by min(1, clip / (norm + 1e-6)) when clip > 0; returns the factor applied.
float clip_by_global_norm(float* g, size_t n, double norm, double clip);

}  // namespace mt::optim
