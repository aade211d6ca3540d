#include "parallel/data/zero_stage.h"

#include <cstring>

#include "core/error.h"

namespace mt::parallel {

// ---- What the stages share. ----

void ZeroStage::initialize(const std::function<void(nn::Param&)>& fill) {
  for (nn::Param& p : b_.params.params()) fill(p);
}

void ZeroStage::reduce_all() { MT_ASSERT(false, "reduce_all is for ZeRO 0 and 1"); }

void ZeroStage::full_params_of(const float* resident, std::vector<float>& out) {
  out.resize(b_.params.size());
  std::memcpy(out.data(), resident, sizeof(float) * b_.params.size());
}

void ZeroStage::full_state(const float* shard_state, std::vector<float>& out) {
  out.resize(b_.params.size());
  gather_shards(shard_state, out.data());
}

void ZeroStage::load_full_params_into(const float* full, float* resident) {
  std::memcpy(resident, full, sizeof(float) * b_.params.size());
}

void ZeroStage::load_full_state(const float* full, float* shard_state) { take_bucket_shards(full, shard_state); }

void ZeroStage::take_bucket_shards(const float* full, float* shard) {
  for (const Bucket* b : b_.buckets) std::memcpy(shard + b->pos, full + b->begin + b->so, sizeof(float) * b->sc);
}

void ZeroStage::gather_shards(const float* shard, float* full) {
  for (Bucket* b : b_.buckets) {
    if (!b->alone())
      b->comm->all_gather(shard + b->pos, full + b->begin, b->count, comm::DType::f32);
    else
      std::memcpy(full + b->begin, shard + b->pos, sizeof(float) * b->count);
  }
}

void ZeroStage::all_gather_params() {
  // Every rank updated its slice of each bucket; gather the slices back into the full parameters.
  std::vector<comm::Request> reqs;
  const double t0 = trace::ChromeTrace::now_us();
  for (Bucket* b : b_.buckets) {
    if (b->alone()) continue;
    float* base = b_.params.data() + b->begin;
    reqs.push_back(b->comm->iall_gather(base + b->so, base, b->count, comm::DType::f32));
  }
  if (reqs.empty()) return;
  comm::wait_all(reqs);
  if (b_.trace) b_.trace->add(trace::Track::comm, "all_gather parameters", "comm", t0, trace::ChromeTrace::now_us());
}

namespace {

// ---- Stage 0: everything replicated; all-reduce each bucket after the last micro-batch. ----
class Stage0 : public ZeroStage {
 public:
  using ZeroStage::ZeroStage;
  void allocate() override {
    b_.params.finalize(true, true);
    b_.build(false);
    segments_ = optim::segments_of(b_.params);
  }
  size_t state_size() const override { return b_.params.size(); }
  void bucket_ready(Bucket& b) override {
    if (!b_.last_micro || b.alone()) return;
    float* g = b_.params.grad() + b.begin;
    b_.reduce(b, g, g, false, nullptr);
  }
  void reduce_all() override {
    if (b_.has_experts) {  // two groups: bucket by bucket, each over its own
      for (Bucket* b : b_.buckets)
        if (!b->alone()) b_.reduce(*b, b_.params.grad() + b->begin, b_.params.grad() + b->begin, false, nullptr);
      b_.finish();
      return;
    }
    if (b_.alone()) return;
    b_.dp->all_reduce(b_.params.grad(), b_.params.grad(), b_.params.size(), comm::DType::f32, comm::ReduceOp::sum);
  }
  void for_each_owned_grad(const std::function<void(float*, size_t)>& fn) override {
    fn(b_.params.grad(), b_.params.size());
  }
  bool sharded() const override { return false; }
  void update(optim::Optimizer& opt, float lr, int64_t step) override {
    opt.step(b_.params.data(), b_.params.grad(), segments_, lr, step);
  }
  void full_state(const float* s, std::vector<float>& out) override {
    out.assign(s, s + b_.params.size());
  }
  void load_full_state(const float* full, float* s) override {
    std::memcpy(s, full, sizeof(float) * b_.params.size());
  }
};

// ---- Stage 1: optimizer state sharded; reduce-scatter in place after the last micro-batch. ----
class Stage1 : public ZeroStage {
 public:
  using ZeroStage::ZeroStage;
  void allocate() override {
    b_.params.finalize(true, true);
    shard_total_ = b_.build(false);
    segments_ = b_.shard_segments(false, false);
  }
  void bucket_ready(Bucket& b) override {
    if (!b_.last_micro || b.alone()) return;
    // In place: this rank's slice of the full gradient buffer receives the reduced slice.
    float* g = b_.params.grad() + b.begin;
    b_.reduce(b, g, g + b.so, true, nullptr);
  }
  void reduce_all() override {
    for (Bucket* b : b_.buckets) {
      if (b->alone()) continue;
      float* g = b_.params.grad() + b->begin;
      b_.reduce(*b, g, g + b->so, true, nullptr);
    }
    b_.finish();
  }
  void for_each_owned_grad(const std::function<void(float*, size_t)>& fn) override {
    for (Bucket* b : b_.buckets) fn(b_.params.grad() + b->begin + b->so, b->sc);
  }
  void update(optim::Optimizer& opt, float lr, int64_t step) override {
    opt.step(b_.params.data(), b_.params.grad(), segments_, lr, step);
    all_gather_params();
  }
};

// ---- Stage 2: gradients sharded too; every micro-batch reduce-scatters its buckets and frees them. ----
class Stage2 : public ZeroStage {
 public:
  using ZeroStage::ZeroStage;
  void allocate() override {
    b_.params.finalize(true, false);
    shard_total_ = b_.build(true);
    gshard_.resize(shard_total_);
    segments_ = b_.shard_segments(false, true);
  }
  void begin_step() override { gshard_.zero(); }
  // The previous micro-batch's buckets must be reduced and freed before they are rewritten.
  void begin_micro_batch() override { b_.finish(); }
  void before_backward(int g) override {
    for (int i : b_.group_buckets[g]) {
      Bucket& b = *b_.buckets[i];
      if (b.grad.size() == 0) {
        b.grad = b_.acquire(b.count);
        b_.bind_grad(b, b.grad.data());
        b_.params.begin_grads(b.begin, b.count);  // a recycled buffer: the first writes overwrite
      }
    }
  }
  void bucket_ready(Bucket& b) override {
    float* acc = gshard_.data() + b.pos;
    Bucket* bp = &b;
    const size_t n = b.alone() ? b.count : b.sc;  // one rank: its shard is the whole bucket
    auto accumulate = [this, bp, acc, n](const float* g) {
      for (size_t i = 0; i < n; i++) acc[i] += g[i];
      b_.bind_grad(*bp, nullptr);
      b_.give_back(bp->grad);
    };
    if (b.alone()) {  // one rank: its gradients are the reduced ones
      accumulate(b.grad.data());
      return;
    }
    b_.reduce(b, b.grad.data(), nullptr, true, accumulate);
    // At most one bucket's reduction in flight besides the one being written (and the tied embedding's,
    // whose gradient is written at both ends of the backward pass).
    while (b_.in_flight() > 1) b_.complete_oldest();
  }
  void for_each_owned_grad(const std::function<void(float*, size_t)>& fn) override {
    fn(gshard_.data(), shard_total_);
  }
  const float* grad_base() override { return gshard_.data(); }
  void update(optim::Optimizer& opt, float lr, int64_t step) override {
    opt.step(b_.params.data(), gshard_.data(), segments_, lr, step);
    all_gather_params();
  }
  size_t grad_bytes() const override { return shard_total_ * sizeof(float); }

