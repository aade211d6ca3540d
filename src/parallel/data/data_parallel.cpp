#include "parallel/data/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "optim/optimizer.h"

namespace mt::parallel {

struct DataParallel::Bucket {
  int index = 0;                  // in buckets_
  int g_lo = 0, g_hi = 0;         // first and last group in flat order (for names)
  int groups = 0;                 // non-empty groups in the bucket
  size_t begin = 0, count = 0;    // flat range
  size_t so = 0, sc = 0;          // this rank's shard within the bucket: [begin + so, begin + so + sc)
  size_t pos = 0;                 // where that shard starts in the compact shard buffers
  int pending = 0;                // groups whose backward has not finished in this micro-batch
  AlignedBuffer grad;             // stages 2, 3: full gradients while in flight
  AlignedBuffer data;             // stage 3: gathered parameters while in use
  bool gathered = false;
  comm::Request gather;           // stage 3: prefetch in flight
};

struct DataParallel::Pending {
  comm::Request req;
  std::function<void()> on_done;
  std::string what;       // for the trace
  double t_issue = 0, t_done = 0;
  AlignedBuffer tmp;  // stages 2, 3: this micro-batch's reduced shard, before accumulation
};

DataParallel::DataParallel(nn::ParamRegistry& params, comm::Communicator* dp, const DataParallelOptions& opt)
    : params_(params), dp_(dp), opt_(opt) {
  MT_CHECK_INPUT(opt.zero >= 0 && opt.zero <= 3, "--zero must be 0, 1, 2 or 3, got ", opt.zero);
  MT_CHECK_INPUT(opt.bucket_mb > 0, "--bucket-mb must be positive, got ", opt.bucket_mb);
  if (dp_) {
    n_ = dp_->size();
    r_ = dp_->rank();
  }
  params_.finalize(/*allocate_data=*/opt_.zero < 3, /*allocate_grad=*/opt_.zero < 2);
  build_buckets();
  group_t0_.assign(params_.num_groups(), 0.0);
  if (opt_.zero >= 2) gshard_.resize(shard_total_);
  if (opt_.zero == 3) pshard_.resize(shard_total_);
}

DataParallel::~DataParallel() {
  for (Pending* p : inflight_) {
    try {
      p->req.wait();
    } catch (...) {
    }
    delete p;
  }
  for (Bucket* b : buckets_) {
    try {
      b->gather.wait();
    } catch (...) {
    }
    delete b;
  }
}

void DataParallel::build_buckets() {
  const int G = params_.num_groups();
  std::vector<size_t> gb(G, SIZE_MAX), ge(G, 0);
  for (const nn::Param& p : params_.params()) {
    gb[p.group] = std::min(gb[p.group], p.offset);
    ge[p.group] = std::max(ge[p.group], p.offset + p.numel);
  }
  const size_t limit = std::max<size_t>(1, (size_t)(opt_.bucket_mb * 1048576.0 / sizeof(float)));
  bucket_of_.assign(G, -1);
  // Groups in descending flat order: the order backward finishes them (a model registers its layers in
  // forward order), and consecutive groups tile the buffer, so every bucket is one flat range. (A pipeline
  // stage's tied wte copy is registered last though its group id is 0: order by offset, not by id.)
  std::vector<int> order;
  for (int g = 0; g < G; g++)
    if (gb[g] != SIZE_MAX) order.push_back(g);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return gb[a] > gb[b]; });
  Bucket* cur = nullptr;
  for (size_t k = 0; k < order.size(); k++) {
    const int g = order[k];
    if (!cur) {
      cur = new Bucket;
      cur->g_hi = g;
      cur->count = 0;
    }
    cur->g_lo = g;
    cur->groups++;
    bucket_of_[g] = (int)buckets_.size();
    size_t size = ge[cur->g_hi] - gb[g];
    if (opt_.zero >= 2 || size >= limit || k + 1 == order.size()) {
      cur->begin = gb[g];
      cur->count = size;
      cur->index = (int)buckets_.size();
      buckets_.push_back(cur);
      cur = nullptr;
    }
  }
  // This rank's shard of each bucket, and the optimizer segments over it.
  size_t pos = 0;
  for (Bucket* b : buckets_) {
    comm::Shard s = comm::shard_of(b->count, n_, r_);
    b->so = s.offset;
    b->sc = s.count;
    b->pos = pos;
    pos += s.count;
  }
  shard_total_ = pos;
  if (opt_.zero == 0) {
    segments_ = optim::segments_of(params_);
    return;
  }
  // Segments in flat order of parameters; each parameter may span several buckets' shards.
  int index = -1;
  for (const nn::Param& p : params_.params()) {
    index++;
    for (Bucket* b : buckets_) {
      size_t lo = std::max(p.offset, b->begin + b->so), hi = std::min(p.offset + p.numel, b->begin + b->so + b->sc);
      if (lo >= hi) continue;
      size_t shard = b->pos + (lo - (b->begin + b->so));
      segments_.push_back({opt_.zero == 3 ? shard : lo, opt_.zero == 1 ? lo : shard, shard, hi - lo, p.decay, index});
    }
  }
}

