#include "train/grad_sync.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "optim/onebit_adam.h"
#include "parallel/compress/onebit.h"
#include "train/gossip_sync.h"
#include "train/offload.h"
#include "train/noise_probe.h"
#include "train/noise_scale.h"
#include "train/dgc_adam_sync.h"
#include "train/exchange_state.h"
#include "train/sma_sync.h"

namespace mt::train {

SyncOptions SyncOptions::from(const TrainConfig& cfg) {
  SyncOptions o;
  o.compress = cfg.compress;
  o.method = cfg.sync == SyncKind::gossip                  ? SyncMethod::gossip
             : cfg.sync == SyncKind::decentralized_lowprec ? SyncMethod::decentralized_lowprec
             : cfg.async == AsyncMode::ps                  ? SyncMethod::parameter_server
             : cfg.optimizer == OptimizerKind::onebit_adam ? SyncMethod::onebit
             : cfg.dgc && cfg.freeze_step >= 0             ? SyncMethod::dgc_adam
             : cfg.learners > 0                            ? SyncMethod::sma
             : o.compress.enabled()                        ? SyncMethod::compressed
             : cfg.local_sgd > 0        ? SyncMethod::local_sgd
                                        : SyncMethod::exact;
  o.engine.zero = cfg.zero;
  o.engine.bucket_mb = cfg.bucket_mb;
  o.engine.grad_dtype = cfg.grad_comm_dtype == GradCommDtype::bf16 ? comm::DType::bf16 : comm::DType::f32;
  o.engine.bf16_mirror = cfg.precision == Precision::bf16;
  o.engine.offload_params = cfg.offload.params;
  o.engine.offload_grads = cfg.offload.grads;
  o.engine.offload_dir = cfg.offload.dir;
  o.engine.offload_timeout_s = cfg.comm_timeout;
  o.engine.offload_events = !cfg.trace.empty();
  o.engine.offload_io_block = offload_io_block(cfg);
  o.engine.overlap_update = cfg.overlap_update && !cfg.delayed_update;
  o.adaptive = {cfg.compress_adaptive, cfg.compress_adaptive_every, cfg.compress_adaptive_eta};
  // DGC: the momentum moves into the exchange with SGD (the optimizer then runs without it: make_optimizer);
  // with AdamW it stays in Adam's moments (m = 0 here). The clip threshold moves into the exchange too.
  o.dgc = {cfg.dgc, cfg.dgc && cfg.optimizer == OptimizerKind::sgd ? (float)cfg.momentum : 0.0f,
           cfg.dgc ? cfg.grad_clip : 0.0, cfg.dgc_warmup};
  o.dgc_masking = !cfg.dgc_no_masking;
  o.dgc_dense_vectors = cfg.dgc_dense_vectors;
  o.dgc_global_topk = cfg.dgc_global_topk;
  o.dgc_split_clip = cfg.dgc_split_clip ? cfg.grad_clip : 0.0;
  o.seed = cfg.seed;
  o.local_every = cfg.local_sgd;
  o.local_warmup = cfg.local_sgd_warmup;
  o.local_state = cfg.local_sgd_state;
  o.freeze_step = cfg.freeze_step;
  o.beta1 = (float)cfg.beta1;
  o.batch_windows = cfg.batch_size;
  o.learners = cfg.learners;
  o.grow = {cfg.adaptive_batch, cfg.adaptive_batch_max, cfg.adaptive_batch_every, cfg.adaptive_batch_every};
  o.sma_alpha = cfg.sma_alpha;
  o.sma_momentum = cfg.sma_momentum;
  o.gossip_graph = cfg.gossip_graph == GossipGraphKind::exp ? parallel::GossipGraph::exp : parallel::GossipGraph::ring;
  o.gossip_mix_grads = cfg.gossip_mix != GossipMixKind::params;  // unset: both
  o.gossip_mix_params = cfg.gossip_mix != GossipMixKind::grads;
  o.consensus_every = cfg.consensus_every;
  o.steps = cfg.steps;
  return o;
}

StoreGroups store_groups(const SyncOptions& o, const parallel::Mesh& mesh) {
  if (o.method == SyncMethod::exact) return {mesh.dp(), mesh.edp()};
  return {};
}

GradSync::GradSync(const parallel::Mesh& mesh, parallel::DataParallel& store, nn::ParamRegistry& params,
                   trace::ChromeTrace* tracer)
    : mesh_(mesh), params_(params), engine_(store), tracer_(tracer) {
  // Each element of the model counted once in the norm (the replica facts say which copy counts: tp rank
  // 0's of a tensor every tp rank holds, the first stage's of a tied one, which holds the summed gradient).
  for (const nn::Param& p : params.params()) not_counted_.push_back(!p.replicas.counted);
}

StepHooks GradSync::hooks() {
  StepHooks h;
  h.params = &engine_;
  h.micro_batch = [this](int i, int n) { engine_.begin_micro_batch(i, n); };
  h.accumulate = [this](int n) { engine_.begin_accumulation(n); };
  return h;
}

uint64_t GradSync::bytes_sent() const {
  uint64_t n = 0;
  for (comm::Communicator* c : {mesh_.dp(), engine_.expert_group()})
    if (c) n += c->counters().total_sent();
  return n;
}

double GradSync::global_loss(double sum) const {
  parallel::sum_across(mesh_.pp(), &sum, 1);  // under a pipeline only the last stage computed it
  parallel::sum_across(mesh_.dp(), &sum, 1);  // tensor-parallel peers hold the same loss
  return sum;
}

void GradSync::step(int64_t s, double loss_sum, double items, const StepTail& tail, optim::Optimizer& opt) {
  reduce(s);
  StepOutcome out;
  out.loss = global_loss(loss_sum) / items;
  out.norm = grad_norm();
  // Clipping is applied by the optimizer as it reads the gradients (one pass over them fewer).
  out.lr = tail.finish(s, out.loss, out.norm, [&](float f) { opt.scale_next_grads(f); });
  {
    trace::TraceScope ts(tracer_, "optimizer step", "compute");
    update(opt, out.lr, s);
  }
  last_ = out;
  if (sink_) sink_(s, out);
}

void GradSync::step_presummed(int64_t s, const PresummedStep& pre, double items, const StepTail& tail,
                              optim::Optimizer& opt) {
  engine_.finish_backward();  // (nothing in flight: the executor called no hooks)
  StepOutcome out;
  out.loss = pre.loss_sum / items;
  out.norm = pre.norm;
  out.lr = tail.finish(s, out.loss, out.norm, [&](float f) { opt.scale_next_grads(f); });
  {
    trace::TraceScope ts(tracer_, "optimizer step", "compute");
    update(opt, out.lr, s);
  }
  last_ = out;
  if (sink_) sink_(s, out);
}

// The update after micro-batch i of m alone (pipedream, pipemare): the registry holds micro-batch i's share of
// the step's mean-loss gradient (the task scales by the step's items), so m times it is the gradient of
// micro-batch i's mean loss (on every dp rank: B/m windows). Reduced, clipped by its own global norm, applied
// with the learning rate of step s as the optimizer's update number s m + i (AdamW's bias correction
// t = s m + i + 1). The step's row gets the mean of the m losses (the global batch's mean loss) and the mean of
// the m pre-clip norms, with the update of micro-batch m - 1.
void GradSync::update_part(int64_t s, double loss_sum, double items, const UpdatePart& part, const StepTail& tail,
                           optim::Optimizer& opt) {
  if (part.outcome_later) {
    MT_ASSERT(part.micro_batch < 0, "a window of steps updates once per step");
    window_step(s, loss_sum, items, tail, opt);
    if (part.window_end) settle_window(tail);
    return;
  }
  if (part.presummed) {
    MT_ASSERT(part.micro_batch < 0, "a presummed update of one micro-batch");
    return step_presummed(s, *part.presummed, items, tail, opt);
  }
  const int i = part.micro_batch, m = part.micro_batches;
  if (i < 0) return step(s, loss_sum, items, tail, opt);
  MT_ASSERT(i < m, "the update of micro-batch ", i, " of ", m);
  reduce(s);
  scale((float)m);
  const double loss = global_loss(loss_sum) / (items / m), norm = grad_norm();
  const float lr = tail.finish(s, loss, norm, [&](float f) { opt.scale_next_grads(f); });
  {
    trace::TraceScope ts(tracer_, "optimizer step (micro-batch)", "compute");
    update(opt, lr, s * m + i);
  }
  engine_.restart_grads();
  if (i == 0) micro_loss_ = micro_norm_ = 0;
  micro_loss_ += loss;
  micro_norm_ += norm;
  if (i < m - 1) return;
  StepOutcome out;
  out.loss = micro_loss_ / m;
  out.norm = micro_norm_ / m;
  out.lr = lr;
  last_ = out;
  if (sink_) sink_(s, out);
}

void GradSync::tie_ready(int64_t) { throw Error("a window of steps run back to back needs the exact exchange"); }
void GradSync::window_step(int64_t, double, double, const StepTail&, optim::Optimizer&) {
  throw Error("a window of steps run back to back needs the exact exchange");
}
void GradSync::settle_window(const StepTail&) {
  throw Error("a window of steps run back to back needs the exact exchange");
}

double GradSync::grad_norm() {
  if (!mesh_.replica()) return engine_.grad_norm();
  auto [all, skip] = engine_.grad_sq(not_counted_);
  double sq[1] = {all - skip};
  parallel::sum_across(mesh_.replica(), sq, 1);  // the parts of one replica add up over its tp x pp ranks
  return std::sqrt(std::max(0.0, sq[0]));
}

namespace {

// Sums the copies' gradients over the tie group, one all-reduce per run of tensors whose gradients lie next to
// each other in the flat buffer (chimera marks every tensor: a few calls instead of one per tensor). Each
// element is a + b over the two copies either way: the same bits.
void sum_tied(comm::Communicator* tie, const std::vector<nn::Param*>& tied) {
  for (size_t k = 0; k < tied.size();) {
    float* begin = tied[k]->grad;
    size_t n = tied[k]->numel;
    for (k++; k < tied.size() && tied[k]->grad == begin + n; k++) n += tied[k]->numel;
    tie->all_reduce(begin, begin, n, comm::DType::f32, comm::ReduceOp::sum);
  }
}

// Exact data parallelism, ZeRO 0-3: the store reduces bucket by bucket during backward when the step
// executor calls its hooks (the micro-batch loop; a pipeline's executor under ZeRO 2 and 3, once per step
// after each bucket's last micro-batch); a pipeline's executor under ZeRO 0 and 1 calls none, so then the
// whole gradient is reduced once the list is over. Copies of a tied tensor (first and last stage) are summed
// over the tie group first: with hooks, the store holds the buckets that contain them unreduced until then.
class ExactSync : public GradSync {
 public:
  ExactSync(const parallel::Mesh& m, parallel::DataParallel& store, nn::ParamRegistry& p, const SyncOptions& o,
            trace::ChromeTrace* t)
      : GradSync(m, store, p, t), zero_(o.engine.zero), overlapped_(o.overlapped), windows_(o.batch_windows),
        probe_(p, probe_mode(m, o)), grow_opts_(o.grow), probe_off_(o.engine.offload_grads) {
    for (nn::Param& x : p.params())
      if (x.replicas.summed) tied_.push_back(&x);
  }
  // --adaptive-batch (adaptive_batch.h): the optimizer steps once per k data steps, on their mean gradient;
  // the optimizer's step count is its own (updates so far), so k = 1 is the plain run. The k data steps are
  // one accumulation to the store: the gradient starts over only at the first (begin_step), the micro-batches
  // are numbered across the k data steps (so the buckets are reduced once, after the k-th's last one), and the
  // noise probe sees k n small batches of one big batch of k B0.
  int k_now() const { return grow_ ? grow_->k() : 1; }
  int j_now() const { return grow_ ? grow_->position() : 0; }
  void begin_run(int64_t first) override { updates_ = first; }
  void begin_step(int64_t s) override {
    t_step0_ = trace::ChromeTrace::now_us();
    if (j_now() == 0) GradSync::begin_step(s);
  }
  void update(optim::Optimizer& opt, float lr, int64_t s) override {
    if (!grow_opts_.enabled) return GradSync::update(opt, lr, s);
    MT_ASSERT(grow_, "the adaptive batch starts at the first step");
    const double t0 = trace::ChromeTrace::now_us();
    t_compute_ = (t_exchange0_ - t_step0_) * 1e-6;  // to the end of the last backward (reduce's start)
    t_exchange_ = (t0 - t_exchange0_) * 1e-6;       // the reduction's rest, the loss and norm all-reduces
    MT_ASSERT(grow_->count_data_step(), "the optimizer steps at the k-th data step only");
    engine_.update(opt, lr * grow_->lr_scale(), updates_++);
    t_update_ = (trace::ChromeTrace::now_us() - t0) * 1e-6;
  }
  // A data step before the k-th: its gradient stays in the store, unreduced; its row has the global batch's
  // loss (one scalar all-reduce), the learning rate of the schedule, and the last optimizer step's gradient
  // norm (no norm exists for it; `updated` false says so).
  void accumulate_only(int64_t s, double loss_sum, double items, const StepTail& tail) {
    engine_.finish_backward();  // nothing is in flight: the buckets wait for the k-th data step
    t_compute_ = (trace::ChromeTrace::now_us() - t_step0_) * 1e-6;
    t_exchange_ = t_update_ = -1;
    MT_ASSERT(!grow_->count_data_step(), "a data step before the k-th");
    StepOutcome out;
    out.loss = global_loss(loss_sum) / items;
    out.norm = last_.norm;
    tail.check(s, out.loss, out.norm);
    out.lr = tail.lr(s);
    last_ = out;
    if (sink_) sink_(s, out);
  }
  // The gradient noise scale's small batches are measured between the model and the store (noise_probe.h):
  // every layout but expert parallelism (a small batch's expert gradients are then computed on the ranks holding
  // the experts, so its gradient is nowhere whole) and offloaded gradient shards.
  static NoiseProbe::Mode probe_mode(const parallel::Mesh& m, const SyncOptions& o) {
    if (m.grid().pp() > 1) return o.overlapped ? NoiseProbe::Mode::last : NoiseProbe::Mode::whole;
    return o.engine.zero > 1 ? NoiseProbe::Mode::fresh : NoiseProbe::Mode::delta;
  }
  StepHooks hooks() override {
    StepHooks h = GradSync::hooks();
    if (grow_opts_.enabled)
      h.micro_batch = [this](int i, int n) {
        const int j = j_now(), k = k_now();
        engine_.begin_micro_batch(j * n + i, k * n);
      };
    if (mesh_.grid().ep() > 1 || probe_off_) return h;
    if (mesh_.grid().pp() == 1 && !overlapped_) return h;  // (the micro-batch loop always calls the hooks)
    probing_ = true;
    if (probe_.mode() == NoiseProbe::Mode::whole) return h;  // the executor calls no hooks: reduce() measures
    probe_.set_inner(h.params);
    h.params = &probe_;
    h.micro_batch = [this](int i, int n) {
      const int j = j_now(), k = k_now();  // (the adaptive batch's data step j of k; else 0 of 1)
      probe_.begin_micro_batch(j * n + i, k * n);
      engine_.begin_micro_batch(j * n + i, k * n);
    };
    h.accumulate = [this](int n) {
      probe_.begin_accumulation(n);
      engine_.begin_accumulation(n);
    };
    return h;
  }
  void step(int64_t s, double loss_sum, double items, const StepTail& tail, optim::Optimizer& opt) override {
    if (grow_opts_.enabled && !grow_) grow_ = std::make_unique<AdaptiveBatch>(grow_opts_, items);
    const int k = k_now();
    const bool last = j_now() + 1 == k;  // the optimizer steps (always, without --adaptive-batch)
    if (last)
      GradSync::step(s, loss_sum, items, tail, opt);
    else
      accumulate_only(s, loss_sum, items, tail);
    noise_valid_ = false;
    if (last) measure_noise(probe_.local_sum(), items, k);
    if (grow_) {
      const double b = !noise_valid_ || !noise_.last().valid ? std::nan("")
                       : noise_.g2() > 0                      ? noise_.b_simple()
                                                              : std::numeric_limits<double>::infinity();
      // Each rank measured its own times; a decision uses the largest over all ranks (the slowest rank sets a
      // synchronous step's pace), so that every rank chooses the same k (one 3-element all-reduce per decision).
      double t[3] = {t_compute_, t_exchange_, t_update_};
      if (const auto pin = pinned_step_times(mesh_.world_rank())) {
        t[0] = pin->compute;
        if (t_update_ >= 0) t[1] = pin->exchange, t[2] = pin->update;
      }
      comm::Communicator* world = mesh_.world();
      if (world && world->size() > 1 && grow_->decides(s, t_update_ >= 0)) {
        float in[3] = {(float)t[0], (float)t[1], (float)t[2]}, out[3];
        world->all_reduce(in, out, 3, comm::DType::f32, comm::ReduceOp::max);
        for (int i = 0; i < 3; i++) t[i] = out[i];
      }
      grow_->observe(s, t[0], t[1], t[2], b);
    }
  }
  // After the optimizer step (last_ holds its norm): one scalar over dp and the replica's other parts, the sum
  // over every small batch of |c|^2 (local: this rank's). The big batch is the optimizer step's k global batches.
  void measure_noise(double local, double items, int k) {
    noise_valid_ = false;
    if (!probing_) return;
    double sum[1] = {local};
    parallel::sum_across(mesh_.dp(), sum, 1);
    if (mesh_.replica()) parallel::sum_across(mesh_.replica(), sum, 1);
    const int M = probe_.small_batches() * mesh_.grid().dp();
    noise_valid_ = windows_ % (M / k) == 0;  // an even split of the windows (the small batches are equal)
    if (noise_valid_) noise_.add({sum[0] * M, last_.norm * last_.norm, k * items / M, k * items});
  }
  void noise_fields(nlohmann::json& row) const {
    if (!probing_ || !noise_valid_ || !noise_.last().valid) return;
    row["noise_scale"] = noise_.b_simple();  // moving-average B_simple (noise_scale.h)
    row["noise_g2"] = noise_.last().g2;       // this step's |G|^2 and tr(Sigma) estimates
    row["noise_trace"] = noise_.last().trace;
  }
  void annotate(nlohmann::json& row) const override {
    if (grow_) grow_->annotate(row);
    noise_fields(row);
  }
  // The adaptive batch's k data steps: their summed mean gradients, divided by k (a power of 2: exact).
  void average_k() {
    if (k_now() > 1) engine_.scale_grads(1.0f / (float)k_now());
  }
  // ---- A window of steps run back to back (train/sync_window_steps.h). ----
  // The last stage: its copies' gradients are final (its last input half of step s has run); they leave now, a
  // copy of them, so the stage's later work of the step does not wait for the first stage.
  void tie_ready(int64_t s) override {
    comm::Communicator* tie = mesh_.group(parallel::MeshGroup::tie);
    if (tied_.empty() || !tie) return;
    MT_ASSERT(tie->size() == 2 && tie->rank() == 1, "the tied copies' early send is the last stage's");
    tie_send_req_.wait();  // the previous step's copy has left
    pack_tied(tie_send_);
    tie_send_req_ = tie->isend(tie_send_.data(), tie_send_.size(), comm::DType::f32, 0, kTieTag);
    tie_sent_ = s;
  }
  // step() without what needs other stages first: the tie sum point to point (the first stage sends its copy and
  // receives the last stage's, sent at tie_ready; the last stage receives the first's), each end adding a + b as
  // the all-reduce does (the same bits either way round); the dp reduction; the norm's local part; the update at
  // the schedule's rate. The loss, the norm and the noise probe's sums wait for settle_window.
  void window_step(int64_t s, double loss_sum, double items, const StepTail& tail, optim::Optimizer& opt) override {
    MT_ASSERT(!grow_opts_.enabled && mesh_.replica(), "a window of steps without the adaptive batch, at pp > 1");
    engine_.finish_backward();
    comm::Communicator* tie = mesh_.group(parallel::MeshGroup::tie);
    if (!tied_.empty() && tie) {
      const double t0 = trace::ChromeTrace::now_us();
      MT_ASSERT(tie->size() == 2, "a tie group of ", tie->size(), " ranks");
      if (tie->rank() == 0) {
        tie_send_req_.wait();
        pack_tied(tie_send_);
        tie_send_req_ = tie->isend(tie_send_.data(), tie_send_.size(), comm::DType::f32, 1, kTieTag);
      } else {
        MT_ASSERT(tie_sent_ == s, "the last stage reached the update of step ", s, " without sending its tied copies");
      }
      tie_recv_.resize(tie_send_.size());
      tie->recv(tie_recv_.data(), tie_recv_.size(), comm::DType::f32, 1 - tie->rank(), kTieTag);
      size_t k = 0;
      for (nn::Param* x : tied_)
        for (size_t e = 0; e < x->numel; e++, k++) x->grad[e] = x->grad[e] + tie_recv_[k];
      if (tracer_->enabled())
        tracer_->add(trace::Track::comm, "tied tensors (first + last stage, point to point)", "comm", t0,
                     trace::ChromeTrace::now_us());
    }
    if (probing_) {  // as reduce() measures (noise_probe.h): the local gradient, tied copies after their sum
      if (probe_.mode() == NoiseProbe::Mode::whole) probe_.add_whole();
      probe_.add_tensors_summed();
    }
    engine_.reduce_all();
    noise_valid_ = false;  // the loop's row of this step gets its noise fields with the outcome (settle_window)
    auto [all, skip] = engine_.grad_sq(not_counted_);
    Deferred d{s, loss_sum, items, all - skip, tail.lr(s), probing_ ? probe_.local_sum() : 0.0};
    {
      trace::TraceScope ts(tracer_, "optimizer step", "compute");
      update(opt, d.lr, s);
    }
    deferred_.push_back(d);
  }
  // Step by step as step() reduces them: the loss over pp then dp, the norm's parts over the replica.
  void settle_window(const StepTail& tail) override {
    tie_send_req_.wait();
    std::vector<Deferred> ds;
    ds.swap(deferred_);
    for (const Deferred& d : ds) {
      StepOutcome out;
      out.loss = global_loss(d.loss_sum) / d.items;
      double sq[1] = {d.sq};
      parallel::sum_across(mesh_.replica(), sq, 1);
      out.norm = std::sqrt(std::max(0.0, sq[0]));
      tail.check(d.s, out.loss, out.norm);
      out.lr = d.lr;
      last_ = out;
      measure_noise(d.probe, d.items, 1);
      out.fields = nlohmann::json::object();
      noise_fields(out.fields);
      if (sink_) sink_(d.s, out);
    }
  }
  void end_run() override { tie_send_req_.wait(); }

