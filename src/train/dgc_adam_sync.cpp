#include "train/dgc_adam_sync.h"

#include <cmath>

#include "core/error.h"
#include "optim/dgc_adam.h"
#include "parallel/compress/dgc.h"
#include "parallel/compress/dgc_adam.h"
#include "train/exchange_state.h"

namespace mt::train {

namespace {

class DgcAdamSync : public GradSync, public ExchangeState {
 public:
  // The exchange is made at once (its state starts at zero and is set from AdamW's momentum at step K), so a
  // checkpoint after K holds its state and a resume can load it before the first step.
  DgcAdamSync(const parallel::Mesh& m, parallel::DataParallel& store, nn::ParamRegistry& p, const SyncOptions& o,
              trace::ChromeTrace* t)
      : GradSync(m, store, p, t), K_(o.freeze_step), W_(o.dgc.warmup), spec_(o.compress), masking_(o.dgc_masking),
        dense_(o.dgc_dense_vectors), global_(o.dgc_global_topk),
        split_clip_(o.dgc_split_clip),
        exchange_(p, m.dp(), o.compress, o.dgc_masking, o.dgc_dense_vectors, o.dgc_global_topk) {
    MT_CHECK_INPUT(K_ >= 1, "--dgc --freeze-step K needs K >= 1, got ", K_);
  }
  std::vector<std::vector<float>*> state_buffers() override { return exchange_.state_buffers(); }
  std::string state_method() const override {
    return "--compress " + spec_.str() + " --dgc --freeze-step " + std::to_string(K_) +
           (masking_ ? "" : " --dgc-no-masking") + (W_ > 0 ? " --dgc-warmup-steps " + std::to_string(W_) : "") +
           (dense_ ? " --dgc-dense-vectors" : "") + (global_ ? " --dgc-global-topk" : "") +
           (split_clip_ > 0 ? " --dgc-split-clip" : "");
  }
  void reduce(int64_t s) override {
    engine_.finish_backward();
    if (s < K_ && mesh_.grid().dp() > 1) {
      trace::TraceScope ts(tracer_, "all_reduce gradients (dp, DGC AdamW warm-up)", "comm");
      mesh_.dp()->all_reduce(params_.grad(), params_.grad(), params_.size(), comm::DType::f32, comm::ReduceOp::sum);
    }
  }
  void update(optim::Optimizer& opt, float lr, int64_t s) override {
    compressed_ = s >= K_;
    if (compressed_) {
      auto* da = dynamic_cast<optim::DgcAdam*>(&opt);
      MT_ASSERT(da, "the DGC AdamW exchange needs optim::DgcAdam");
      if (precond_.empty()) {  // v is frozen from step K on: D once per run (after a resume too)
        precond_.resize(params_.size());
        da->preconditioner(precond_.data(), precond_.size());
      }
      compress::DgcAdamStepInputs in;
      in.precond = precond_.data();
      in.m0 = s == K_ ? da->momentum() : nullptr;
      in.beta1 = da->beta1();
      in.bc1 = (float)(1.0 - std::pow((double)da->beta1(), (double)s + 1.0));
      in.g_scale = da->take_grad_scale();
      if (split_clip_ > 0) {  // the share clipped at --grad-clip / N by its own norm instead of at --grad-clip
        const double thr = split_clip_ / mesh_.grid().dp(), norm = grad_norm();
        in.g_scale = norm + 1e-6 > thr ? (float)(thr / (norm + 1e-6)) : 1.0f;
      }
      in.density = compress::dgc_density(spec_.ratio, W_, s - K_);  // the sparsity warm-up from K on
      trace::TraceScope ts(tracer_, "DGC AdamW exchange (top-k of the preconditioned update, dp)", "comm");
      exchange_.exchange(params_.grad(), in);
    }
    engine_.update(opt, lr, s);
  }
  void annotate(nlohmann::json& row) const override {
    row["dgc_compressed"] = compressed_;
    if (compressed_) row["dgc_density"] = exchange_.density();
  }

 private:
  int64_t K_, W_;
  compress::CompressSpec spec_;
  bool masking_;
  bool dense_;
  bool global_;
  double split_clip_;  // --dgc-split-clip: --grad-clip (0: off)
  bool compressed_ = false;
  compress::DgcAdamExchange exchange_;
  std::vector<float> precond_;
};

}  // namespace

std::unique_ptr<GradSync> make_dgc_adam_sync(const SyncOptions& o, const parallel::Mesh& mesh,
                                             parallel::DataParallel& store, nn::ParamRegistry& params,
                                             trace::ChromeTrace* tracer) {
  return std::make_unique<DgcAdamSync>(mesh, store, params, o, tracer);
}

}  // namespace mt::train
