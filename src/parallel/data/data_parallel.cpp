#include "parallel/data/data_parallel.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "optim/optimizer.h"
#include "parallel/data/segment_norms.h"

namespace mt::parallel {

DataParallel::DataParallel(nn::ParamRegistry& params, comm::Communicator* dp, const DataParallelOptions& opt,
                           comm::Communicator* experts)
    : b_(params, dp, opt, experts), stage_(make_zero_stage(opt.zero, b_)) {
  stage_->allocate();
  if (opt.bf16_mirror) stage_->enable_mirror();
  group_t0_.assign(params.num_groups(), 0.0);
  tied_.assign(b_.buckets.size(), false);
  for (const nn::Param& p : params.params())
    if (p.replicas.summed)
      for (int i : b_.group_buckets[p.group])
        if (p.offset >= b_.buckets[i]->begin && p.offset < b_.buckets[i]->begin + b_.buckets[i]->count) tied_[i] = true;
}

void DataParallel::initialize(const std::function<void(nn::Param&)>& fill) {
  stage_->initialize(fill);
  refresh_mirror();
}

// ---- The step. ----

void DataParallel::begin_step() {
  stage_->begin_step();
  if (versions_) {
    trace::TraceScope ts(b_.trace, "weight versions: the step's version in", "compute");
    stage_->release_params();  // no gathered copy of the version before the swap
    versions_->before_forward();
    refresh_mirror();  // the products read the mirror of the version just swapped in
  }
}

void DataParallel::set_versions(std::unique_ptr<ParamVersions> v) {
  MT_ASSERT(!versions_, "the parameter store keeps one ParamVersions part");
  versions_ = std::move(v);
  if (versions_) versions_->bind(stage_->resident(), stage_->resident_count());
}

void DataParallel::begin_micro_batch(int index, int count) {
  stage_->begin_micro_batch();
  b_.last_micro = index == count - 1;
  for (Bucket* b : b_.buckets) b->pending = b->groups;
}

void DataParallel::begin_accumulation(int count) {
  MT_ASSERT(count >= 1, "a step of ", count, " micro-batches");
  b_.last_micro = true;
  for (Bucket* b : b_.buckets) b->pending = b->groups * count;
}

void DataParallel::finish_backward() { b_.finish(); }

void DataParallel::reduce_held() {
  for (Bucket* b : held_) stage_->bucket_ready(*b);
  held_.clear();
  b_.finish();
}

void DataParallel::reduce_all() { stage_->reduce_all(); }

std::pair<double, double> DataParallel::grad_sq(const std::vector<bool>& flagged) {
  if (versions_) versions_->before_clip();  // an update in flight ends before the step's clipping scale is set
  double total = 0, part = 0;
  // Each element counted once over the dp group: a sharded stage's owned slices tile every tensor over its
  // bucket's group; replicated gradients with experts present count on rank 0 of their group (dp, or the
  // expert's replicas), so that the experts, which differ between places of an ep run, add up over dp.
  const bool sum_dp = !b_.alone() && (stage_->sharded() || b_.has_experts);
  const auto& all = b_.params.params();
  const std::vector<optim::Segment>& segs = stage_->segments();
  auto counted = [&](const optim::Segment& sg) {
    return !(sum_dp && !stage_->sharded() && (all[sg.tensor].expert ? b_.er : b_.r) != 0);
  };
  // Each segment's norm (in the stage's order: an offloaded gradient comes in bucket by bucket), then added up
  // in segment order.
  std::vector<double> norms(segs.size(), 0.0);
  auto* kept = dynamic_cast<SegmentNorms*>(stage_.get());
  if (!kept || !kept->grad_segment_norms(norms))
    stage_->visit_grad_segments([&](size_t i, const float* g) {
      if (counted(segs[i])) norms[i] = optim::global_norm(g, segs[i].count);
    });
  for (size_t i = 0; i < segs.size(); i++) {
    const optim::Segment& sg = segs[i];
    if (!counted(sg)) continue;
    double n = norms[i];
    total += n * n;
    if (!flagged.empty() && flagged[sg.tensor]) part += n * n;
  }
  if (sum_dp) {
    // Owned slices add up over the group (float32 partial sums: ~1e-7 relative on the norm).
    float v[2] = {(float)total, (float)part};
    b_.dp->all_reduce(v, v, 2, comm::DType::f32, comm::ReduceOp::sum);
    total = v[0];
    part = v[1];
  }
  return {total, part};
}

double DataParallel::grad_norm() { return std::sqrt(grad_sq({}).first); }

void DataParallel::scale_grads(float factor) {
  stage_->for_each_owned_grad([&](float* g, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) g[i] *= factor;
  });
}