size_t DataParallel::state_size() const { return opt_.zero == 0 ? params_.size() : shard_total_; }

void DataParallel::bind_data(Bucket& b, float* base) {
  for (nn::Param& p : params_.params())
    if (bucket_of_[p.group] == b.index) p.data = base ? base + (p.offset - b.begin) : nullptr;
}

void DataParallel::bind_grad(Bucket& b, float* base) {
  for (nn::Param& p : params_.params())
    if (bucket_of_[p.group] == b.index) p.grad = base ? base + (p.offset - b.begin) : nullptr;
}

void DataParallel::initialize(const std::function<void(nn::Param&)>& fill) {
  if (opt_.zero < 3) {
    for (nn::Param& p : params_.params()) fill(p);
    return;
  }
  // Stage 3: one bucket's full tensors at a time; keep this rank's slice.
  for (Bucket* b : buckets_) {
    AlignedBuffer tmp(b->count);
    bind_data(*b, tmp.data());
    for (nn::Param& p : params_.params())
      if (bucket_of_[p.group] == b->index) fill(p);
    std::memcpy(pshard_.data() + b->pos, tmp.data() + b->so, sizeof(float) * b->sc);
    bind_data(*b, nullptr);
  }
}

// ---- The step. ----

void DataParallel::begin_step() {
  if (opt_.zero < 2) params_.zero_grad();
  if (opt_.zero >= 2) gshard_.zero();
}

void DataParallel::begin_micro_batch(int index, int count) {
  // Stages 2, 3: the previous micro-batch's buckets must be reduced and freed before they are rewritten.
  if (opt_.zero >= 2) finish_backward();
  micro_index_ = index;
  last_micro_ = index == count - 1;
  for (Bucket* b : buckets_) b->pending = b->groups;
}

comm::Request DataParallel::start_reduce(const float* send, float* recv, size_t count, bool scatter,
                                         std::function<void()>* on_done) {
  const size_t out = scatter ? comm::shard_of(count, n_, r_).count : count;
  if (opt_.grad_dtype == comm::DType::f32) {
    return scatter ? dp_->ireduce_scatter(send, recv, count, comm::DType::f32, comm::ReduceOp::sum)
                   : dp_->iall_reduce(send, recv, count, comm::DType::f32, comm::ReduceOp::sum);
  }
  // bf16 on the wire: round the gradients to bf16, reduce (f32 accumulation inside comm), widen back.
  auto s16 = std::make_shared<std::vector<comm::bf16_t>>(count);
  auto r16 = std::make_shared<std::vector<comm::bf16_t>>(out);
  for (size_t i = 0; i < count; i++) (*s16)[i] = comm::f32_to_bf16(send[i]);
  comm::Request req = scatter ? dp_->ireduce_scatter(s16->data(), r16->data(), count, comm::DType::bf16,
                                                     comm::ReduceOp::sum)
                              : dp_->iall_reduce(s16->data(), r16->data(), count, comm::DType::bf16,
                                                 comm::ReduceOp::sum);
  std::function<void()> prev = std::move(*on_done);
  *on_done = [s16, r16, recv, out, prev] {
    for (size_t i = 0; i < out; i++) recv[i] = comm::bf16_to_f32((*r16)[i]);
    if (prev) prev();
  };
  return req;
}