 protected:
  AlignedBuffer gshard_;  // this rank's reduced gradient shard
};

// ---- Stage 3: parameters sharded too; a group's full parameters exist only around its use. ----
class Stage3 : public Stage2 {
 public:
  using Stage2::Stage2;
  void allocate() override {
    b_.params.finalize(false, false);
    shard_total_ = b_.build(true);
    gshard_.resize(shard_total_);
    pshard_.resize(shard_total_);
    segments_ = b_.shard_segments(true, true);
  }
  void initialize(const std::function<void(nn::Param&)>& fill) override {
    // One bucket's full tensors at a time; keep this rank's slice.
    for (Bucket* b : b_.buckets) {
      AlignedBuffer tmp(b->count);
      b_.bind_data(*b, tmp.data());
      for (nn::Param& p : b_.params.params())
        if (p.offset >= b->begin && p.offset < b->begin + b->count) fill(p);
      std::memcpy(pshard_.data() + b->pos, tmp.data() + b->so, sizeof(float) * b->sc);
      b_.bind_data(*b, nullptr);
    }
  }
  // A group is one bucket, or two (its dense tensors and its experts): each call covers all of them.
  void before_forward(int g) override {
    each(g, [&](Bucket& b) { ensure_gathered(b); });
    // Prefetch the next group in forward order while this one computes.
    if (g + 1 < (int)b_.group_buckets.size()) each(g + 1, [&](Bucket& b) { start_gather(b); });
  }
  void after_forward(int g) override {
    each(g, [&](Bucket& b) { release(b); });
  }
  void before_backward(int g) override {
    each(g, [&](Bucket& b) { ensure_gathered(b); });
    // Backward runs groups in descending order (GPT additionally opens group 0, the tied embedding, first;
    // it is gathered by then and start_gather skips it).
    if (g >= 1) each(g - 1, [&](Bucket& b) { start_gather(b); });
    Stage2::before_backward(g);
  }
  void after_backward(int g) override {
    each(g, [&](Bucket& b) { release(b); });
  }
  void release_params() override {
    for (Bucket* b : b_.buckets) {
      if (b->gather.valid()) {
        b->gather.wait();
        b->gather = comm::Request();
        b->gathered = true;
      }
      release(*b);
    }
  }
  void update(optim::Optimizer& opt, float lr, int64_t step) override {
    // A gathered copy or a prefetch in flight would hold the parameters from before this update.
    release_params();
    opt.step(pshard_.data(), gshard_.data(), segments_, lr, step);
  }
  void full_params_of(const float* resident, std::vector<float>& out) override {
    out.resize(b_.params.size());
    gather_shards(resident, out.data());
  }
  void load_full_params_into(const float* full, float* resident) override { take_bucket_shards(full, resident); }
  const float* param_base() override { return pshard_.data(); }
  size_t resident_count() const override { return shard_total_; }
  size_t param_bytes() const override { return shard_total_ * sizeof(float); }