void DataParallel::update(optim::Optimizer& opt, float lr, int64_t step) {
  if (versions_ && versions_->defers_update()) {
    // The part runs the optimizer on its own thread (train/overlapped_update.h); the collectives that finish
    // the update (ZeRO 1's all-gather) stay on this thread, called back by the part.
    MT_ASSERT(opt.stat_rounds() == 0, "a deferred update with a statistics phase (its collectives)");
    std::vector<std::pair<size_t, size_t>> owned;
    const float* g0 = stage_->grad_base();
    stage_->for_each_owned_grad([&](float* g, size_t n) { owned.emplace_back((size_t)(g - g0), n); });
    const std::vector<optim::Segment>* segs = &stage_->segments();
    ParamVersions::DeferredUpdate u;
    u.run = [&opt, segs, lr, step](float* p, const float* g) { opt.step(p, g, *segs, lr, step); };
    if (stage_->sharded()) u.complete = [this](float* p) { stage_->gather_updated(p); };
    versions_->defer_update(g0, owned, std::move(u));
    return;
  }
  if (versions_) {
    trace::TraceScope ts(b_.trace, "weight versions: the updated version in", "compute");
    stage_->release_params();
    versions_->before_update();
  }
  const auto& all = b_.params.params();
  for (int round = 0; round < opt.stat_rounds(); round++) {
    optim::TensorSums ts;
    ts.first.assign(all.size() + 1, 0);
    for (size_t t = 0; t < all.size(); t++) ts.first[t + 1] = ts.first[t] + opt.stat_count(round, all[t]);
    ts.sums = tensor_sums(ts.first, opt.piece_sums(round, step));
    opt.set_tensor_sums(round, std::move(ts));
  }
  stage_->update(opt, lr, step);
  if (versions_) versions_->after_update();
  // Once per step, after the update: every product of the next step reads it (with versions kept, begin_step
  // swaps in the version the step reads and refreshes it then).
  if (!versions_) refresh_mirror();
}

std::vector<double> DataParallel::tensor_sums(int k, const optim::PieceSums& fn) {
  std::vector<size_t> first(b_.params.params().size() + 1);
  for (size_t t = 0; t < first.size(); t++) first[t] = t * (size_t)k;
  return tensor_sums(first, fn);
}

std::vector<double> DataParallel::tensor_sums(const std::vector<size_t>& first, const optim::PieceSums& fn) {
  const auto& all = b_.params.params();
  const size_t T = all.size();
  MT_ASSERT(first.size() == T + 1, "tensor sums for ", first.size() - 1, " tensors, registry of ", T);
  std::vector<double> sums(first[T], 0.0);
  const float *p = stage_->param_base(), *g = stage_->grad_base();
  for (const optim::Segment& sg : stage_->segments())
    if (first[sg.tensor + 1] > first[sg.tensor]) fn(sg, p + sg.param, g + sg.grad, &sums[first[sg.tensor]]);
  // Over the group that shards each tensor (a sharded stage's pieces tile it there), then over tp for the
  // tensors split there; one float32 all-reduce per group, the other tensors' entries zero in it.
  auto reduce = [&](comm::Communicator* c, const std::function<bool(const nn::Param&)>& over) {
    if (!c || c->size() == 1 || first[T] == 0) return;
    std::vector<float> v(first[T], 0.0f);
    for (size_t t = 0; t < T; t++)
      if (over(all[t]))
        for (size_t j = first[t]; j < first[t + 1]; j++) v[j] = (float)sums[j];
    c->all_reduce(v.data(), v.data(), v.size(), comm::DType::f32, comm::ReduceOp::sum);
    for (size_t t = 0; t < T; t++)
      if (over(all[t]))
        for (size_t j = first[t]; j < first[t + 1]; j++) sums[j] = v[j];
  };
  if (stage_->sharded()) {
    reduce(b_.dp, [](const nn::Param& x) { return !x.expert; });
    reduce(b_.experts, [](const nn::Param& x) { return x.expert; });
  }
  reduce(tp_, [](const nn::Param& x) { return x.shard.axis >= 0; });
  return sums;
}

// ---- Hooks: trace bookkeeping here, the stage's work in between. ----

void DataParallel::before_forward(int g) {
  group_t0_[g] = trace::ChromeTrace::now_us();
  stage_->before_forward(g);
}

void DataParallel::after_forward(int g) {
  if (b_.trace)
    b_.trace->add(trace::Track::compute, "forward " + b_.group_name(g), "compute", group_t0_[g],
                  trace::ChromeTrace::now_us());
  stage_->after_forward(g);
}

void DataParallel::before_backward(int g) {
  group_t0_[g] = trace::ChromeTrace::now_us();
  stage_->before_backward(g);
}

void DataParallel::after_backward(int g) {
  if (b_.trace) {
    b_.trace->add(trace::Track::compute, "backward " + b_.group_name(g), "compute", group_t0_[g],
                  trace::ChromeTrace::now_us());
    b_.poll();
  }
  stage_->after_backward(g);
  for (int i : b_.group_buckets[g]) {
    Bucket& b = *b_.buckets[i];
    if (--b.pending != 0) continue;
    if (!tied_[i])
      stage_->bucket_ready(b);
    else if (std::find(held_.begin(), held_.end(), &b) == held_.end())
      held_.push_back(&b);  // each micro-batch adds to the full gradient it keeps (begin_micro_batch: 1 visit)
  }
}

// ---- Consolidation. ----

void DataParallel::full_params(std::vector<float>& out) { stage_->full_params(out); }
void DataParallel::full_state(const float* shard_state, std::vector<float>& out) {
  stage_->full_state(shard_state, out);
}
void DataParallel::load_full_params(const float* full) {
  stage_->load_full_params(full);
  refresh_mirror();
}
void DataParallel::full_other_params(std::vector<float>& out) {
  MT_ASSERT(versions_, "no other parameter version is kept");
  stage_->full_params_of(versions_->other(), out);
}
void DataParallel::load_full_other_params(const float* full) {
  MT_ASSERT(versions_, "no other parameter version is kept");
  stage_->load_full_params_into(full, versions_->other());
}
void DataParallel::load_full_state(const float* full, float* shard_state) {
  stage_->load_full_state(full, shard_state);
}

}  // namespace mt::parallel