AlignedBuffer DataParallel::acquire(size_t count) {
  for (size_t i = 0; i < pool_.size(); i++) {
    if (pool_[i].size() == count) {
      AlignedBuffer b = std::move(pool_[i]);
      pool_.erase(pool_.begin() + i);
      b.zero();
      return b;
    }
  }
  pooled_bytes_ += count * sizeof(float);
  return AlignedBuffer(count);
}

void DataParallel::give_back(AlignedBuffer& buf) {
  if (buf.size() == 0) return;
  pool_.push_back(std::move(buf));
  buf = AlignedBuffer();
}

std::string DataParallel::group_name(int g) const {
  for (const nn::Param& p : params_.params()) {
    if (p.group != g) continue;
    size_t dot = p.name.find('.');
    if (p.name.rfind("h.", 0) == 0) dot = p.name.find('.', 2);
    return p.name.substr(0, dot);
  }
  return "group " + std::to_string(g);
}

void DataParallel::poll_inflight() {
  if (!trace_ || !trace_->enabled()) return;
  for (Pending* p : inflight_)
    if (p->t_done == 0 && p->req.test()) p->t_done = trace::ChromeTrace::now_us();
}

void DataParallel::reduce_bucket(Bucket& b) {
  auto* p = new Pending;
  if (trace_ && trace_->enabled()) {
    p->t_issue = trace::ChromeTrace::now_us();
    p->what = str(opt_.zero == 0 ? "all_reduce " : "reduce_scatter ", group_name(b.g_lo),
                  b.g_hi != b.g_lo ? ".." + group_name(b.g_hi) : std::string(), " (",
                  (double)b.count * (opt_.grad_dtype == comm::DType::f32 ? 4 : 2) / 1048576.0, " MB)");
  }
  if (opt_.zero == 0) {
    float* g = params_.grad() + b.begin;
    p->req = start_reduce(g, g, b.count, false, &p->on_done);
  } else if (opt_.zero == 1) {
    // In place: this rank's slice of the full gradient buffer receives the reduced slice.
    float* g = params_.grad() + b.begin;
    p->req = start_reduce(g, g + b.so, b.count, true, &p->on_done);
  } else {
    // Stages 2, 3: reduce this micro-batch's bucket into a temporary shard, then accumulate and free.
    Bucket* bp = &b;
    float* acc = gshard_.data() + b.pos;
    p->tmp.resize(b.sc);
    float* tmp = p->tmp.data();
    std::function<void()> finish = [this, bp, acc, tmp] {
      for (size_t i = 0; i < bp->sc; i++) acc[i] += tmp[i];
      bind_grad(*bp, nullptr);
      give_back(bp->grad);
    };
    p->on_done = finish;
    std::function<void()> conv;
    p->req = start_reduce(b.grad.data(), tmp, b.count, true, &conv);
    if (conv) p->on_done = [conv, finish] {
      conv();
      finish();
    };
  }
  inflight_.push_back(p);
  // Stages 2, 3 keep at most one bucket's reduction in flight besides the one being written (and the tied
  // embedding's, whose gradient is written at both ends of the backward pass).
  if (opt_.zero >= 2)
    while (inflight_.size() > 1) complete_oldest();
}

void DataParallel::complete_oldest() {
  Pending* p = inflight_.front();
  inflight_.erase(inflight_.begin());
  p->req.wait();
  if (trace_ && trace_->enabled())
    trace_->add(trace::Track::comm, p->what, "comm", p->t_issue, p->t_done ? p->t_done : trace::ChromeTrace::now_us());
  if (p->on_done) p->on_done();
  delete p;
}

void DataParallel::finish_backward() {
  while (!inflight_.empty()) complete_oldest();
}

void DataParallel::for_each_owned_grad(const std::function<void(float*, size_t)>& fn) {
  if (opt_.zero == 0) {
    fn(params_.grad(), params_.size());
  } else if (opt_.zero == 1) {
    for (Bucket* b : buckets_) fn(params_.grad() + b->begin + b->so, b->sc);
  } else {
    fn(gshard_.data(), shard_total_);
  }
}

