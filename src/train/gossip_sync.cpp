#include "train/gossip_sync.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "parallel/data/gossip.h"

namespace mt::train {

double consensus_distance(comm::Communicator* group, const float* x, size_t count, uint64_t* sent) {
  const int n = group ? group->size() : 1;
  if (n == 1) return 0.0;
  const uint64_t before = group->counters().total_sent();
  std::vector<float> mean(x, x + count);
  group->all_reduce(mean.data(), mean.data(), count, comm::DType::f32, comm::ReduceOp::sum);
  const float inv = 1.0f / (float)n;
  double sq = 0;
  for (size_t i = 0; i < count; i++) {
    const double d = (double)x[i] - (double)(mean[i] * inv);
    sq += d * d;
  }
  parallel::sum_across(group, &sq, 1);
  if (sent) *sent = group->counters().total_sent() - before;
  return std::sqrt(std::max(0.0, sq) / n);
}

namespace {

class DecentralizedSync : public GradSync {
 public:
  DecentralizedSync(const parallel::Mesh& m, parallel::DataParallel& store, nn::ParamRegistry& p, const SyncOptions& o,
                    trace::ChromeTrace* t)
      : GradSync(m, store, p, t), lowprec_(o.method == SyncMethod::decentralized_lowprec), graph_(o.gossip_graph),
        mix_grads_(!lowprec_ && o.gossip_mix_grads), mix_params_(lowprec_ || o.gossip_mix_params),
        every_(o.consensus_every), steps_(o.steps), mixer_(m.dp(), o.gossip_graph, p.size()),
        lowprec_exchange_(m.dp(), p.size()) {}

  void begin_run(int64_t) override {
    if (lowprec_) lowprec_exchange_.begin(params_.data());
  }
  void reduce(int64_t s) override {
    engine_.finish_backward();
    // The loss is the global batch's mean, so this rank's gradient is its share's sum / items: x dp gives its
    // share's mean (even shares), the gradient a rank stepping alone would take.
    const int n = mesh_.grid().dp();
    if (n > 1) engine_.scale_grads((float)n);
    if (mix_grads_) {
      // g_r <- sum_j W_rj g_j with step s's W, before the clip norm and the optimizer read the gradient.
      trace::TraceScope ts(tracer_, "gossip of gradients (dp neighbours)", "comm");
      mixer_.mix(params_.grad(), s);
    }
  }
  void update(optim::Optimizer& opt, float lr, int64_t s) override {
    engine_.update(opt, lr, s);
    if (mix_params_) {
      trace::TraceScope ts(tracer_, lowprec_ ? "low-precision gossip (dp neighbours)" : "gossip (dp neighbours)",
                           "comm");
      if (lowprec_)
        lowprec_exchange_.exchange(params_.data(), s);
      else
        mixer_.mix(params_.data(), s);
    }
    engine_.refresh_mirror();
    measured_ = every_ > 0 && (s + 1) % every_ == 0;
    if (measured_) measure();
  }
  void settle(int64_t s) override {
    if (s + 1 != steps_ || mesh_.grid().dp() == 1) return;
    // The run's model is the replicas' mean: one all-reduce after the last step (final evaluation, --save).
    uint64_t sent = 0;
    comm::Communicator* dp = mesh_.dp();
    const uint64_t before = dp->counters().total_sent();
    dp->all_reduce(params_.data(), params_.data(), params_.size(), comm::DType::f32, comm::ReduceOp::sum);
    const float inv = 1.0f / (float)dp->size();
    for (size_t i = 0; i < params_.size(); i++) params_.data()[i] *= inv;
    engine_.refresh_mirror();
    sent = dp->counters().total_sent() - before;
    excluded_ += sent;
  }
  uint64_t bytes_sent() const override { return GradSync::bytes_sent() - excluded_; }
  void annotate(nlohmann::json& row) const override {
    if (measured_) row["consensus_distance"] = last_xi_;
  }
  ExchangeReport report(int64_t, int64_t) override {
    ExchangeReport r;
    r.key = "decentralized";
    r.section = {{"method", lowprec_ ? "decentralized-lowprec" : "gossip"},
                 {"mix", mix_grads_ && mix_params_ ? "both" : mix_grads_ ? "grads" : "params"},
                 {"graph", lowprec_ ? "ring" : graph_ == parallel::GossipGraph::ring ? "ring" : "exp"},
                 {"consensus_every", every_},
                 {"consensus_measurements", count_}};
    if (count_ > 0) {
      r.section["consensus_distance_last"] = last_xi_;
      r.section["consensus_distance_max"] = max_xi_;
      r.line = "consensus distance (sqrt of the mean over ranks of |x_r - xbar|^2): last " + std::to_string(last_xi_) +
               ", largest " + std::to_string(max_xi_) + " over " + std::to_string(count_) + " measurements";
    }
    return r;
  }

 private:
  void measure() {
    trace::TraceScope ts(tracer_, "consensus distance (all_reduce of the model, dp)", "comm");
    uint64_t sent = 0;
    last_xi_ = consensus_distance(mesh_.dp(), params_.data(), params_.size(), &sent);
    excluded_ += sent;
    max_xi_ = std::max(max_xi_, last_xi_);
    count_++;
  }

  bool lowprec_;
  parallel::GossipGraph graph_;
  bool mix_grads_, mix_params_;
  int every_;
  int64_t steps_;
  parallel::GossipMixer mixer_;
  parallel::LowPrecisionGossip lowprec_exchange_;
  bool measured_ = false;
  double last_xi_ = 0, max_xi_ = 0;
  int64_t count_ = 0;
  uint64_t excluded_ = 0;  // bytes of measurements and the final average: not the method's
};

}  // namespace

std::unique_ptr<GradSync> make_gossip_sync(const SyncOptions& o, const parallel::Mesh& mesh,
                                           parallel::DataParallel& store, nn::ParamRegistry& params,
                                           trace::ChromeTrace* tracer) {
  return std::make_unique<DecentralizedSync>(mesh, store, params, o, tracer);
}

}  // namespace mt::train