  void reduce(int64_t) override {
    t_exchange0_ = trace::ChromeTrace::now_us();  // the adaptive batch's t_compute ends, t_exchange starts
    engine_.finish_backward();
    if (overlapped_ && tied_.empty()) return average_k();
    const double t0 = trace::ChromeTrace::now_us();
    comm::Communicator* tie = mesh_.group(parallel::MeshGroup::tie);
    sum_tied(tie, tied_);
    if (probing_) {  // under a pipeline: this rank's local gradient, before the dp reduction (noise_probe.h)
      if (probe_.mode() == NoiseProbe::Mode::whole) probe_.add_whole();
      probe_.add_tensors_summed();
    }
    const double t1 = trace::ChromeTrace::now_us();
    if (!overlapped_)
      engine_.reduce_all();
    else
      engine_.reduce_held();
    if (tracer_->enabled()) {
      if (!tied_.empty())
        tracer_->add(trace::Track::comm, "all_reduce tied tensors (first + last stage)", "comm", t0, t1);
      if (!overlapped_ && mesh_.grid().dp() > 1)
        tracer_->add(trace::Track::comm, zero_ ? "reduce_scatter gradients (dp)" : "all_reduce gradients (dp)",
                     "comm", t1, trace::ChromeTrace::now_us());
    }
    average_k();
  }