 private:
  template <class Fn>
  void each(int g, Fn fn) {
    for (int i : b_.group_buckets[g]) fn(*b_.buckets[i]);
  }
  void start_gather(Bucket& b) {
    if (b.gathered || b.gather.valid()) return;
    if (b.data.size() != b.count) b.data = b_.acquire(b.count);
    if (!b.alone())
      b.gather = b.comm->iall_gather(pshard_.data() + b.pos, b.data.data(), b.count, comm::DType::f32);
    else
      std::memcpy(b.data.data(), pshard_.data() + b.pos, sizeof(float) * b.count);
  }
  void ensure_gathered(Bucket& b) {
    if (b.gathered) return;
    start_gather(b);
    if (b.gather.valid()) {
      b.gather.wait();
      b.gather = comm::Request();
    }
    b_.bind_data(b, b.data.data());
    b.gathered = true;
  }
  void release(Bucket& b) {
    if (!b.gathered) return;
    b_.bind_data(b, nullptr);
    b_.give_back(b.data);
    b.gathered = false;
  }
  AlignedBuffer pshard_;  // this rank's parameter shard
};

}  // namespace

std::unique_ptr<ZeroStage> make_zero_stage(int stage, BucketSet& buckets) {
  switch (stage) {
    case 0: return std::make_unique<Stage0>(buckets);
    case 1: return std::make_unique<Stage1>(buckets);
    case 2: return std::make_unique<Stage2>(buckets);
    case 3: return std::make_unique<Stage3>(buckets);
  }
  MT_ASSERT(false, "ZeRO stage ", stage);
  return nullptr;
}

}  // namespace mt::parallel
