#include "train/split_exchange.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "train/grad_sync.h"
#include "train/train_config.h"

namespace mt::train {

bool split_exchange_applies(const TrainConfig& cfg, std::string* reason) {
  auto no = [&](const std::string& why) {
    if (reason) *reason = why;
    return false;
  };
  if (SyncOptions::from(cfg).method != SyncMethod::exact) return no("an exchange other than the exact one");
  if (cfg.zero != 0) return no("--zero 1 (the reduce-scatter of ZeRO's buckets is not split)");
  if (cfg.gpt.moe_every > 0) return no("a mixture-of-experts model");
  if (cfg.offload.params || cfg.offload.grads) return no("--offload params/grads");
  if (cfg.adaptive_batch) return no("--adaptive-batch");
  if (cfg.overlap_update) return no("--overlap-update");
  return true;
}

// One step's chain. phase: 0 nothing issued, 1 tie sum and pp loss issued, 2 dp gradient issued, 3 everything
// issued, 4 complete (outcome known).
struct SplitExchange::Step {
  int64_t s = 0;
  int phase = 0;
  std::unique_ptr<AlignedBuffer> grad;
  std::vector<comm::Request> tie;
  comm::Request dp_grad, pp_loss, dp_loss, norm;
  double loss_local = 0;
  float loss_pp[2] = {}, loss_dp[2] = {}, sq[2] = {};  // [0] sent, [1] received
  bool loss_pp_sent = false, loss_dp_sent = false, sq_sent = false;
  double sq_local = 0;
  Outcome out;
};

namespace {
bool many(comm::Communicator* c) { return c && c->size() > 1; }
bool done(comm::Request& r, bool block) {
  if (block) {
    r.wait();
    return true;
  }
  return r.test();
}
}  // namespace

SplitExchange::SplitExchange(nn::ParamRegistry& params, const std::vector<optim::Segment>& segments, Groups groups)
    : params_(params), segs_(segments), g_(groups) {
  const float* g0 = params.grad();
  // The runs of sum_tied (grad_sync.cpp): tensors summed over the tie group whose gradients lie next to each
  // other, in registry order.
  std::vector<const nn::Param*> tied;
  for (const nn::Param& p : params.params()) {
    not_counted_.push_back(!p.replicas.counted);
    if (p.replicas.summed) tied.push_back(&p);
  }
  for (size_t k = 0; k < tied.size();) {
    const float* begin = tied[k]->grad;
    size_t n = tied[k]->numel;
    for (k++; k < tied.size() && tied[k]->grad == begin + n; k++) n += tied[k]->numel;
    tied_runs_.emplace_back((size_t)(begin - g0), n);
  }
  MT_ASSERT(tied_runs_.empty() || g_.tie, "tensors summed over the tie group on a rank outside it");
  MT_ASSERT(g_.replica, "the split exchange is for pipelines (a replica group of tp x pp ranks)");
}

SplitExchange::~SplitExchange() = default;

void SplitExchange::start(int64_t s, double loss_sum) {
  MT_ASSERT(steps_.empty() || steps_.back().s < s, "step ", s, "'s exchange started after step ", steps_.back().s,
            "'s");
  steps_.emplace_back();
  Step& st = steps_.back();
  st.s = s;
  st.loss_local = loss_sum;
  if (!spare_.empty()) {
    st.grad = std::move(spare_.back());
    spare_.pop_back();
  } else {
    st.grad = std::make_unique<AlignedBuffer>(params_.size());
  }
  for (int g = 0; g < params_.num_groups(); g++) params_.settle_grads(g);
  std::memcpy(st.grad->data(), params_.grad(), params_.size() * sizeof(float));
  poll();
}

// Step st's chain as far as it goes without waiting (block: to the end). Returns whether st has issued all of
// its collectives (so the next step may issue).
bool SplitExchange::advance(Step& st, bool block) {
  float* g = st.grad->data();
  if (st.phase == 0) {
    for (auto [off, n] : tied_runs_)
      st.tie.push_back(g_.tie->iall_reduce(g + off, g + off, n, comm::DType::f32, comm::ReduceOp::sum));
    if (many(g_.pp)) {
      st.loss_pp[0] = (float)st.loss_local;
      st.pp_loss = g_.pp->iall_reduce(&st.loss_pp[0], &st.loss_pp[1], 1, comm::DType::f32, comm::ReduceOp::sum);
      st.loss_pp_sent = true;
    }
    st.phase = 1;
  }
  if (st.phase == 1) {
    for (comm::Request& r : st.tie)
      if (!done(r, block)) return false;
    if (many(g_.dp))
      st.dp_grad = g_.dp->iall_reduce(g, g, params_.size(), comm::DType::f32, comm::ReduceOp::sum);
    st.phase = 2;
  }
  if (st.phase == 2) {
    if (!done(st.dp_grad, block) || !done(st.pp_loss, block)) return false;
    issue_tail(st);
    st.phase = 3;
  }
  if (st.phase == 3) {
    if (!done(st.dp_loss, block) || !done(st.norm, block)) return true;
    double loss = st.loss_local;
    if (st.loss_pp_sent) loss = st.loss_pp[1];
    if (st.loss_dp_sent) loss = st.loss_dp[1];
    const double sq = st.sq_sent ? (double)st.sq[1] : st.sq_local;
    st.out = {loss, std::sqrt(std::max(0.0, sq))};
    st.phase = 4;
  }
  return true;
}

// The dp loss and the norm, once the gradient is reduced and the pp loss summed.
void SplitExchange::issue_tail(Step& st) {
  double loss = st.loss_local;
  if (st.loss_pp_sent) loss = st.loss_pp[1];
  if (many(g_.dp)) {
    st.loss_dp[0] = (float)loss;
    st.dp_loss = g_.dp->iall_reduce(&st.loss_dp[0], &st.loss_dp[1], 1, comm::DType::f32, comm::ReduceOp::sum);
    st.loss_dp_sent = true;
  }
  // DataParallel::grad_sq at ZeRO 0 without experts: every segment counted, norms squared and added in segment
  // order, the copies not counted subtracted.
  const float* g = st.grad->data();
  double total = 0, part = 0;
  for (const optim::Segment& sg : segs_) {
    const double n = optim::global_norm(g + sg.grad, sg.count);
    total += n * n;
    if (not_counted_[(size_t)sg.tensor]) part += n * n;
  }
  st.sq_local = total - part;
  if (many(g_.replica)) {
    st.sq[0] = (float)st.sq_local;
    st.norm = g_.replica->iall_reduce(&st.sq[0], &st.sq[1], 1, comm::DType::f32, comm::ReduceOp::sum);
    st.sq_sent = true;
  }
}

void SplitExchange::poll() {
  for (Step& st : steps_)
    if (!advance(st, false)) return;
}

SplitExchange::Outcome SplitExchange::finish(int64_t s, float* grad) {
  MT_ASSERT(!steps_.empty() && steps_.front().s == s, "finishing step ", s, "'s exchange, which is not the oldest");
  Step& st = steps_.front();
  advance(st, true);
  MT_ASSERT(st.phase == 4, "step ", s, "'s exchange did not complete");
  std::memcpy(grad, st.grad->data(), params_.size() * sizeof(float));
  const Outcome out = st.out;
  spare_.push_back(std::move(st.grad));
  steps_.pop_front();
  return out;
}

}  // namespace mt::train