 private:
  int zero_;
  bool overlapped_;
  int windows_;
  std::vector<nn::Param*> tied_;  // copies summed over the tie group (the tied embedding on both ends)
  // A window of steps: what settle_window reduces per step; the tied copies on their way.
  struct Deferred {
    int64_t s;
    double loss_sum, items, sq;
    float lr;
    double probe;  // the noise probe's local sum (probing_)
  };
  std::vector<Deferred> deferred_;
  static constexpr int kTieTag = 0x7e1;
  std::vector<float> tie_send_, tie_recv_;
  comm::Request tie_send_req_;
  int64_t tie_sent_ = -1;
  void pack_tied(std::vector<float>& buf) const {
    size_t n = 0;
    for (const nn::Param* x : tied_) n += x->numel;
    buf.resize(n);
    size_t k = 0;
    for (const nn::Param* x : tied_) {
      std::memcpy(buf.data() + k, x->grad, sizeof(float) * x->numel);
      k += x->numel;
    }
  }
  NoiseProbe probe_;
  NoiseScale noise_;
  bool probing_ = false, noise_valid_ = false;
  AdaptiveBatchOptions grow_opts_;
  bool probe_off_;  // --offload grads: the shards' gradients pass through files (not measured)
  std::unique_ptr<AdaptiveBatch> grow_;
  int64_t updates_ = 0;
  double t_step0_ = 0, t_exchange0_ = 0, t_compute_ = 0, t_exchange_ = -1, t_update_ = -1;
};

// The tensors whose copies hold parts of one gradient (the tied embedding on the first and last stage), and
// their sum over the tie group: a + b on both ends, the same bits whatever each part went through before.
class TiedCopies {
 public:
  explicit TiedCopies(nn::ParamRegistry& p) {
    for (nn::Param& x : p.params())
      if (x.replicas.summed) tied_.push_back(&x);
  }
  void sum(const parallel::Mesh& mesh, trace::ChromeTrace* tracer) {
    if (tied_.empty()) return;
    trace::TraceScope ts(tracer, "all_reduce tied tensors (first + last stage)", "comm");
    sum_tied(mesh.group(parallel::MeshGroup::tie), tied_);
  }

