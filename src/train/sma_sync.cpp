#include "train/sma_sync.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "train/exchange_state.h"
#include "train/layout.h"
#include "train/sma.h"

namespace mt::train {

namespace {

class SmaSync : public GradSync, public ExchangeState {
 public:
  SmaSync(const parallel::Mesh& m, parallel::DataParallel& store, nn::ParamRegistry& p, const SyncOptions& o,
          trace::ChromeTrace* t)
      : GradSync(m, store, p, t), L_(o.learners), k_(o.learners * m.grid().dp()),
        alpha_(o.sma_alpha >= 0 ? (float)o.sma_alpha : 1.0f / (float)(o.learners * m.grid().dp())),
        mu_((float)o.sma_momentum), n_(p.size()) {
    w_.assign((size_t)L_, std::vector<float>(n_));
    g_.assign((size_t)L_, std::vector<float>(n_));
    z_.assign(p.data(), p.data() + n_);
    z_prev_ = z_;
    csum_.assign(n_, 0.0f);
    norms_.assign((size_t)L_, 0.0);
  }

  StepHooks hooks() override {
    StepHooks h = GradSync::hooks();
    h.micro_batch = [this](int i, int m) {
      select(i * L_ / m);
      engine_.begin_micro_batch(i, m);
    };
    h.accumulate = nullptr;  // a pipeline's interleaved micro-batches have no learner boundary (refused)
    return h;
  }

  // Each learner's copy of the optimizer's buffers, sized by the optimizer's state store (so that a resume can
  // read them into place before the first step).
  void attach_optimizer(optim::Optimizer& opt) override {
    opt_ = &opt;
    optim::StateStore& st = opt.state();
    state_.assign((size_t)L_, {});
    for (auto& sj : state_)
      for (size_t b = 0; b < st.count(); b++) sj.emplace_back(st.size(b), 0.0f);
  }

  void begin_run(int64_t) override {
    // z is the registry's weights: the initialization, --init, or the checkpoint's central model.
    z_.assign(params_.data(), params_.data() + n_);
    if (loaded_) return;  // the learners, their optimizer state and z_prev came from the checkpoint
    // Otherwise every learner and z_prev start from z, and each learner from the optimizer's state as the run
    // found it (zeros, or a checkpoint's without the learners' own).
    z_prev_ = z_;
    for (auto& w : w_) w = z_;
    MT_ASSERT(opt_, "the SMA exchange was given no optimizer");
    optim::StateStore& st = opt_->state();
    for (auto& sj : state_)
      for (size_t b = 0; b < st.count(); b++)
        st.visit(b, false, [&](float* v, size_t n) { std::copy(v, v + n, sj[b].begin()); });
  }

  // Checkpoints (exchange_state.h): this rank's learners' weights, z_prev, and each learner's optimizer
  // buffers; z is the checkpoint's model (the registry between steps).
  std::vector<std::vector<float>*> state_buffers() override {
    std::vector<std::vector<float>*> out;
    for (auto& w : w_) out.push_back(&w);
    out.push_back(&z_prev_);
    for (auto& sj : state_)
      for (auto& b : sj) out.push_back(&b);
    return out;
  }
  std::string state_method() const override {
    return str("sma learners ", L_, " alpha ", alpha_, " momentum ", mu_);
  }
  void state_loaded() override { loaded_ = true; }
  std::string state_fallback() const override {
    return "the learners and z_prev restart from the checkpoint's central model, each learner with the "
           "checkpoint's optimizer state (the run no longer equals the unbroken one)";
  }

  void reduce(int64_t) override {
    engine_.finish_backward();
    stash();
    // The accumulated gradient is that of the global-batch mean loss; learner j's own mean over its B / k
    // windows is k times its part.
    const float f = (float)k_;
    for (int j = 0; j < L_; j++) {
      float* g = g_[(size_t)j].data();
      for (size_t i = 0; i < n_; i++) g[i] *= f;
      norms_[(size_t)j] = optim::global_norm(g, n_);
    }
  }

  void step(int64_t s, double loss_sum, double items, const StepTail& tail, optim::Optimizer& opt) override {
    reduce(s);
    StepOutcome out;
    out.loss = global_loss(loss_sum) / items;
    double sq[1] = {0};
    for (double x : norms_) sq[0] += x * x;
    parallel::sum_across(mesh_.dp(), sq, 1);
    out.norm = std::sqrt(sq[0] / (double)k_);
    tail.check(s, out.loss, out.norm);
    out.lr = tail.lr(s);
    {
      trace::TraceScope ts(tracer_, "optimizer step (" + std::to_string(L_) + " learners)", "compute");
      learners_update(opt, tail, out.lr, s);
    }
    {
      trace::TraceScope ts(tracer_, "all_reduce model corrections (dp, SMA)", "comm");
      if (mesh_.grid().dp() > 1)
        mesh_.dp()->all_reduce(csum_.data(), csum_.data(), n_, comm::DType::f32, comm::ReduceOp::sum);
    }
    sma_center(z_.data(), z_prev_.data(), csum_.data(), mu_, n_);
    std::copy(z_.begin(), z_.end(), params_.data());  // between steps the registry holds z
    engine_.refresh_mirror();
    last_ = out;
    if (sink_) sink_(s, out);
  }