std::pair<double, double> DataParallel::grad_sq(const std::vector<bool>& flagged) {
  const float* g = opt_.zero <= 1 ? params_.grad() : gshard_.data();
  double total = 0, part = 0;
  for (const optim::Segment& sg : segments_) {
    double n = optim::global_norm(g + sg.grad, sg.count);
    total += n * n;
    if (!flagged.empty() && flagged[sg.tensor]) part += n * n;
  }
  if (opt_.zero > 0 && dp_ && n_ > 1) {
    // Owned slices add up over the group (float32 partial sums: ~1e-7 relative on the norm).
    float v[2] = {(float)total, (float)part};
    dp_->all_reduce(v, v, 2, comm::DType::f32, comm::ReduceOp::sum);
    total = v[0];
    part = v[1];
  }
  return {total, part};
}

double DataParallel::grad_norm() { return std::sqrt(grad_sq({}).first); }

void DataParallel::reduce_all() {
  MT_ASSERT(opt_.zero <= 1, "reduce_all is for ZeRO 0 and 1");
  if (!dp_ || n_ == 1) return;
  if (opt_.zero == 0) {
    dp_->all_reduce(params_.grad(), params_.grad(), params_.size(), comm::DType::f32, comm::ReduceOp::sum);
    return;
  }
  for (Bucket* b : buckets_) reduce_bucket(*b);  // in-place reduce-scatter of each bucket
  finish_backward();
}

void DataParallel::scale_grads(float factor) {
  for_each_owned_grad([&](float* g, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) g[i] *= factor;
  });
}

void DataParallel::update(optim::Optimizer& opt, float lr, int64_t step) {
  if (opt_.zero == 0) {
    opt.step(params_.data(), params_.grad(), segments_, lr, step);
    return;
  }
  if (opt_.zero == 3) {
    // A gathered copy or a prefetch in flight would hold the parameters from before this update.
    for (Bucket* b : buckets_) {
      if (b->gather.valid()) {
        b->gather.wait();
        b->gather = comm::Request();
        b->gathered = true;
      }
      release_params(*b);
    }
    opt.step(pshard_.data(), gshard_.data(), segments_, lr, step);
    return;
  }
  opt.step(params_.data(), opt_.zero == 1 ? params_.grad() : gshard_.data(), segments_, lr, step);
  // Every rank updated its slice of each bucket; gather the slices back into the full parameters.
  std::vector<comm::Request> reqs;
  if (dp_ && n_ > 1) {
    double t0 = trace::ChromeTrace::now_us();
    for (Bucket* b : buckets_) {
      float* base = params_.data() + b->begin;
      reqs.push_back(dp_->iall_gather(base + b->so, base, b->count, comm::DType::f32));
    }
    comm::wait_all(reqs);
    if (trace_) trace_->add(trace::Track::comm, "all_gather parameters", "comm", t0, trace::ChromeTrace::now_us());
  }
}

// ---- Hooks. ----

void DataParallel::start_gather(Bucket& b) {
  if (b.gathered || b.gather.valid()) return;
  if (b.data.size() != b.count) b.data = acquire(b.count);
  if (dp_ && n_ > 1) {
    b.gather = dp_->iall_gather(pshard_.data() + b.pos, b.data.data(), b.count, comm::DType::f32);
  } else {
    std::memcpy(b.data.data(), pshard_.data() + b.pos, sizeof(float) * b.count);
  }
}

void DataParallel::ensure_gathered(Bucket& b) {
  if (b.gathered) return;
  start_gather(b);
  if (b.gather.valid()) {
    b.gather.wait();
    b.gather = comm::Request();
  }
  bind_data(b, b.data.data());
  b.gathered = true;
}

void DataParallel::release_params(Bucket& b) {
  if (!b.gathered) return;
  bind_data(b, nullptr);
  give_back(b.data);
  b.gathered = false;
}

void DataParallel::before_forward(int g) {
  group_t0_[g] = trace::ChromeTrace::now_us();
  if (opt_.zero < 3) return;
  ensure_gathered(*buckets_[bucket_of_[g]]);
  // Prefetch the next group in forward order while this one computes.
  if (g + 1 < (int)bucket_of_.size() && bucket_of_[g + 1] >= 0) start_gather(*buckets_[bucket_of_[g + 1]]);
}