 private:
  std::vector<nn::Param*> tied_;
};

// Compressed exchange (parallel/compress): the codec moves what it chooses over the dp group of this rank's
// (tp, pp) coordinate, after the whole backward (a pipeline's schedule included), on this rank's part of the
// replica: a tp shard is a tensor of its own to the codec (its own top-k, quantization buckets, PowerSGD
// factors of the shard's [rows, cols] and error-feedback residual). Tied copies: each stage exchanges its part
// over its dp group, then the parts are summed over the tie group. Summing first would give both ends the same
// tensor to encode, but a codec's draws and residuals are per tensor of a rank's registry, so the two ends'
// exchanged copies could differ; summed after, they are equal by construction, and the bytes are the same.
class CompressedSync : public GradSync, public ExchangeState {
 public:
  CompressedSync(const parallel::Mesh& m, parallel::DataParallel& store, nn::ParamRegistry& p, const SyncOptions& o,
                 trace::ChromeTrace* t)
      : GradSync(m, store, p, t),
        spec_(o.compress),
        exchange_(p, m.dp(), o.compress, o.adaptive, o.seed, m.tp(), o.dgc),
        dgc_(o.dgc.enabled),
        adaptive_(o.adaptive.enabled),
        tied_(p) {}
  void reduce(int64_t s) override {
    engine_.finish_backward();
    {
      trace::TraceScope ts(tracer_, "compressed gradient exchange (" + spec_.str() + ")", "comm");
      exchange_.exchange(s);
    }
    tied_.sum(mesh_, tracer_);
  }
  void annotate(nlohmann::json& row) const override {
    if (dgc_) {
      row["dgc_density"] = exchange_.density();
      row["dgc_clip"] = exchange_.clip_factor();
    }
    if (!adaptive_) return;
    row["compress_light"] = exchange_.light_fraction();
    row["compress_levels"] = exchange_.light_layers();
  }
  std::vector<std::vector<float>*> state_buffers() override { return exchange_.state_buffers(); }
  std::string state_method() const override { return "--compress " + spec_.str() + (dgc_ ? " --dgc" : ""); }

