#include "parallel/data/zero_stage.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>

#include "core/error.h"
#include "offload/shard_file.h"
#include "optim/optimizer.h"
#include "optim/tiled_optimizer.h"
#include "parallel/data/param_file.h"
#include "parallel/data/segment_norms.h"
#include "tensor/bf16.h"

namespace mt::parallel {

// ---- What the stages share. ----

void ZeroStage::initialize(const std::function<void(nn::Param&)>& fill) {
  for (nn::Param& p : b_.params.params()) fill(p);
}

void ZeroStage::visit_grad_segments(const std::function<void(size_t, const float*)>& fn) {
  const float* g = grad_base();
  for (size_t i = 0; i < segments_.size(); i++) fn(i, g + segments_[i].grad);
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

void ZeroStage::all_gather_params(float* params) {
  // Every rank updated its slice of each bucket; gather the slices back into the full parameters.
  std::vector<comm::Request> reqs;
  const double t0 = trace::ChromeTrace::now_us();
  for (Bucket* b : b_.buckets) {
    if (b->alone()) continue;
    float* base = (params ? params : b_.params.data()) + b->begin;
    reqs.push_back(b->comm->iall_gather(base + b->so, base, b->count, comm::DType::f32));
  }
  if (reqs.empty()) return;
  comm::wait_all(reqs);
  if (b_.trace) b_.trace->add(trace::Track::comm, "all_gather parameters", "comm", t0, trace::ChromeTrace::now_us());
}

namespace {

// The tiled update (optim/tiled_optimizer.h), which --offload params / grads stream their tiles through.
optim::TiledOptimizer& tiled(optim::Optimizer& opt) {
  auto* t = dynamic_cast<optim::TiledOptimizer*>(&opt);
  MT_CHECK_INPUT(t, "--offload params/grads streams the update tile by tile beside the optimizer state, which "
                    "needs an optimizer with state (adamw, or sgd with --momentum > 0)");
  return *t;
}

// n bf16 values in the job's shared heap when there is one (AlignedBuffer::shared, in float-sized storage), else
// private memory: ZeRO 3's bf16 shard, which its groups' bf16 all-gathers send and peers read with ordinary loads.
class SharedBf16 {
 public:
  void assign_zeros(size_t n) {
    buf_.resize((n + 1) / 2);
    buf_.zero();
    n_ = n;
  }
  bool empty() const { return n_ == 0; }
  uint16_t* data() { return reinterpret_cast<uint16_t*>(buf_.data()); }
  const uint16_t* data() const { return reinterpret_cast<const uint16_t*>(buf_.data()); }

 private:
  AlignedBuffer buf_ = AlignedBuffer::shared(0);
  size_t n_ = 0;
};

// ---- Stage 0: everything replicated; all-reduce each bucket after the last micro-batch. ----
class Stage0 : public ZeroStage {
 public:
  using ZeroStage::ZeroStage;
  void allocate() override {
    b_.params.finalize(!b_.opt.offload_params, !b_.opt.offload_grads);
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
    b_.params.finalize(!b_.opt.offload_params, !b_.opt.offload_grads, true);  // all_gather_params reads it
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
// --offload grads (here and in stage 3): the rank's reduced gradient shard lives in a file instead of gshard_
// (same layout); a bucket's reduce-scatter result is added to what the file holds, the norm and the clipping
// read it bucket by bucket, the update tile by tile.
class Stage2 : public ZeroStage, public SegmentNorms {
 public:
  using ZeroStage::ZeroStage;
  void allocate() override {
    b_.params.finalize(!b_.opt.offload_params, false, true);  // all_gather_params reads it
    shard_total_ = b_.build(true);
    segments_ = b_.shard_segments(false, true);
    open_grad_file();
  }
  void begin_step() override {
    gshard_.zero();
    std::fill(touched_.begin(), touched_.end(), 0);
    std::fill(normed_.begin(), normed_.end(), 0);
  }
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
    Bucket* bp = &b;
    const size_t n = b.alone() ? b.count : b.sc;  // one rank: its shard is the whole bucket
    auto accumulate = [this, bp, n](const float* g) {
      accumulate_shard(*bp, g, n);
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
    if (!gf_) return fn(gshard_.data(), shard_total_);
    settle_grads();
    std::fill(normed_.begin(), normed_.end(), 0);  // fn may change them
    for (Bucket* b : b_.buckets) {
      const size_t n = held(*b);
      AlignedBuffer buf(n + offload::kCongruentSlack);
      const size_t pad = offload::congruent_pad(buf.data(), b->pos);
      gf_->read(b->pos, n, buf.data() + pad);
      fn(buf.data() + pad, n);
      gf_->write(b->pos, n, buf.data() + pad);
    }
  }
  void visit_grad_segments(const std::function<void(size_t, const float*)>& fn) override {
    if (!gf_) return ZeroStage::visit_grad_segments(fn);
    // Bucket i + 1 read while the segments of bucket i are visited (same order, same bits).
    grad_buckets_read_ahead([&](Bucket& b, const float* g) {
      for (size_t i : seg_of_bucket_[b.index]) fn(i, g + (segments_[i].grad - b.pos));
    });
  }
  bool grad_segment_norms(std::vector<double>& norms) override {
    if (!gf_) return false;  // in memory: the norm reads gshard_ itself
    settle_grads();
    if (std::find(normed_.begin(), normed_.end(), 0) != normed_.end()) return false;
    norms = seg_norms_;
    return true;
  }
  const float* grad_base() override { return gshard_.data(); }
  void update(optim::Optimizer& opt, float lr, int64_t step) override {
    if (!gf_) {
      opt.step(b_.params.data(), gshard_.data(), segments_, lr, step);
    } else {
      settle_grads();
      tiled(opt).step_from(grad_tiles_, segments_, lr, step);
    }
    all_gather_params();
  }
  size_t grad_bytes() const override { return gf_ ? 0 : shard_total_ * sizeof(float); }
  size_t offloaded_grad_bytes() const override { return gf_ ? shard_total_ * sizeof(float) : 0; }
  std::vector<offload::ShardFile*> shard_files() override {
    if (gf_) return {gf_.get()};
    return {};
  }
  // --offload grads: the norm's read-ahead (two buffers of the largest held bucket, placed as in gshard_) and
  // GradTiles' two tiles of T = tile_bytes / 4 floats.
  size_t offload_buffer_bytes(size_t tile_bytes) const override {
    return gf_ ? read_ahead_bytes() + 2 * (tile_bytes / sizeof(float) + offload::kCongruentSlack) * sizeof(float) : 0;
  }

 protected:
  // Adds bucket b's reduced shard g[0, n) to what this rank keeps of it.
  virtual void accumulate_shard(Bucket& b, const float* g, size_t n) {
    if (gf_) {
      // What gshard_ holds at the step's first accumulation: zeros. Placed congruent with the file (no staging).
      AlignedBuffer buf(n + offload::kCongruentSlack);
      const size_t pad = offload::congruent_pad(buf.data(), b.pos);
      float* acc = buf.data() + pad;
      if (touched_[b.index]) gf_->read(b.pos, n, acc);
      for (size_t i = 0; i < n; i++) acc[i] += g[i];
      norm_segments(b, acc);
      write_grad(b.pos, n, std::move(buf), pad);
      touched_[b.index] = 1;
      return;
    }
    float* acc = gshard_.data() + b.pos;
    for (size_t i = 0; i < n; i++) acc[i] += g[i];
  }
  static size_t held(const Bucket& b) { return b.alone() ? b.count : b.sc; }

  // ---- --offload grads. ----
  // The gradient file (or gshard_ without one), and what the file's users need: per bucket whether it received
  // a gradient this step, its segments.
  void open_grad_file() {
    const DataParallelOptions& o = b_.opt;
    if (!o.offload_grads || shard_total_ == 0) {
      gshard_.resize(shard_total_);
      return;
    }
    gf_ = make_shard_file(o, "gradients", shard_total_);
    touched_.assign(b_.buckets.size(), 0);
    normed_.assign(b_.buckets.size(), 0);
    seg_norms_.assign(segments_.size(), 0.0);
    seg_of_bucket_.assign(b_.buckets.size(), {});
    for (size_t i = 0; i < segments_.size(); i++) {
      for (const Bucket* b : b_.buckets)
        if (segments_[i].state >= b->pos && segments_[i].state < b->pos + held(*b)) {
          seg_of_bucket_[b->index].push_back(i);
          break;
        }
    }
  }
  // A gradient shard's write, after the previous one finished: the copies queued stay one bucket or two, however
  // far the disk lags.
  void write_grad(size_t pos, size_t n, AlignedBuffer v, size_t pad) {
    if (last_grad_write_) gf_->wait(last_grad_write_);
    last_grad_write_ = gf_->write_owned(pos, n, std::move(v), pad);
  }
  // The norms of bucket b's segments from its gradient shard g as it is written (congruent_pad: at the place
  // modulo 64 bytes the file's read-ahead puts it), so that the global norm need not read the shard back. Valid
  // until the bucket's next write (a later accumulation recomputes them) or for_each_owned_grad.
  void norm_segments(const Bucket& b, const float* g) {
    for (size_t i : seg_of_bucket_[b.index]) seg_norms_[i] = optim::global_norm(g + (segments_[i].grad - b.pos), segments_[i].count);
    normed_[b.index] = 1;
  }
  // Each bucket's gradient shard from the file in turn, the next one read ahead into the other of two buffers
  // while fn reads this one. Each bucket lies at the same place modulo 64 bytes as in gshard_ (vectorized sums
  // split a piece alike).
  template <class Fn>
  void grad_buckets_read_ahead(Fn fn) {
    settle_grads();
    const std::vector<Bucket*>& bs = b_.buckets;
    size_t cap = 0;
    for (Bucket* b : bs) cap = std::max(cap, held(*b) + offload::kCongruentSlack);
    AlignedBuffer buf[2] = {AlignedBuffer(cap), AlignedBuffer(cap)};
    struct Drain {  // no read left filling buf when it goes (an exception from fn included)
      offload::ShardFile* f;
      ~Drain() {
        try {
          f->drain();
        } catch (...) {  // the error was or will be thrown on the caller's path
        }
      }
    } drain{gf_.get()};
    offload::ShardFile::Ticket t[2] = {0, 0};
    auto slice = [&](size_t i) { return buf[i % 2].data() + offload::congruent_pad(buf[i % 2].data(), bs[i]->pos); };
    auto queue = [&](size_t i) { t[i % 2] = gf_->read_async(bs[i]->pos, held(*bs[i]), slice(i)); };
    if (!bs.empty()) queue(0);
    for (size_t i = 0; i < bs.size(); i++) {
      if (i + 1 < bs.size()) queue(i + 1);
      gf_->wait(t[i % 2]);
      fn(*bs[i], slice(i));
    }
  }
  // grad_buckets_read_ahead's two buffers (0 without a gradient file).
  size_t read_ahead_bytes() const {
    if (!gf_) return 0;
    size_t cap = 0;
    for (const Bucket* b : b_.buckets) cap = std::max(cap, held(*b) + offload::kCongruentSlack);
    return 2 * cap * sizeof(float);
  }
  // Zeros for the buckets that received no gradient this step (gshard_ is zeroed at every step's begin).
  void settle_grads() {
    if (!gf_) return;
    for (Bucket* b : b_.buckets) {
      if (touched_[b->index]) continue;
      AlignedBuffer zeros(held(*b) + offload::kCongruentSlack);
      const size_t pad = offload::congruent_pad(zeros.data(), b->pos);
      norm_segments(*b, zeros.data() + pad);
      write_grad(b->pos, held(*b), std::move(zeros), pad);
      touched_[b->index] = 1;
    }
  }
  // The update's gradients from the file, the parameters resident (ZeRO 2: the full buffer, at the segments'
  // param offsets): tile t in buffer t % 2, the next tile read while this one is updated.
  class GradTiles final : public optim::TileSource {
   public:
    explicit GradTiles(Stage2& s) : s_(s) {}
    bool params_as_state() const override { return false; }
    void begin(size_t T, size_t n) override {
      T_ = T;
      n_ = n;
      for (AlignedBuffer& g : g_) g.resize(T + offload::kCongruentSlack);  // congruent: no staging
      queue(0);
    }
    std::pair<float*, const float*> open(size_t t, size_t lo, size_t) override {
      s_.gf_->wait(gt_[t % 2]);
      if ((t + 1) * T_ < n_) queue(t + 1);
      return {s_.b_.params.data(), at(g_[t % 2], lo)};
    }
    void close(size_t, size_t, size_t) override {}
    void end() override {
      s_.gf_->drain();
      for (AlignedBuffer& g : g_) g = AlignedBuffer();
    }

   private:
    void queue(size_t t) {
      const size_t lo = t * T_, c = std::min(n_, lo + T_) - lo;
      gt_[t % 2] = s_.gf_->read_async(lo, c, at(g_[t % 2], lo));
    }
    static float* at(AlignedBuffer& b, size_t lo) { return b.data() + offload::congruent_pad(b.data(), lo); }
    Stage2& s_;
    size_t T_ = 0, n_ = 0;
    AlignedBuffer g_[2];
    offload::ShardFile::Ticket gt_[2] = {0, 0};
  };

  AlignedBuffer gshard_;  // this rank's reduced gradient shard (empty under --offload grads)
  std::vector<char> touched_;
  std::vector<std::vector<size_t>> seg_of_bucket_;
  std::vector<double> seg_norms_;  // per segment
  std::vector<char> normed_;       // per bucket: seg_norms_ holds the norms of what its file holds
  offload::ShardFile::Ticket last_grad_write_ = 0;
  GradTiles grad_tiles_{*this};
  // Last, so destroyed first: its I/O thread stops before the buffers above go.
  std::unique_ptr<offload::ShardFile> gf_;
};

// ---- Stage 3: parameters sharded too; a group's full parameters exist only around its use. ----
class Stage3 : public Stage2 {
 public:
  using Stage2::Stage2;
  ~Stage3() override {
    stop();       // an update still running on its thread ends first (it reads the files and the tiles)
    pf_.reset();  // the files' I/O threads stop before any buffer they may fill goes
    gf_.reset();
    for (Gathered& g : gat_) {
      try {
        g.req16.wait();
      } catch (...) {
      }
    }
  }
  void allocate() override {
    b_.params.finalize(false, false);
    shard_total_ = b_.build(true);
    segments_ = b_.shard_segments(true, true);
    const DataParallelOptions& o = b_.opt;
    if (!o.offload_params || shard_total_ == 0) pshard_.resize(shard_total_);
    if (o.offload_params && shard_total_ > 0) pf_ = make_shard_file(o, "parameters", shard_total_);
    open_grad_file();
    reads_.resize(b_.buckets.size());
    const char* hold = std::getenv("MESHTRAIN_OVERLAP_HOLD");  // tests: go() below
    hold_ = o.overlap_update && hold && std::string(hold) == "1";
  }
  void enable_mirror() override {
    pshard16_.assign_zeros(shard_total_);
    plans_.assign(b_.buckets.size(), {});
    gat_.resize(b_.buckets.size());
    for (Bucket* b : b_.buckets) plan(*b, plans_[b->index]);
    refresh_mirror();
  }
  // Once per step after the update (and after initialization and loading): this rank's shard in bf16, what the
  // groups' bf16 all-gathers send.
  void refresh_mirror() override {
    if (pshard16_.empty()) return;
    if (!pf_) return to_bf16(pshard_.data(), pshard16_.data(), shard_total_);
    if (mirror_fresh_) {  // the update rounded each tile as it wrote it back
      mirror_fresh_ = false;
      return;
    }
    const size_t chunk = std::min<size_t>(shard_total_, size_t(1) << 18);
    AlignedBuffer tmp(chunk);
    for (size_t lo = 0; lo < shard_total_; lo += chunk) {
      const size_t c = std::min(chunk, shard_total_ - lo);
      pf_->read(lo, c, tmp.data());
      to_bf16(tmp.data(), pshard16_.data() + lo, c);
    }
  }
  void initialize(const std::function<void(nn::Param&)>& fill) override {
    // One bucket's full tensors at a time; keep this rank's slice.
    for (Bucket* b : b_.buckets) {
      AlignedBuffer tmp(b->count);
      b_.bind_data(*b, tmp.data());
      for (nn::Param& p : b_.params.params())
        if (p.offset >= b->begin && p.offset < b->begin + b->count) fill(p);
      if (pf_)
        pf_->write(b->pos, b->sc, tmp.data() + b->so);
      else
        std::memcpy(pshard_.data() + b->pos, tmp.data() + b->so, sizeof(float) * b->sc);
      b_.bind_data(*b, nullptr);
    }
  }
  // A group is one bucket, or two (its dense tensors and its experts): each call covers all of them.
  void before_forward(int g) override {
    if (g == 0) {
      forward_tail_ = false;
      go(true);
    }
    each(g, [&](Bucket& b) { ensure_gathered(b); });
    // Prefetch the next group in forward order while this one computes (and, offloaded, read the shard of
    // the one after it from the file).
    if (g + 1 < (int)b_.group_buckets.size()) each(g + 1, [&](Bucket& b) { start_gather(b); });
    if (g + 2 < (int)b_.group_buckets.size()) each(g + 2, [&](Bucket& b) { start_read(b); });
  }
  void after_forward(int g) override {
    const int G = (int)b_.group_buckets.size();
    // Offloaded: a group closing after the last one (GPT's tied embedding, group 0) is the one the backward opens
    // first: it stays gathered (the same values: no update comes between; update(), release_params() and the
    // weight versions release it) instead of being read back from the file and gathered again. An evaluation's
    // forward, with no backward after it, leaves it gathered for the next forward likewise.
    if (pf_ && forward_tail_ && g == 0 && g != G - 1) return;
    each(g, [&](Bucket& b) { release(b); });
    // Offloaded: the backward's first groups are the forward's last ones, gathered again at once; queue their
    // shard reads now (while the head and the loss compute) rather than on demand. The last group (g = G - 1):
    // it and the two before it (the backward's first group, GPT's final LayerNorm, is too small to cover the
    // read of the one after next that before_backward would queue).
    if (g == G - 1) {
      forward_tail_ = true;
      for (int k = G - 1; k >= std::max(0, G - 3); k--) each(k, [&](Bucket& b) { start_read(b); });
      // The optimizer tier's read-ahead of the next update's first tiles, held back at the update's end so that
      // the forward's shard reads had the disk to themselves (update() below).
      if (tier_) tier_->read_ahead();
    }
  }
  void before_backward(int g) override {
    finish_update();  // --overlap-update: the gradient shard and the optimizer are the update's until it ends
    drop_fresh();
    return_kept(true);  // (kept by a backward no update followed)
    forward_tail_ = false;
    each(g, [&](Bucket& b) { ensure_gathered(b); });
    // Backward runs groups in descending order (GPT additionally opens group 0, the tied embedding, first;
    // it is gathered by then and start_gather skips it).
    if (g >= 1) each(g - 1, [&](Bucket& b) { start_gather(b); });
    if (g >= 2) each(g - 2, [&](Bucket& b) { start_read(b); });
    Stage2::before_backward(g);
  }
  void after_backward(int g) override {
    each(g, [&](Bucket& b) {
      if (!keep_for_update(b, g)) release(b);
    });
  }
  void release_params() override {
    finish_update();
    drop_fresh();  // the update about to run (or a new version) changes the values they hold
    for (Bucket* b : b_.buckets) {
      if (b->gather.valid() || (in_bf16(*b) && gat_[b->index].w16.size() != 0)) complete(*b);
      release(*b);
      drop_read(*b);
    }
  }
  void update(optim::Optimizer& opt, float lr, int64_t step) override {
    // A gathered copy or a prefetch in flight would hold the parameters from before this update.
    release_params();
    if (!pf_ && !gf_) return opt.step(pshard_.data(), gshard_.data(), segments_, lr, step);
    settle_grads();
    if (pf_ && !tier_) {  // the forward reads the shard: the tier reads ahead after it (after_forward)
      tier_ = tiled(opt).state().tier();
      tier_->set_read_ahead_later(true);
    }
    if (overlapped()) return start_update(opt, lr, step);
    tiled(opt).step_from(tiles_, segments_, lr, step);
    mirror_fresh_ = pf_ && !pshard16_.empty();
    // The next forward opens group 0 and gathers group 1 at once: queue their shard reads now (queued after the
    // update's writes, so they return the updated values), not on demand there.
    for (int g = 0; g < std::min<int>(2, (int)b_.group_buckets.size()); g++) each(g, [&](Bucket& b) { start_read(b); });
  }
  void full_params_of(const float* resident, std::vector<float>& out) override {
    finish_update();
    out.resize(b_.params.size());
    if (resident || !pf_) return gather_shards(resident, out.data());
    AlignedBuffer tmp(shard_total_);  // a checkpoint's moment: the shard whole, once
    pf_->read(0, shard_total_, tmp.data());
    gather_shards(tmp.data(), out.data());
  }
  void load_full_params_into(const float* full, float* resident) override {
    finish_update();
    if (resident || !pf_) return take_bucket_shards(full, resident);
    release_params();  // no read of the old values in flight
    AlignedBuffer tmp(shard_total_);
    take_bucket_shards(full, tmp.data());
    pf_->write(0, shard_total_, tmp.data());
  }
  void full_state(const float* shard_state, std::vector<float>& out) override {
    finish_update();
    Stage2::full_state(shard_state, out);
  }
  void load_full_state(const float* full, float* shard_state) override {
    finish_update();
    Stage2::load_full_state(full, shard_state);
  }
  void begin_step() override {
    // --overlap-update without a gradient file: the update in flight reads gshard_, zeroed once it ends.
    if (upd_.joinable() && !gf_) {
      zero_pending_ = true;
      return;
    }
    Stage2::begin_step();
  }
  void for_each_owned_grad(const std::function<void(float*, size_t)>& fn) override {
    finish_update();
    Stage2::for_each_owned_grad(fn);
  }
  void visit_grad_segments(const std::function<void(size_t, const float*)>& fn) override {
    finish_update();
    Stage2::visit_grad_segments(fn);
  }
  bool grad_segment_norms(std::vector<double>& norms) override {
    finish_update();
    return Stage2::grad_segment_norms(norms);
  }
  void settle() override { finish_update(); }
  OverlapCounts overlap_counts() const override {
    if (!overlapped()) return {};
    return {deferred_, overlapped_, waited_s_, fresh_taken_, waited_group_s_, waited_first_s_, kept_copied_};
  }
  void stop() noexcept override {
    if (!upd_.joinable()) return;
    go(false);
    upd_.join();  // the update's own waits have deadlines: it ends
    upd_error_ = nullptr;
  }
  const float* param_base() override { return pshard_.data(); }
  size_t resident_count() const override { return shard_total_; }
  size_t param_bytes() const override {
    return shard_total_ * ((pf_ ? 0 : sizeof(float)) + (pshard16_.empty() ? 0 : 2));
  }
  size_t offloaded_param_bytes() const override { return pf_ ? shard_total_ * sizeof(float) : 0; }
  size_t offload_buffer_bytes(size_t tile_bytes) const override {
    if (!pf_ && !gf_) return 0;
    // Tiles: two buffers of T floats (and the congruent slack) per offloaded kind, T the optimizer tier's tile
    // (tile_bytes / 4: run.cpp passes the tier's own).
    const size_t T = tile_bytes / sizeof(float);
    // Three of each under --overlap-update (Tiles reads two ahead), when the shard has more than two tiles.
    const size_t nb = overlapped() && shard_total_ > 2 * T ? 3 : 2;
    size_t bytes = nb * (T + offload::kCongruentSlack) * sizeof(float) * ((pf_ ? 1 : 0) + (gf_ ? 1 : 0));
    // The update's copies of up to kFresh buckets' shards (keep_fresh), and as many kept for the next ones.
    if (overlapped()) bytes += 2 * kFresh * fresh_cap() * sizeof(float);
    return bytes + read_ahead_bytes();  // grad_buckets_read_ahead's two buffers (0 without a gradient file)
  }
  std::vector<offload::ShardFile*> shard_files() override {
    std::vector<offload::ShardFile*> v;
    if (pf_) v.push_back(pf_.get());
    if (gf_) v.push_back(gf_.get());
    return v;
  }

 private:
  // How a bucket is gathered under the mirror. Its float32 part is packed: the elements of the tensors read as
  // float32, in flat order; rank q's shard holds held[q] of them, and each rank sends m = max held[q] (its own,
  // padded), so the packed all-gather is n m floats and rank q's run lands at q m.
  struct MirrorPlan {
    bool bf16 = false;            // holds a tensor products alone read: the bucket is gathered in bf16
    std::vector<FlatRange> f32;   // bucket-relative ranges of the tensors read as float32, merged
    size_t f32_count = 0;         // their elements
    size_t m = 0;
    std::vector<size_t> held;
  };
  // The buffers of a bucket gathered in bf16 (from the pool, while gathered).
  struct Gathered {
    AlignedBuffer w16;         // the bucket's bf16 mirror, b.count values (in float-sized storage)
    AlignedBuffer send, recv;  // the packed float32 all-gather: m and n m floats
    comm::Request req16;
  };
  template <class Fn>
  void each(int g, Fn fn) {
    for (int i : b_.group_buckets[g]) fn(*b_.buckets[i]);
  }
  template <class Fn>  // fn(p) for each tensor of bucket b, in flat order
  void tensors(const Bucket& b, Fn fn) {
    for (nn::Param& p : b_.params.params())
      if (p.offset >= b.begin && p.offset < b.begin + b.count) fn(p);
  }
  // Calls fn(bucket-relative begin, count) for each piece of the float32 ranges inside [lo, lo + n).
  static void overlap(const MirrorPlan& pl, size_t lo, size_t n, const std::function<void(size_t, size_t)>& fn) {
    for (const FlatRange& f : pl.f32) {
      const size_t a = std::max(f.begin, lo), e = std::min(f.begin + f.count, lo + n);
      if (a < e) fn(a, e - a);
    }
  }
  void plan(const Bucket& b, MirrorPlan& pl) {
    tensors(b, [&](nn::Param& p) {
      if (!p.read_f32) {
        MT_ASSERT(p.products, p.name, " is read neither by products nor as float32");
        pl.bf16 = true;
        return;
      }
      const size_t at = p.offset - b.begin;
      if (!pl.f32.empty() && pl.f32.back().begin + pl.f32.back().count == at)
        pl.f32.back().count += p.numel;
      else
        pl.f32.push_back({at, p.numel});
      pl.f32_count += p.numel;
    });
    pl.held.assign(b.n, 0);
    for (int q = 0; q < b.n; q++) {
      const comm::Shard sh = comm::shard_of(b.count, b.n, q);
      overlap(pl, sh.offset, sh.count, [&](size_t, size_t c) { pl.held[q] += c; });
      pl.m = std::max(pl.m, pl.held[q]);
    }
  }
  bool in_bf16(const Bucket& b) const { return !plans_.empty() && plans_[b.index].bf16; }

  // ---- --offload params / grads. ----
  // Whether gathering b reads this rank's float32 shard (not under the mirror when b holds only products).
  bool reads_shard(const Bucket& b) const { return !in_bf16(b) || plans_[b.index].f32_count > 0; }
  // Queues the read of b's parameter shard from the file (once until it is dropped).
  void start_read(Bucket& b) {
    if (!pf_ || !reads_shard(b) || b.gathered) return;  // gathered: its values are in use already (GPT's tied
                                                         // embedding, open through the backward)
    ShardRead& r = reads_[b.index];
    if (r.queued || !updated(b)) return;  // not updated yet (--overlap-update): read when needed
    if (take_fresh(b, r)) return;          // the update's own copy of it, in memory
    r.buf = b_.acquire(held(b) + offload::kCongruentSlack);
    r.pad = offload::congruent_pad(r.buf.data(), b.pos);
    r.ticket = pf_->read_async(b.pos, held(b), r.buf.data() + r.pad);
    r.queued = true;
  }
  void drop_read(Bucket& b) {
    if (!pf_ || !reads_[b.index].queued) return;
    ShardRead& r = reads_[b.index];
    pf_->wait(r.ticket);
    if (r.fresh)
      spare_fresh(std::move(r.buf));  // the update's copy (not the pool's): kept for the next update's
    else
      b_.give_back(r.buf);
    r.queued = r.fresh = false;
  }
  // This rank's float32 shard of bucket b: resident, or read from the file (kept until drop_read).
  const float* shard_params(Bucket& b) {
    if (!pf_) return pshard_.data() + b.pos;
    wait_updated(b);
    start_read(b);
    pf_->wait(reads_[b.index].ticket);
    return reads_[b.index].buf.data() + reads_[b.index].pad;
  }
  // The tiled update's parameters and gradients from the files: tile t in buffer t % 2, the next tile read
  // while this one is updated, each tile's parameters written back (and rounded into the mirror) behind it.
  // The file's single I/O thread runs jobs in queue order, so tile t + 2's read into a buffer comes after tile
  // t's write from it. Under --overlap-update three buffers (t % 3), read two tiles ahead: the read of the tile
  // after next is queued when a tile opens, before that tile's write-back, so a tile's read waits behind the
  // write-back of the tile two before it, not of the one just before (which the next forward's groups wait for:
  // the update's disk time comes in the order the forward needs it).
  class Tiles final : public optim::TileSource {
   public:
    explicit Tiles(Stage3& s) : s_(s) {}
    bool descending() const override { return s_.overlapped(); }
    void begin(size_t T, size_t n) override {
      T_ = T;
      n_ = n;
      nt_ = (n + T - 1) / T;
      nb_ = s_.overlapped() && nt_ > 2 ? 3 : 2;
      for (int k = 0; k < nb_; k++) {  // tiles start at multiples of 4096 bytes: congruent buffers need no staging
        if (s_.pf_) p_[k].resize(T + offload::kCongruentSlack);
        if (s_.gf_) g_[k].resize(T + offload::kCongruentSlack);
      }
      s_.tile_elems_ = T;
      kept_open_ = !s_.kept_.empty();
      for (auto& w : wt_) w = 0;
      for (size_t k = 0; k + 1 < (size_t)nb_ && k < nt_; k++) queue(tile_at(k));
    }
    std::pair<float*, const float*> open(size_t t, size_t lo, size_t) override {
      if (s_.pf_) s_.pf_->wait(pt_[t % nb_]);
      if (s_.gf_) s_.gf_->wait(gt_[t % nb_]);
      const size_t k = tile_at(t);  // the order is its own inverse
      if (k + nb_ - 1 < nt_) queue(tile_at(k + nb_ - 1));
      float* p = s_.pf_ ? at(p_[t % nb_], lo) : s_.pshard_.data() + lo;
      const float* g = s_.gf_ ? at(g_[t % nb_], lo) : s_.gshard_.data() + lo;
      return {p, g};
    }
    void close(size_t t, size_t lo, size_t hi) override {
      if (!s_.pf_) return;
      done(at(p_[t % nb_], lo), lo, hi);
    }
    void end() override {
      kept_open_ = false;
      if (s_.pf_) s_.pf_->drain();
      if (s_.gf_) s_.gf_->drain();
      for (int k = 0; k < 3; k++) {
        p_[k] = AlignedBuffer();
        g_[k] = AlignedBuffer();
      }
    }

   private:
    // Elements [lo, hi) of the shard, updated at p: written back and rounded into the mirror; with
    // --overlap-update kept for the forward and published: [lo, n) is updated in the mirror and, for a read
    // queued from now on, in the file (the tiles come from the top down).
    void done(const float* p, size_t lo, size_t hi) {
      wt_[buf_of(lo)] = s_.pf_->write_async(lo, hi - lo, p);
      if (!s_.pshard16_.empty()) to_bf16(p, s_.pshard16_.data() + lo, hi - lo);
      if (s_.overlapped()) {
        s_.keep_fresh(lo, hi, p);
        s_.publish(lo);
      }
    }
    void queue(size_t t) {
      const size_t lo = t * T_, c = std::min(n_, lo + T_) - lo;
      bool copied = false;
      if (kept_open_ && s_.pf_) {
        if (s_.covered_by_kept(lo, c)) {  // the backward's copy of the tile's parameters: nothing to read
          s_.pf_->wait(wt_[t % nb_]);      // the write-back from this buffer first (a read would queue behind it)
          s_.copy_kept(lo, c, at(p_[t % nb_], lo));
          pt_[t % nb_] = 0;
          copied = true;
        }
        s_.kept_passed(lo);
      }
      if (!copied && s_.pf_) pt_[t % nb_] = s_.pf_->read_async(lo, c, at(p_[t % nb_], lo));
      if (kept_open_ && (lo <= s_.kept_lo_ || !descending())) kept_open_ = false;  // past the kept buffers
      if (s_.gf_) gt_[t % nb_] = s_.gf_->read_async(lo, c, at(g_[t % nb_], lo));
    }
    static float* at(AlignedBuffer& b, size_t lo) { return b.data() + offload::congruent_pad(b.data(), lo); }
    size_t buf_of(size_t lo) const { return lo / T_ % nb_; }  // the buffer of the tile holding element lo
    size_t tile_at(size_t k) const { return descending() ? nt_ - 1 - k : k; }  // the k-th tile opened
    Stage3& s_;
    size_t T_ = 0, n_ = 0, nt_ = 0;
    // nb_ buffers of each: 2, or 3 under --overlap-update (reads two tiles ahead: see the class comment).
    int nb_ = 2;
    AlignedBuffer p_[3], g_[3];
    offload::ShardFile::Ticket pt_[3] = {0, 0, 0}, gt_[3] = {0, 0, 0};
    offload::ShardFile::Ticket wt_[3] = {0, 0, 0};  // per buffer: the last write-back queued from it
    bool kept_open_ = false;  // the backward's kept buffers are this update's to copy from (Stage3::kept_)
  };
  struct ShardRead {
    AlignedBuffer buf;
    size_t pad = 0;  // the shard at buf.data() + pad (offload::congruent_pad)
    offload::ShardFile::Ticket ticket = 0;
    bool queued = false;
    bool fresh = false;  // buf is the overlapped update's copy (take_fresh), nothing read
  };

  void start_gather(Bucket& b) {
    if (b.gathered || b.gather.valid() || !updated(b)) return;  // a prefetch waits for nothing
    if (in_bf16(b)) return start_gather16(b);
    if (b.data.size() != b.count) b.data = b_.acquire(b.count);
    const float* mine = shard_params(b);
    if (!b.alone())
      b.gather = b.comm->iall_gather(mine, b.data.data(), b.count, comm::DType::f32);
    else
      std::memcpy(b.data.data(), mine, sizeof(float) * b.count);
  }
  void start_gather16(Bucket& b) {
    const MirrorPlan& pl = plans_[b.index];
    Gathered& g = gat_[b.index];
    if (g.req16.valid() || g.w16.size() != 0) return;  // in flight, or gathered alone
    g.w16 = b_.acquire((b.count + 1) / 2);
    uint16_t* w16 = reinterpret_cast<uint16_t*>(g.w16.data());
    if (!b.alone())
      g.req16 = b.comm->iall_gather(pshard16_.data() + b.pos, w16, b.count, comm::DType::bf16);
    else
      std::memcpy(w16, pshard16_.data() + b.pos, sizeof(uint16_t) * b.count);
    if (pl.f32_count == 0) return;
    b.data = b_.acquire(pl.f32_count);
    const float* mine = shard_params(b);  // this rank's shard of the bucket: [b.so, b.so + b.sc)
    if (b.alone()) {  // the shard is the whole bucket: pack it directly
      size_t k = 0;
      overlap(pl, 0, b.count, [&](size_t a, size_t c) {
        std::memcpy(b.data.data() + k, mine + a, sizeof(float) * c);
        k += c;
      });
      return;
    }
    g.send = b_.acquire(pl.m);
    g.recv = b_.acquire(pl.m * b.n);
    size_t k = 0;
    overlap(pl, b.so, b.sc, [&](size_t a, size_t c) {
      std::memcpy(g.send.data() + k, mine + (a - b.so), sizeof(float) * c);
      k += c;
    });
    std::fill(g.send.data() + k, g.send.data() + pl.m, 0.0f);
    b.gather = b.comm->iall_gather(g.send.data(), g.recv.data(), pl.m * b.n, comm::DType::f32);
  }
  // Waits for b's gathers; under the mirror, unpacks the float32 part: rank q's run, at q m in the receive
  // buffer, is the next held[q] elements in flat order.
  void complete(Bucket& b) {
    if (in_bf16(b)) {
      Gathered& g = gat_[b.index];
      if (g.req16.valid()) {
        g.req16.wait();
        g.req16 = comm::Request();
      }
      if (b.gather.valid()) {
        b.gather.wait();
        b.gather = comm::Request();
        const MirrorPlan& pl = plans_[b.index];
        size_t k = 0;
        for (int q = 0; q < b.n; q++) {
          std::memcpy(b.data.data() + k, g.recv.data() + (size_t)q * pl.m, sizeof(float) * pl.held[q]);
          k += pl.held[q];
        }
        b_.give_back(g.send);
        b_.give_back(g.recv);
      }
    } else if (b.gather.valid()) {
      b.gather.wait();
      b.gather = comm::Request();
    }
    drop_read(b);  // the all-gather has sent it
    b.gathered = true;
  }
  void ensure_gathered(Bucket& b) {
    if (b.gathered) return;
    wait_updated(b);
    start_gather(b);
    complete(b);
    if (!in_bf16(b)) return b_.bind_data(b, b.data.data());
    // Product-only tensors: the mirror alone. Tensors read as float32: their place in the packed part.
    const uint16_t* w16 = reinterpret_cast<const uint16_t*>(gat_[b.index].w16.data());
    size_t k = 0;
    tensors(b, [&](nn::Param& p) {
      p.data16 = p.products ? w16 + (p.offset - b.begin) : nullptr;
      p.data = p.read_f32 ? b.data.data() + k : nullptr;
      if (p.read_f32) k += p.numel;
    });
  }
  void release(Bucket& b) {
    if (!b.gathered) return;
    b_.bind_data(b, nullptr);
    b_.give_back(b.data);
    if (in_bf16(b)) {
      tensors(b, [](nn::Param& p) { p.data16 = nullptr; });
      b_.give_back(gat_[b.index].w16);
    }
    b.gathered = false;
  }
  // ---- --overlap-update: the update's first tiles from the backward's last gathers. The backward ends with the
  // forward's first groups (GPT's tied embedding last), whose shards lie at the shard's end, where the descending
  // update starts. At the step's last micro-batch, a bucket gathered in float32 keeps its gathered buffer when the
  // backward releases it (the values the file holds: no update has come since its gather) if every group below
  // it is gathered already (so the backward asks the pool for no buffer after this: the pool does not grow) and
  // its shard meets the update's first kKeptTiles tiles. Tiles::queue copies a tile wholly covered by kept shards
  // instead of reading it from the file, so the first groups' update does not wait for those reads (GPT: the
  // embedding and block 0 cover tiles 4 and 3 at width 384, tiles 8 to 5 at 512). Each buffer goes back to the
  // pool once the update has queued the tile at its start (the later tiles lie below it), which is before that
  // bucket's own update is published, so before any gather of the next forward waits for it; the rest at
  // finish_update. ----
  static constexpr size_t kKeptTiles = 4;
  struct Kept {
    Bucket* b;
    AlignedBuffer buf;
    bool done = false;  // the update reads it no more (under upd_mu_)
  };
  bool keep_for_update(Bucket& b, int g) {
    if (!overlapped() || !b_.last_micro || !b.gathered || in_bf16(b) || tile_elems_ == 0 || held(b) == 0) return false;
    const size_t nt = (shard_total_ + tile_elems_ - 1) / tile_elems_;
    const size_t first = nt > kKeptTiles ? (nt - kKeptTiles) * tile_elems_ : 0;  // the update's first tiles: [first, n)
    if (b.pos + held(b) <= first) return false;
    for (int h = 0; h < g; h++)
      for (int i : b_.group_buckets[h])
        if (!b_.buckets[i]->gathered) return false;  // gathered later in this backward, from the pool
    kept_lo_ = kept_.empty() ? b.pos : std::min(kept_lo_, b.pos);
    b_.bind_data(b, nullptr);
    kept_.push_back({&b, std::move(b.data)});
    b.data = AlignedBuffer();
    b.gathered = false;
    return true;
  }
  // Tiles::queue (the update's thread): whether the kept buffers cover [lo, lo + c) of the shard, and the copy.
  // kept_ is not resized while the update runs; the main thread takes a buffer only once it is done.
  bool covered_by_kept(size_t lo, size_t c) const {
    size_t covered = 0;
    for (const Kept& k : kept_) {
      const size_t a = std::max(lo, k.b->pos), e = std::min(lo + c, k.b->pos + held(*k.b));
      if (a < e) covered += e - a;
    }
    return covered == c;
  }
  void copy_kept(size_t lo, size_t c, float* out) {
    for (const Kept& k : kept_) {
      const size_t a = std::max(lo, k.b->pos), e = std::min(lo + c, k.b->pos + held(*k.b));
      if (a >= e) continue;
      const float* shard = k.buf.data() + (k.b->alone() ? 0 : k.b->so);  // this rank's part of the bucket
      std::memcpy(out + (a - lo), shard + (a - k.b->pos), sizeof(float) * (e - a));
    }
    kept_copied_ += c;
  }
  // A tile at lo queued: the buffers at or above lo are done (no later tile meets them).
  void kept_passed(size_t lo) {
    std::lock_guard<std::mutex> lk(upd_mu_);
    for (Kept& k : kept_)
      if (k.b->pos >= lo) k.done = true;
  }
  // The kept buffers the update is done with back to the pool (main thread; all of them once it ended).
  void return_kept(bool all = false) {
    if (kept_.empty()) return;
    {
      std::lock_guard<std::mutex> lk(upd_mu_);
      for (Kept& k : kept_)
        if ((all || k.done) && k.buf.size() != 0) b_.give_back(k.buf);
    }
    if (all) kept_.clear();
  }

  // ---- --overlap-update (DataParallelOptions::overlap_update, with --offload params): the exact update on a
  // thread of its own, overlapping the next step's forward. update() hands the tiled update to upd_ and
  // returns. Its tiles run in descending order: buckets are packed in backward order, so the shards of the
  // forward's first groups lie last in the shard and are updated first. Tile [lo, hi)'s close() queues its
  // write-back to the parameter file and rounds it into the mirror, then publishes upd_lo_ = lo: elements from
  // lo on are updated for any read queued from then on (the file's one I/O thread runs jobs in queue order) and
  // in the mirror. A gather of bucket b waits until its shard [b.pos, b.pos + held) lies at or above upd_lo_
  // (wait_updated; a prefetch of a bucket not yet updated is skipped: updated()). The rest of the step waits
  // for the whole update (finish_update): the first backward (the gradient shard, which the update reads, is
  // written there; the next norm sets the optimizer's clipping scale), the next update, consolidation and
  // settle() (evaluation, checkpoints, the run's end). Every wait has the files' deadline.
  bool overlapped() const { return b_.opt.overlap_update && pf_ != nullptr; }
  void start_update(optim::Optimizer& opt, float lr, int64_t step) {
    {
      std::lock_guard<std::mutex> lk(upd_mu_);
      upd_lo_ = shard_total_;
      upd_running_ = true;
      upd_error_ = nullptr;
      upd_go_ = !hold_;
      fresh_.clear();
      fresh_.resize(b_.buckets.size());
      fresh_held_ = 0;
    }
    mirror_fresh_ = !pshard16_.empty();  // each tile is rounded into the mirror as it is written back
    deferred_++;
    first_wait_ = true;
    const int threads = omp_get_max_threads();
    upd_ = std::thread([this, &opt, lr, step, threads] {
      omp_set_num_threads(threads);
      std::exception_ptr e;
      try {
        if (hold_) wait_update_for("start", [&] { return upd_go_; }, false);
        tiled(opt).step_from(tiles_, segments_, lr, step);
      } catch (...) {
        e = std::current_exception();
      }
      std::lock_guard<std::mutex> lk(upd_mu_);
      upd_error_ = e;
      upd_running_ = false;
      upd_cv_.notify_all();
    });
  }
  // Hold (tests: MESHTRAIN_OVERLAP_HOLD=1): the update starts only once the next step's forward has begun or
  // something waits for it, so that it runs alongside the forward however fast it is; overlapped_ counts the
  // updates the forward released.
  void go(bool by_forward) {
    if (!upd_.joinable()) return;
    std::lock_guard<std::mutex> lk(upd_mu_);
    if (upd_go_) return;
    upd_go_ = true;
    if (by_forward) overlapped_++;
    upd_cv_.notify_all();
  }
  // The update's copy of a bucket's updated shard, so that the next forward need not read it back from the file
  // behind the update's own I/O: close() of tile [lo, hi) (p: its updated parameters) copies the part of each
  // bucket in it into the bucket's fresh buffer, placed as a read would be (congruent_pad). At most kFresh buckets
  // are held at once (memory: offload_buffer_bytes); a bucket that finds none free is read from the file as
  // without the overlap. The buffers are the worker's until publish() makes the bucket's range updated; start_read
  // then takes a whole one (take_fresh); finish_update drops the rest.
  static constexpr int kFresh = 3;
  struct Fresh {
    AlignedBuffer buf;
    size_t pad = 0, filled = 0;
    enum { none, filling, skipped, taken } state = none;
  };
  void keep_fresh(size_t lo, size_t hi, const float* p) {
    for (Bucket* b : b_.buckets) {
      const size_t h = held(*b), a = std::max(lo, b->pos), e = std::min(hi, b->pos + h);
      if (a >= e || !reads_shard(*b)) continue;
      Fresh& f = fresh_[b->index];
      if (f.state == Fresh::none) {
        std::lock_guard<std::mutex> lk(upd_mu_);
        if (fresh_held_ >= kFresh) {
          f.state = Fresh::skipped;
          continue;
        }
        fresh_held_++;
        f.state = Fresh::filling;
        if (!fresh_spare_.empty()) {  // one of the earlier steps' buffers (all of fresh_cap() floats)
          f.buf = std::move(fresh_spare_.back());
          fresh_spare_.pop_back();
        }
      }
      if (f.state != Fresh::filling) continue;
      if (f.buf.size() == 0) f.buf = AlignedBuffer::shared(fresh_cap());  // a gather's send buffer
      f.pad = offload::congruent_pad(f.buf.data(), b->pos);
      std::memcpy(f.buf.data() + f.pad + (a - b->pos), p + (a - lo), sizeof(float) * (e - a));
      f.filled += e - a;
    }
  }
  size_t fresh_cap() const {  // floats of every kept copy's buffer: the largest bucket shard, placed congruent
    size_t cap = 0;
    for (const Bucket* b : b_.buckets) cap = std::max(cap, held(*b) + offload::kCongruentSlack);
    return cap;
  }
  // A copy's buffer back (taken and used, or not taken): up to kFresh of them are kept for the next updates
  // (no fresh allocation, page faults and zeroing on the update's thread each step).
  void spare_fresh(AlignedBuffer buf) {
    if (buf.size() == 0) return;
    std::lock_guard<std::mutex> lk(upd_mu_);
    if ((int)fresh_spare_.size() < kFresh) fresh_spare_.push_back(std::move(buf));
  }
  bool take_fresh(Bucket& b, ShardRead& r) {
    std::lock_guard<std::mutex> lk(upd_mu_);
    if (fresh_.empty()) return false;
    Fresh& f = fresh_[b.index];
    // updated(b) held: every tile over b has closed, so a filling buffer is whole.
    if (f.state != Fresh::filling || f.filled != held(b)) return false;
    r.buf = std::move(f.buf);
    r.pad = f.pad;
    r.ticket = 0;
    r.queued = r.fresh = true;
    f.state = Fresh::taken;
    fresh_held_--;
    fresh_taken_++;
    return true;
  }
  // The kept copies no group took (release_params, the backward's start): the file from now on.
  void drop_fresh() {
    for (Fresh& f : fresh_) spare_fresh(std::move(f.buf));
    fresh_.clear();
    fresh_held_ = 0;
  }
  void publish(size_t lo) {
    std::lock_guard<std::mutex> lk(upd_mu_);
    upd_lo_ = lo;
    upd_cv_.notify_all();
  }
  // Whether bucket b's shard holds this step's update (always, with no update in flight; never after a failed
  // one, whose error finish_update throws).
  bool updated(const Bucket& b) {
    return_kept();
    if (!upd_.joinable()) return true;
    std::lock_guard<std::mutex> lk(upd_mu_);
    return upd_running_ ? upd_lo_ <= b.pos : !upd_error_;
  }
  template <class Pred>
  void wait_update_for(const char* what, Pred pred, bool main = true) {  // main: the main thread's (timed)
    const double t = b_.opt.offload_timeout_s;
    const double limit_s = std::isfinite(t) && t > 0 ? std::min(t, 604800.0) : 604800.0;
    std::unique_lock<std::mutex> lk(upd_mu_);
    if (pred()) return;
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = upd_cv_.wait_for(lk, std::chrono::duration<double>(limit_s), pred);
    if (main) waited_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!ok)
      throw Error(str("offload: the overlapped update (--overlap-update) did not ", what, " within ", t,
                      " s (--offload-dir ", b_.opt.offload_dir, "; is the disk stalled?)"));
  }
  void wait_updated(const Bucket& b) {
    if (!upd_.joinable()) return;
    go(false);
    return_kept();
    const double w0 = waited_s_;
    wait_update_for("reach the shard of a gathered group", [&] { return !upd_running_ || upd_lo_ <= b.pos; });
    waited_group_s_ += waited_s_ - w0;
    if (std::exchange(first_wait_, false)) waited_first_s_ += waited_s_ - w0;
    bool running;
    {
      std::lock_guard<std::mutex> lk(upd_mu_);
      running = upd_running_;
    }
    if (!running) finish_update();  // its error, if any, here
  }
  void finish_update() {
    if (!upd_.joinable()) return;
    go(false);
    wait_update_for("finish", [&] { return !upd_running_; });
    upd_.join();
    return_kept(true);
    // Whole copies no forward took yet stay for the groups still to gather (take_fresh: the file holds the same
    // values until the next update, whose release_params() drops them, as does the backward); the rest go.
    fresh_held_ = 0;
    for (size_t i = 0; i < fresh_.size(); i++) {
      Fresh& f = fresh_[i];
      if (!upd_error_ && f.state == Fresh::filling && f.filled == held(*b_.buckets[i])) {
        fresh_held_++;
        continue;
      }
      spare_fresh(std::move(f.buf));
      f.state = Fresh::none;
    }
    if (zero_pending_) {  // begin_step's zeroing of the gradient shard the update read
      gshard_.zero();
      zero_pending_ = false;
    }
    if (upd_error_) std::rethrow_exception(std::exchange(upd_error_, nullptr));
  }
  std::vector<Kept> kept_;   // the backward's gathered buffers kept for the update's first tiles
  size_t kept_lo_ = 0;       // the lowest shard position among them
  size_t tile_elems_ = 0;    // the update's tile (elements), once an update has run
  int64_t kept_copied_ = 0;  // shard elements the updates took from kept buffers instead of the file
  std::thread upd_;
  std::mutex upd_mu_;
  std::condition_variable upd_cv_;
  size_t upd_lo_ = 0;         // while upd_running_: shard elements [upd_lo_, shard_total_) are updated
  bool upd_running_ = false;
  std::exception_ptr upd_error_;
  bool zero_pending_ = false;
  bool hold_ = false, upd_go_ = true;
  int64_t deferred_ = 0, overlapped_ = 0;
  double waited_s_ = 0;  // the main thread's waits for the update (a group's shard, or all of it)
  double waited_group_s_ = 0, waited_first_s_ = 0;  // of those: for a group's shard; the first such after a start
  bool first_wait_ = false;  // no group has waited for the update started last
  std::vector<Fresh> fresh_;  // per bucket (keep_fresh)
  std::vector<AlignedBuffer> fresh_spare_;  // buffers for the next copies (spare_fresh)
  int fresh_held_ = 0;        // buffers filling or whole, not yet taken
  int64_t fresh_taken_ = 0;   // shards a forward took from the update's copy instead of the file

  // This rank's parameter shard: the send buffer of its buckets' float32 all-gathers, so in the shared heap.
  AlignedBuffer pshard_ = AlignedBuffer::shared(0);
  // Under the mirror: pshard_ in bf16 (the bf16 all-gathers' send buffer, in the shared heap too), each bucket's
  // plan and gather buffers (empty without the mirror).
  SharedBf16 pshard16_;
  std::vector<MirrorPlan> plans_;
  std::vector<Gathered> gat_;
  // --offload params / grads: per bucket its shard read in flight; the update's tile source; whether the
  // update already rounded the mirror.
  std::vector<ShardRead> reads_;
  Tiles tiles_{*this};
  bool mirror_fresh_ = false;
  optim::StateTier* tier_ = nullptr;  // the optimizer's tier, once an update has run with the shard in a file
  bool forward_tail_ = false;  // the forward's last group has closed, the backward has not begun
  // Stopped first (~Stage3): its I/O thread before the buffers above go.
  std::unique_ptr<offload::ShardFile> pf_;
};

// A stage whose reduced gradient is in a file laid out as its grad offsets (GradsInFile below), for the update
// of a stage that also streams its parameters (ParamsInFile).
struct GradFileSource {
  virtual ~GradFileSource() = default;
  virtual offload::ShardFile* grad_file() = 0;
  virtual void settle_grad_file() = 0;
};

// ---- --offload grads at stages 0 and 1: the full gradient in a file (the registry keeps no flat gradient
// buffer). Around each group's backward the group's gradient is bound to a slot of the largest group's size:
// at the step's first micro-batch marked fresh (the first writes overwrite, as in memory), later read back from
// the file so the kernels add to the sum so far, exactly as they add to the resident buffer; after the group's
// backward the slot is written back. After the last micro-batch each bucket is read, reduced in place as the
// stage does in memory (all-reduce; ZeRO 1: reduce-scatter into this rank's slice) and written back; the norm
// and the clipping read it bucket by bucket (each piece at the same address modulo 64 bytes as in memory), the
// update tile by tile. A group holding a tensor whose copies are summed over the tie group after the backward
// (nn::Replicas::summed: GPT's tied embedding under a pipeline) stays bound through the step, so that sum
// reaches it in memory; it is written to the file when its bucket is reduced, or before the gradient is read.
// Needs the hooks at every stage (parallel::needs_hooks). ----
template <class Base>
class GradsInFile : public Base, public GradFileSource {
 public:
  using Base::Base;
  ~GradsInFile() override {
    try {
      this->b_.quiesce();  // no reduction left filling a bucket buffer
      if (gf_) gf_->drain();
    } catch (...) {
    }
  }
  void allocate() override {
    Base::allocate();
    nn::ParamRegistry& reg = this->b_.params;
    groups_ = group_ranges(reg);
    for (const FlatRange& g : groups_) slot_ = std::max(slot_, g.count);
    fresh_.assign(groups_.size(), 1);
    pinned_.assign(groups_.size(), 0);
    for (const nn::Param& p : reg.params())
      if (p.replicas.summed) pinned_[p.group] = 1;
    slots_.resize(groups_.size());
    bucket_bufs_.resize(this->b_.buckets.size());
    gf_ = make_shard_file(this->b_.opt, "gradients", std::max<size_t>(reg.size(), 1));
    grad_segments_ = this->segments_;
    for (optim::Segment& s : grad_segments_) s.grad = s.state;
  }
  offload::ShardFile* grad_file() override { return gf_.get(); }
  void settle_grad_file() override {
    this->b_.finish();
    flush_pinned(0, SIZE_MAX);
  }
  void begin_step() override { std::fill(fresh_.begin(), fresh_.end(), 1); }  // nothing bound: no begin_grads
  void before_backward(int g) override {
    Base::before_backward(g);
    const FlatRange& r = groups_[g];
    if (r.count == 0 || slots_[g].size() != 0) return;
    slots_[g] = take();
    bind_grads(g, slots_[g].data());
    if (fresh_[g])
      this->b_.params.begin_grads(r.begin, r.count);
    else
      gf_->read(r.begin, r.count, slots_[g].data());
  }
  void after_backward(int g) override {
    const FlatRange& r = groups_[g];
    if (r.count > 0 && slots_[g].size() != 0) {
      fresh_[g] = 0;
      if (!pinned_[g]) {
        gf_->write(r.begin, r.count, slots_[g].data());  // before the bucket's reduction reads it (queue order)
        bind_grads(g, nullptr);
        give(slots_[g]);
      }
    }
    Base::after_backward(g);
  }
  void bucket_ready(Bucket& b) override {
    if (!this->b_.last_micro) return;
    flush_pinned(b.begin, b.count);
    if (b.alone()) return;
    AlignedBuffer& buf = bucket_bufs_[b.index];
    buf = this->b_.acquire(b.count);
    gf_->read(b.begin, b.count, buf.data());
    Bucket* bp = &b;
    const bool scatter = this->sharded();
    float* recv = scatter ? buf.data() + b.so : buf.data();
    this->b_.reduce(b, buf.data(), recv, scatter, [this, bp, scatter](const float*) {
      AlignedBuffer& done = bucket_bufs_[bp->index];
      if (scatter)
        gf_->write(bp->begin + bp->so, bp->sc, done.data() + bp->so);
      else
        gf_->write(bp->begin, bp->count, done.data());
      this->b_.give_back(done);
    });
  }
  void reduce_all() override { MT_ASSERT(false, "--offload grads at ZeRO 0/1 runs with the hooks"); }
  void for_each_owned_grad(const std::function<void(float*, size_t)>& fn) override {
    settle_grad_file();
    each_owned([&](const FlatRange& r, float* g) {
      fn(g, r.count);
      gf_->write(r.begin, r.count, g);
    });
  }
  void visit_grad_segments(const std::function<void(size_t, const float*)>& fn) override {
    settle_grad_file();
    each_owned([&](const FlatRange& r, float* g) {
      for (size_t i = 0; i < this->segments_.size(); i++) {
        const optim::Segment& s = this->segments_[i];
        if (s.grad < r.begin || s.grad >= r.begin + r.count) continue;
        MT_ASSERT(s.grad + s.count <= r.begin + r.count, "a gradient segment crosses a bucket's owned range");
        fn(i, g + (s.grad - r.begin));
      }
    });
  }
  const float* grad_base() override { return nullptr; }
  void update(optim::Optimizer& opt, float lr, int64_t step) override {
    settle_grad_file();
    StreamedTiles src(nullptr, this->b_.params.data(), gf_.get(), nullptr, this->segments_);
    tiled(opt).step_from(src, grad_segments_, lr, step);
    if (this->sharded()) this->all_gather_params();
  }
  size_t grad_bytes() const override { return 0; }
  size_t offloaded_grad_bytes() const override { return this->b_.params.size() * sizeof(float); }
  std::vector<offload::ShardFile*> shard_files() override {
    std::vector<offload::ShardFile*> v = Base::shard_files();
    v.push_back(gf_.get());
    return v;
  }
  // The buffers besides the update's tiles: the slots (kept once allocated), each bucket's reduction buffer
  // (pooled: with dp > 1 every bucket's may be in flight at the last micro-batch), each_owned's one buffer.
  size_t grad_file_buffer_bytes() const {
    size_t nonempty = 0, pinned = 0, pooled = 0, owned = 0;
    for (size_t g = 0; g < groups_.size(); g++) {
      nonempty += groups_[g].count > 0;
      pinned += groups_[g].count > 0 && pinned_[g];
    }
    // Bound at once: the group in use, one kept open through the backward (GPT's embeddings, bound first and
    // given back last), and every pinned group.
    const size_t slots = std::min(nonempty, 2 + pinned);
    for (const Bucket* b : this->b_.buckets) {
      if (!b->alone()) pooled += b->count;
      const bool part = this->sharded() && !b->alone();
      const size_t begin = part ? b->begin + b->so : b->begin, n = part ? b->sc : b->count;
      if (n > 0) owned = std::max(owned, begin % 16 + n);
    }
    return (slots * std::max<size_t>(slot_, 1) + pooled + owned) * sizeof(float);
  }
  // Those and StreamedTiles' two gradient tiles of T = tile_bytes / 4 floats.
  size_t offload_buffer_bytes(size_t tile_bytes) const override {
    return grad_file_buffer_bytes() + 2 * (tile_bytes / sizeof(float)) * sizeof(float);
  }

 private:
  // Writes the still-bound pinned groups overlapping flat range [lo, lo + n) to the file and unbinds them.
  void flush_pinned(size_t lo, size_t n) {
    for (size_t g = 0; g < groups_.size(); g++) {
      const FlatRange& r = groups_[g];
      if (!pinned_[g] || slots_[g].size() == 0 || r.begin + r.count <= lo || (n != SIZE_MAX && r.begin >= lo + n))
        continue;
      gf_->write(r.begin, r.count, slots_[g].data());
      bind_grads((int)g, nullptr);
      give(slots_[g]);
    }
  }
  void bind_grads(int g, float* base) {
    for (nn::Param& p : this->b_.params.params())
      if (p.group == g) p.grad = base ? base + (p.offset - groups_[g].begin) : nullptr;
  }
  AlignedBuffer take() {
    if (free_.empty()) return AlignedBuffer(std::max<size_t>(slot_, 1));
    AlignedBuffer b = std::move(free_.back());
    free_.pop_back();
    return b;
  }
  void give(AlignedBuffer& buf) {
    free_.push_back(std::move(buf));
    buf = AlignedBuffer();
  }
  // fn(range, values) for each bucket's owned range (the whole bucket at ZeRO 0, this rank's slice at ZeRO 1),
  // the values read from the file and placed at the same address modulo 64 bytes as in the resident buffer.
  template <class Fn>
  void each_owned(Fn fn) {
    for (Bucket* b : this->b_.buckets) {
      const FlatRange r = this->sharded() && !b->alone() ? FlatRange{b->begin + b->so, b->sc} : FlatRange{b->begin, b->count};
      if (r.count == 0) continue;
      const size_t pad = r.begin % 16;
      AlignedBuffer buf(pad + r.count);
      gf_->read(r.begin, r.count, buf.data() + pad);
      fn(r, buf.data() + pad);
    }
  }
  std::vector<FlatRange> groups_;
  size_t slot_ = 0;
  std::vector<char> fresh_;                 // per group: no gradient in the file yet this step
  std::vector<char> pinned_;                // per group: holds a tensor summed over the tie group
  std::vector<AlignedBuffer> slots_, free_;  // per group: its bound slot; the free slots
  std::vector<AlignedBuffer> bucket_bufs_;   // per bucket: the buffer of its reduction in flight
  std::vector<optim::Segment> grad_segments_;  // segments_ with grad laid out as the state
  std::unique_ptr<offload::ShardFile> gf_;
};

// ---- --offload params at stages 0-2: the full parameters in a file (param_file.h), the stage's own reductions
// and shards unchanged. Each group is read and bound around its forward and backward (the next one read ahead),
// the update streams each state tile's parameters (and gradients) through StreamedTiles, and stages 1 and 2
// all-gather each bucket from this rank's updated slice in the file back into it. ----
template <class Base>
class ParamsInFile final : public Base {
 public:
  using Base::Base;
  void allocate() override {
    Base::allocate();
    pf_ = std::make_unique<FullParamFile>(this->b_);
    state_segments_ = this->segments_;
    for (optim::Segment& s : state_segments_) s.param = s.grad = s.state;
  }
  void enable_mirror() override { this->b_.params.enable_mirror(); }  // filled by refresh_mirror
  void refresh_mirror() override { pf_->refresh_mirror(); }
  void initialize(const std::function<void(nn::Param&)>& fill) override { pf_->initialize(fill); }
  void before_forward(int g) override {
    pf_->use(g, g + 1);
    Base::before_forward(g);
  }
  void after_forward(int g) override {
    Base::after_forward(g);
    pf_->done(g);
  }
  void before_backward(int g) override {
    pf_->use(g, g - 1);
    Base::before_backward(g);
  }
  void after_backward(int g) override {
    Base::after_backward(g);
    pf_->done(g);
  }
  void release_params() override {
    Base::release_params();
    pf_->release_all();
  }
  void update(optim::Optimizer& opt, float lr, int64_t step) override {
    pf_->release_all();
    offload::ShardFile* gf = nullptr;
    if constexpr (std::is_base_of_v<Stage2, Base>) {
      this->settle_grads();
      gf = this->gf_.get();
    }
    if (auto* gs = dynamic_cast<GradFileSource*>(this)) {
      gs->settle_grad_file();
      gf = gs->grad_file();
    }
    StreamedTiles src(&pf_->file(), nullptr, gf, gf ? nullptr : this->grad_base(), this->segments_);
    tiled(opt).step_from(src, state_segments_, lr, step);
    if (this->sharded()) pf_->all_gather_buckets();
  }
  void full_params_of(const float* resident, std::vector<float>& out) override {
    if (resident) return Base::full_params_of(resident, out);
    out.resize(this->b_.params.size());
    pf_->read_all(out.data());
  }
  void load_full_params_into(const float* full, float* resident) override {
    if (resident) return Base::load_full_params_into(full, resident);
    pf_->write_all(full);
  }
  size_t param_bytes() const override {
    return this->b_.params.mirrored() ? this->b_.params.size() * sizeof(uint16_t) : 0;
  }
  size_t offloaded_param_bytes() const override { return this->b_.params.size() * sizeof(float); }
  // The parameter slots (param_file.h), StreamedTiles' four tiles (parameters and gradients, two each, of
  // T = tile_bytes / 4 floats), the gradient file's own buffers when grads are offloaded too (GradsInFile's
  // slots and buckets; ZeRO 2's read-ahead), and at ZeRO 1 without a gradient file the all-gather's pooled
  // buffers (one per distinct bucket size; at ZeRO 2 the stage's own pooled bucket buffers serve it).
  size_t offload_buffer_bytes(size_t tile_bytes) const override {
    size_t bytes = pf_->slot_bytes() + 4 * (tile_bytes / sizeof(float)) * sizeof(float);
    if constexpr (requires { this->grad_file_buffer_bytes(); }) {
      bytes += this->grad_file_buffer_bytes();
    } else if constexpr (std::is_base_of_v<Stage2, Base>) {
      bytes += this->read_ahead_bytes();
    } else if (this->sharded()) {
      std::vector<size_t> sizes;
      for (const Bucket* b : this->b_.buckets)
        if (!b->alone() && std::find(sizes.begin(), sizes.end(), b->count) == sizes.end()) sizes.push_back(b->count);
      for (size_t n : sizes) bytes += n * sizeof(float);
    }
    return bytes;
  }
  std::vector<offload::ShardFile*> shard_files() override {
    std::vector<offload::ShardFile*> v{&pf_->file()};
    for (offload::ShardFile* f : Base::shard_files()) v.push_back(f);
    return v;
  }

 private:
  std::vector<optim::Segment> state_segments_;  // segments_ with param and grad laid out as the state
  std::unique_ptr<FullParamFile> pf_;
};

}  // namespace

std::unique_ptr<ZeroStage> make_zero_stage(int stage, BucketSet& buckets) {
  const bool pf = buckets.opt.offload_params, gf = buckets.opt.offload_grads;
  auto low = [&](auto stage_tag) -> std::unique_ptr<ZeroStage> {  // stages 0 and 1: each file a part of its own
    using S = typename decltype(stage_tag)::type;
    if (pf && gf) return std::make_unique<ParamsInFile<GradsInFile<S>>>(buckets);
    if (pf) return std::make_unique<ParamsInFile<S>>(buckets);
    if (gf) return std::make_unique<GradsInFile<S>>(buckets);
    return std::make_unique<S>(buckets);
  };
  switch (stage) {
    case 0: return low(std::type_identity<Stage0>{});
    case 1: return low(std::type_identity<Stage1>{});
    case 2: return pf ? std::unique_ptr<ZeroStage>(std::make_unique<ParamsInFile<Stage2>>(buckets)) : std::make_unique<Stage2>(buckets);
    case 3: return std::make_unique<Stage3>(buckets);
  }
  MT_ASSERT(false, "ZeRO stage ", stage);
  return nullptr;
}

}  // namespace mt::parallel