void DataParallel::after_forward(int g) {
  if (trace_) trace_->add(trace::Track::compute, "forward " + group_name(g), "compute", group_t0_[g],
                          trace::ChromeTrace::now_us());
  if (opt_.zero < 3) return;
  release_params(*buckets_[bucket_of_[g]]);
}

void DataParallel::before_backward(int g) {
  group_t0_[g] = trace::ChromeTrace::now_us();
  Bucket& b = *buckets_[bucket_of_[g]];
  if (opt_.zero == 3) {
    ensure_gathered(b);
    // Backward runs groups in descending order (GPT additionally opens group 0, the tied embedding, first;
    // it is gathered by then and start_gather skips it).
    if (g >= 1 && bucket_of_[g - 1] >= 0) start_gather(*buckets_[bucket_of_[g - 1]]);
  }
  if (opt_.zero >= 2 && b.grad.size() == 0) {
    b.grad = acquire(b.count);
    bind_grad(b, b.grad.data());
  }
}

void DataParallel::after_backward(int g) {
  if (trace_) {
    trace_->add(trace::Track::compute, "backward " + group_name(g), "compute", group_t0_[g],
                trace::ChromeTrace::now_us());
    poll_inflight();
  }
  Bucket& b = *buckets_[bucket_of_[g]];
  if (opt_.zero == 3) release_params(b);
  if (--b.pending > 0) return;
  if (opt_.zero <= 1 && !last_micro_) return;  // gradients keep accumulating locally
  if (!dp_ || n_ == 1) {  // one rank: its gradients are the reduced ones
    if (opt_.zero >= 2) {
      float* acc = gshard_.data() + b.pos;
      for (size_t i = 0; i < b.count; i++) acc[i] += b.grad[i];
      bind_grad(b, nullptr);
      give_back(b.grad);
    }
    return;
  }
  reduce_bucket(b);
}

// ---- Consolidation. ----

void DataParallel::full_params(std::vector<float>& out) {
  out.resize(params_.size());
  if (opt_.zero < 3) {
    std::memcpy(out.data(), params_.data(), sizeof(float) * params_.size());
    return;
  }
  for (Bucket* b : buckets_) {
    if (dp_ && n_ > 1)
      dp_->all_gather(pshard_.data() + b->pos, out.data() + b->begin, b->count, comm::DType::f32);
    else
      std::memcpy(out.data() + b->begin, pshard_.data() + b->pos, sizeof(float) * b->count);
  }
}

void DataParallel::full_state(const float* shard_state, std::vector<float>& out) {
  out.resize(params_.size());
  if (opt_.zero == 0) {
    std::memcpy(out.data(), shard_state, sizeof(float) * params_.size());
    return;
  }
  for (Bucket* b : buckets_) {
    if (dp_ && n_ > 1)
      dp_->all_gather(shard_state + b->pos, out.data() + b->begin, b->count, comm::DType::f32);
    else
      std::memcpy(out.data() + b->begin, shard_state + b->pos, sizeof(float) * b->count);
  }
}

void DataParallel::load_full_params(const float* full) {
  if (opt_.zero < 3) {
    std::memcpy(params_.data(), full, sizeof(float) * params_.size());
    return;
  }
  take_shard(bucket_ranges(), n_, r_, full, pshard_.data());
}

void DataParallel::load_full_state(const float* full, float* shard_state) {
  if (opt_.zero == 0) {
    std::memcpy(shard_state, full, sizeof(float) * params_.size());
    return;
  }
  take_shard(bucket_ranges(), n_, r_, full, shard_state);
}

std::vector<FlatRange> DataParallel::bucket_ranges() const {
  std::vector<FlatRange> out;
  for (const Bucket* b : buckets_) out.push_back({b->begin, b->count});
  return out;
}

size_t DataParallel::param_bytes() const {
  return (opt_.zero == 3 ? shard_total_ : params_.size()) * sizeof(float);
}

size_t DataParallel::grad_bytes() const {
  return (opt_.zero <= 1 ? params_.size() : shard_total_) * sizeof(float);
}

}  // namespace mt::parallel