 private:
  compress::CompressSpec spec_;
  compress::GradientExchange exchange_;
  bool dgc_, adaptive_;
  TiedCopies tied_;
};

// Local SGD (post-local): exact steps during the warm-up, then each rank steps on its own share's mean and
// the replicas (and optionally the optimizer state) are averaged every H steps. Everything runs over the dp
// group of this rank's (tp, pp) coordinate, on this rank's part of the replica: the tp and pp ranks of one
// replica step together (one clip norm over the replica), so the parts stay one model between syncs. The
// tied copies' parts are summed over the tie group every step (local or not: they are one parameter); both
// ends then step and average the same values, so the copies stay equal.
class LocalSgdSync : public GradSync {
 public:
  LocalSgdSync(const parallel::Mesh& m, parallel::DataParallel& store, nn::ParamRegistry& p, const SyncOptions& o,
               trace::ChromeTrace* t)
      : GradSync(m, store, p, t), H_(o.local_every), warmup_(o.local_warmup), state_(o.local_state), tied_(p) {}
  void reduce(int64_t s) override {
    engine_.finish_backward();
    tied_.sum(mesh_, tracer_);
    local_ = s >= warmup_;
    const int n = mesh_.grid().dp();
    if (!local_ && n > 1)
      mesh_.dp()->all_reduce(params_.grad(), params_.grad(), params_.size(), comm::DType::f32, comm::ReduceOp::sum);
    else if (local_)
      engine_.scale_grads((float)n);
  }
  void update(optim::Optimizer& opt, float lr, int64_t s) override {
    engine_.update(opt, lr, s);
    synced_ = local_ && (s + 1 - warmup_) % H_ == 0;
    if (synced_) average(opt);
  }
  void annotate(nlohmann::json& row) const override { row["synced"] = !local_ || synced_; }
  void before_gather(optim::Optimizer& opt) override { average(opt); }