  // Unused: step() above does the whole update (learner by learner).
  void update(optim::Optimizer&, float, int64_t) override {}

  void annotate(nlohmann::json& row) const override {
    row["learners"] = k_;
    row["sma_alpha"] = alpha_;
  }

 private:
  // Before learner j's first micro-batch: keep the gradient of the learner before, start j's from zero, and
  // put j's weights in the registry.
  void select(int j) {
    if (j == cur_ && started_) return;
    if (started_) stash();
    std::fill(params_.grad(), params_.grad() + n_, 0.0f);
    std::copy(w_[(size_t)j].begin(), w_[(size_t)j].end(), params_.data());
    engine_.refresh_mirror();
    cur_ = j;
    started_ = true;
  }
  void stash() {
    MT_ASSERT(started_, "the SMA exchange saw no micro-batch (the step executor must call the hooks)");
    std::copy(params_.grad(), params_.grad() + n_, g_[(size_t)cur_].begin());
    started_ = false;
  }

  void learners_update(optim::Optimizer& opt, const StepTail& tail, float lr, int64_t s) {
    optim::StateStore& st = opt.state();
    MT_ASSERT(&opt == opt_ && state_.size() == (size_t)L_, "the SMA exchange updates with the optimizer it was given");
    std::fill(csum_.begin(), csum_.end(), 0.0f);
    for (int j = 0; j < L_; j++) {
      std::vector<std::vector<float>>& sj = state_[(size_t)j];
      for (size_t b = 0; b < st.count(); b++)
        st.visit(b, true, [&](float* v, size_t n) { std::copy(sj[b].begin(), sj[b].begin() + (long)n, v); });
      float* w = w_[(size_t)j].data();
      std::copy(w, w + n_, params_.data());
      std::copy(g_[(size_t)j].begin(), g_[(size_t)j].end(), params_.grad());
      const float clip = tail.clip_factor(norms_[(size_t)j]);
      if (clip != 1.0f) opt.scale_next_grads(clip);
      engine_.update(opt, lr, s);
      sma_correct(params_.data(), w, z_.data(), alpha_, csum_.data(), n_);
      std::copy(params_.data(), params_.data() + n_, w);
      for (size_t b = 0; b < st.count(); b++)
        st.visit(b, false, [&](float* v, size_t n) { std::copy(v, v + n, sj[b].begin()); });
    }
  }

  int L_, k_;
  float alpha_, mu_;
  size_t n_;
  std::vector<std::vector<float>> w_, g_;           // per learner on this rank: weights, gradient
  std::vector<std::vector<std::vector<float>>> state_;  // per learner: the optimizer's buffers
  std::vector<float> z_, z_prev_, csum_;
  std::vector<double> norms_;
  int cur_ = 0;
  bool started_ = false;
  optim::Optimizer* opt_ = nullptr;
  bool loaded_ = false;  // a resume read the learners' state (state_loaded)
};

}  // namespace

std::unique_ptr<GradSync> make_sma_sync(const SyncOptions& o, const parallel::Mesh& mesh,
                                        parallel::DataParallel& store, nn::ParamRegistry& params,
                                        trace::ChromeTrace* tracer) {
  return std::make_unique<SmaSync>(mesh, store, params, o, tracer);
}

void check_learners(const TrainConfig& c, int d) {
  MT_CHECK_INPUT(c.learners >= 0, "--learners must be >= 0, got ", c.learners);
  MT_CHECK_INPUT(c.learners > 0 || (c.sma_alpha < 0 && c.sma_momentum == 0),
                 "--sma-alpha and --sma-momentum need --learners L");
  if (c.learners == 0) return;
  MT_CHECK_INPUT(c.sma_alpha < 0 || c.sma_alpha <= 1, "--sma-alpha must be in [0, 1], got ", c.sma_alpha);
  MT_CHECK_INPUT(c.sma_momentum >= 0 && c.sma_momentum < 1, "--sma-momentum must be in [0, 1), got ",
                 c.sma_momentum);
  const BatchLayout layout(c, d);
  MT_CHECK_INPUT(layout.micro_count() % c.learners == 0, "--learners ", c.learners, " needs a multiple of ",
                 c.learners, " micro-batches per data-parallel rank (each learner trains on its own), got ",
                 layout.micro_count(), " (--batch-size ", c.batch_size, " over ", d, " ranks, --micro-batch-size ",
                 layout.micro_size(), "); set --micro-batch-size so that --batch-size / (dp x it) is a multiple of ",
                 c.learners);
}

}  // namespace mt::train