 private:
  void average(optim::Optimizer& opt) {
    const int n = mesh_.grid().dp();
    if (n == 1) return;
    auto mean = [&](float* v, size_t count) {
      mesh_.dp()->all_reduce(v, v, count, comm::DType::f32, comm::ReduceOp::sum);
      const float inv = 1.0f / (float)n;
      for (size_t i = 0; i < count; i++) v[i] *= inv;
    };
    mean(params_.data(), params_.size());
    engine_.refresh_mirror();
    if (state_)
      for (size_t k = 0; k < opt.state().count(); k++) opt.state().visit(k, true, mean);
  }
  int H_;
  int64_t warmup_;
  bool state_, local_ = false, synced_ = false;
  TiedCopies tied_;
};

// 1-bit Adam's exchange (parallel/compress/onebit.h): exact data parallelism for steps < K (the whole gradient
// all-reduced once the backward is over), then no gradient exchange: the update first mixes this rank's
// gradient share into the synchronized momentum and exchanges that as signs (OnebitMomentumExchange), and the
// optimizer (optim::OnebitAdam) takes the result as its momentum. After K the step's norm is this rank's
// share's (no communication), so --grad-clip clips each rank's share.
class OnebitSync : public GradSync, public ExchangeState {
 public:
  // The momentum exchange is made at once (its errors start at zero, used from step K on), so a checkpoint
  // after K holds its errors and a resume can load them before the first step.
  OnebitSync(const parallel::Mesh& m, parallel::DataParallel& store, nn::ParamRegistry& p, const SyncOptions& o,
             trace::ChromeTrace* t)
      : GradSync(m, store, p, t), K_(o.freeze_step), b1_(o.beta1), tied_(p),
        exchange_(std::make_unique<compress::OnebitMomentumExchange>(p, m.dp(), o.beta1)) {}
  std::vector<std::vector<float>*> state_buffers() override { return exchange_->state_buffers(); }
  std::string state_method() const override { return "--optimizer onebit-adam"; }
  void reduce(int64_t s) override {
    engine_.finish_backward();
    tied_.sum(mesh_, tracer_);
    if (s < K_ && mesh_.grid().dp() > 1) {
      trace::TraceScope ts(tracer_, "all_reduce gradients (dp, 1-bit Adam warm-up)", "comm");
      mesh_.dp()->all_reduce(params_.grad(), params_.grad(), params_.size(), comm::DType::f32, comm::ReduceOp::sum);
    }
  }
  void update(optim::Optimizer& opt, float lr, int64_t s) override {
    if (s >= K_) {
      auto* ob = dynamic_cast<optim::OnebitAdam*>(&opt);
      MT_ASSERT(ob, "the 1-bit Adam exchange needs optim::OnebitAdam");
      MT_ASSERT(ob->beta1() == b1_, "1-bit Adam's beta1 ", ob->beta1(), " differs from the exchange's ", b1_);
      compressed_ = true;
      trace::TraceScope ts(tracer_, "1-bit momentum exchange (dp)", "comm");
      exchange_->exchange(params_.grad(), ob->take_grad_scale(), ob->momentum(), params_.grad());
    }
    engine_.update(opt, lr, s);
  }
  void annotate(nlohmann::json& row) const override { row["onebit_compressed"] = compressed_; }

 private:
  int64_t K_;
  float b1_;
  bool compressed_ = false;
  TiedCopies tied_;
  std::unique_ptr<compress::OnebitMomentumExchange> exchange_;
};

}  // namespace

std::unique_ptr<GradSync> make_grad_sync(const SyncOptions& o, const parallel::Mesh& mesh,
                                         parallel::DataParallel& store, nn::ParamRegistry& params,
                                         trace::ChromeTrace* tracer) {
  switch (o.method) {
    case SyncMethod::exact:
      return std::make_unique<ExactSync>(mesh, store, params, o, tracer);
    case SyncMethod::compressed:
      return std::make_unique<CompressedSync>(mesh, store, params, o, tracer);
    case SyncMethod::local_sgd:
      return std::make_unique<LocalSgdSync>(mesh, store, params, o, tracer);
    case SyncMethod::onebit:
      return std::make_unique<OnebitSync>(mesh, store, params, o, tracer);
    case SyncMethod::sma:
      return make_sma_sync(o, mesh, store, params, tracer);
    case SyncMethod::gossip:
    case SyncMethod::decentralized_lowprec:
      return make_gossip_sync(o, mesh, store, params, tracer);
    case SyncMethod::dgc_adam:
      return make_dgc_adam_sync(o, mesh, store, params, tracer);
    case SyncMethod::parameter_server:
      break;  // the parameter-server exchanges need the server layout: make_ps_parts (ps_sync.h)
  }
  MT_ASSERT(false, "make_grad_sync builds the synchronous exchanges only (parameter server: make_ps_parts)");
  return nullptr;
}

}  // namespace mt::train
