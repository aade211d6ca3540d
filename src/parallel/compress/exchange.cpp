#include "parallel/compress/exchange.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"
#include "parallel/compress/codec.h"
#include "tensor/blas.h"

namespace mt::compress {

namespace {

// Orthonormalizes the R columns of P [rows, R] (row-major) in place: modified Gram-Schmidt, each column projected
// out twice ("twice is enough": one pass leaves float rounding of the size of the removed part, which matters
// when little is left). A column with nothing of its own left (below 1e-4 of its length before projection: P has
// lower rank than R, e.g. the summed gradient has rank < R) becomes zero instead of normalized rounding noise,
// which would not be orthogonal to the others and would make P P^T M add a part of M twice.
void orthonormalize(float* P, int rows, int R) {
  auto col_norm = [&](int c) {
    double sq = 0;
    for (int i = 0; i < rows; i++) sq += (double)P[(size_t)i * R + c] * P[(size_t)i * R + c];
    return std::sqrt(sq);
  };
  for (int c = 0; c < R; c++) {
    const double before = col_norm(c);
    for (int pass = 0; pass < 2; pass++) {
      for (int prev = 0; prev < c; prev++) {
        double dot = 0;
        for (int i = 0; i < rows; i++) dot += (double)P[(size_t)i * R + c] * P[(size_t)i * R + prev];
        for (int i = 0; i < rows; i++) P[(size_t)i * R + c] -= (float)dot * P[(size_t)i * R + prev];
      }
    }
    const double norm = col_norm(c);
    const float inv = norm > 1e-4 * before && norm > 1e-30 ? (float)(1.0 / norm) : 0.0f;
    for (int i = 0; i < rows; i++) P[(size_t)i * R + c] *= inv;
  }
}

struct Shape2 {
  int rows = 0, cols = 0;
};
Shape2 matrix_shape(const nn::Param& p) {
  if (p.local_shape.size() != 2) return {};
  return {(int)p.local_shape[0], (int)p.local_shape[1]};
}
bool low_rank_pays(const nn::Param& p, int R) {
  const Shape2 s = matrix_shape(p);
  return s.rows > 0 && (int64_t)R * (s.rows + s.cols) < (int64_t)s.rows * s.cols;
}

}  // namespace

GradientExchange::GradientExchange(nn::ParamRegistry& params, comm::Communicator* dp, const CompressSpec& spec,
                                   const AdaptiveOptions& adaptive, uint64_t seed, comm::Communicator* split,
                                   const DgcOptions& dgc)
    : params_(params),
      dp_(dp),
      split_(split && split->size() > 1 ? split : nullptr),
      heavy_(spec),
      light_spec_(spec.light()),
      adaptive_(adaptive),
      seed_(seed),
      dgc_(dgc),
      step_spec_(spec) {
  MT_ASSERT(params.finalized() && params.grad(), "GradientExchange needs a finalized registry with gradients");
  MT_CHECK_INPUT(!dgc.enabled || (spec.method == Method::topk && !adaptive.enabled),
                 "--dgc needs --compress topk:RATIO and no --compress-adaptive, got --compress ", spec.str());
  MT_CHECK_INPUT(!adaptive.enabled || (adaptive.every >= 1 && adaptive.eta > 0),
                 "--compress-adaptive-every must be >= 1 and --compress-adaptive-eta > 0");
  if (dp_) {
    n_ = dp_->size();
    r_ = dp_->rank();
  }
  const size_t T = params.params().size();
  residual_.resize(T);
  q_.resize(T);
  const bool ef = heavy_.error_feedback() || (adaptive_.enabled && light_spec_.error_feedback());
  const int max_rank = std::max(heavy_.rank, adaptive_.enabled ? light_spec_.rank : 0);
  for (size_t t = 0; t < T; t++) {
    const nn::Param& p = params.params()[t];
    if (ef) residual_[t].assign(p.numel, 0.0f);
    if (heavy_.method == Method::powersgd && low_rank_pays(p, heavy_.rank)) {
      const Shape2 s = matrix_shape(p);
      q_[t].resize((size_t)s.cols * max_rank);
      const CounterRng rng(seed, "powersgd/Q/" + p.name);
      for (size_t i = 0; i < q_[t].size(); i++) q_[t][i] = (float)rng.normal(i);
    }
  }
  if (dgc_.enabled) {
    std::vector<size_t> sizes;
    for (const nn::Param& p : params.params()) sizes.push_back(p.numel);
    momentum_ = DgcMomentum(sizes, dgc_.momentum);
  }
  light_.assign(params.num_groups(), adaptive_.enabled ? 1 : 0);
  prev_norm_.assign(params.num_groups(), -1.0);
  if (adaptive_.enabled) acc_.assign(params.size(), 0.0f);
}

const CompressSpec& GradientExchange::spec_of(const nn::Param& p) const {
  if (dgc_.enabled) return step_spec_;
  return light_[p.group] ? light_spec_ : heavy_;
}

float GradientExchange::dgc_clip() const {
  if (dgc_.clip <= 0) return 1.0f;
  double sq = 0;
  const float* g = params_.grad();
  for (const nn::Param& p : params_.params())
    if (!split_ || p.replicas.counted)
      for (size_t i = 0; i < p.numel; i++) sq += (double)g[p.offset + i] * g[p.offset + i];
  if (split_) {  // the other tp parts of this rank's share: one norm, one factor for all of them
    float part = (float)sq;
    split_->all_reduce(&part, &part, 1, comm::DType::f32, comm::ReduceOp::sum);
    sq = part;
  }
  return dgc_clip_factor(std::sqrt(sq), dgc_.clip, n_);
}

std::vector<std::vector<float>*> GradientExchange::state_buffers() {
  std::vector<std::vector<float>*> out;
  for (auto& r : residual_) out.push_back(&r);
  for (auto& q : q_) out.push_back(&q);
  for (size_t t = 0; t < momentum_.tensors(); t++) out.push_back(&momentum_.velocity(t));
  return out;
}

double GradientExchange::light_fraction() const {
  if (light_.empty()) return 0;
  int k = 0;
  for (int v : light_) k += v;
  return (double)k / (double)light_.size();
}

void GradientExchange::update_levels(int64_t step) {
  if (!adaptive_.enabled || step == 0 || step % adaptive_.every != 0) return;
  std::vector<double> sq(light_.size(), 0.0);
  for (const nn::Param& p : params_.params())
    if (!split_ || p.replicas.counted)
      for (size_t i = 0; i < p.numel; i++) sq[p.group] += (double)acc_[p.offset + i] * acc_[p.offset + i];
  // The layer's parts on the other tp ranks (the same groups there): every part decides from the whole norm.
  if (split_) {
    std::vector<float> part(sq.begin(), sq.end());  // float32 is enough to compare norms; the same on all ranks
    split_->all_reduce(part.data(), part.data(), part.size(), comm::DType::f32, comm::ReduceOp::sum);
    sq.assign(part.begin(), part.end());
  }
  for (size_t g = 0; g < light_.size(); g++) {
    const double cur = std::sqrt(sq[g]), prev = prev_norm_[g];
    // Critical: the accumulated gradient's norm moved by eta or more relative to the last interval.
    light_[g] = prev < 0 || (prev > 0 && std::fabs(prev - cur) / prev >= adaptive_.eta) ? 1 : 0;
    prev_norm_[g] = cur;
  }
  std::fill(acc_.begin(), acc_.end(), 0.0f);
}

void GradientExchange::exchange(int64_t step) {
  update_levels(step);
  if (heavy_.method == Method::powersgd)
    exchange_powersgd();
  else
    exchange_codec(step);
  if (adaptive_.enabled) {
    const float* g = params_.grad();
    for (size_t i = 0; i < acc_.size(); i++) acc_[i] += g[i];
  }
}

void GradientExchange::exchange_codec(int64_t step) {
  auto& ps = params_.params();
  const size_t T = ps.size();
  if (dgc_.enabled) {
    step_spec_.ratio = dgc_density(heavy_.ratio, dgc_.warmup, step);
    clip_ = dgc_clip();
  }
  std::vector<size_t> off(T + 1, 0);
  for (size_t t = 0; t < T; t++) off[t + 1] = off[t] + payload_bytes(spec_of(ps[t]), ps[t].numel);
  const size_t B = off[T];
  out_.assign(B, 0);
  for (size_t t = 0; t < T; t++) {
    const nn::Param& p = ps[t];
    const CompressSpec& spec = spec_of(p);
    float* g = params_.grad() + p.offset;
    const bool ef = spec.error_feedback() && !residual_[t].empty();
    scratch_.assign(g, g + p.numel);
    if (dgc_.enabled) {  // local clipping, then u = m u + g: scratch = u
      if (clip_ != 1.0f)
        for (size_t i = 0; i < p.numel; i++) scratch_[i] *= clip_;
      momentum_.correct(t, scratch_.data(), p.numel);
    }
    if (ef)  // DGC: v = v + u (the residual is DGC's accumulated velocity v)
      for (size_t i = 0; i < p.numel; i++) scratch_[i] += residual_[t][i];
    encode(spec, scratch_.data(), p.numel, {seed_, step, r_, (int)t}, out_.data() + off[t]);
    if (ef) {
      // What was not sent stays for the next step: residual = x - decode(payload) (DGC: v is 0 where sent).
      for (size_t i = 0; i < p.numel; i++) residual_[t][i] = scratch_[i];
      std::vector<float> dec(p.numel, 0.0f);
      decode_add(spec, out_.data() + off[t], p.numel, dec.data());
      for (size_t i = 0; i < p.numel; i++) residual_[t][i] -= dec[i];
    }
    if (dgc_.enabled) momentum_.mask(t, sparse_indices(spec, out_.data() + off[t], p.numel));
  }
  all_.resize(B * n_);
  if (n_ > 1)
    dp_->all_gather(out_.data(), all_.data(), B * n_, comm::DType::u8);
  else
    std::memcpy(all_.data(), out_.data(), B);
  std::memset(params_.grad(), 0, sizeof(float) * params_.size());
  for (int r = 0; r < n_; r++)
    for (size_t t = 0; t < T; t++)
      decode_add(spec_of(ps[t]), all_.data() + (size_t)r * B + off[t], ps[t].numel, params_.grad() + ps[t].offset);
}

void GradientExchange::exchange_powersgd() {
  auto& ps = params_.params();
  const size_t T = ps.size();
  // Layout of the first all_reduce: every matrix's P [rows, R], then every exactly-sent tensor.
  std::vector<size_t> p_off(T, SIZE_MAX), q_off(T, SIZE_MAX), x_off(T, SIZE_MAX);
  std::vector<int> rank_of(T, 0);
  size_t np = 0, nq = 0;
  for (size_t t = 0; t < T; t++) {
    const int R = spec_of(ps[t]).method == Method::powersgd ? spec_of(ps[t]).rank : 0;
    if (R > 0 && !q_.empty() && !q_[t].empty() && low_rank_pays(ps[t], R)) {
      const Shape2 s = matrix_shape(ps[t]);
      rank_of[t] = R;
      p_off[t] = np;
      np += (size_t)s.rows * R;
      q_off[t] = nq;
      nq += (size_t)s.cols * R;
    }
  }
  size_t nx = np;
  for (size_t t = 0; t < T; t++) {
    if (rank_of[t] == 0) {
      x_off[t] = nx;
      nx += ps[t].numel;
    }
  }
  std::vector<float> first(nx), second(nq);
  std::vector<std::vector<float>> m(T);
  for (size_t t = 0; t < T; t++) {
    const nn::Param& p = ps[t];
    const float* g = params_.grad() + p.offset;
    if (rank_of[t] == 0) {
      std::memcpy(first.data() + x_off[t], g, sizeof(float) * p.numel);
      continue;
    }
    const Shape2 s = matrix_shape(p);
    const int R = rank_of[t], Rmax = (int)(q_[t].size() / s.cols);
    m[t].assign(g, g + p.numel);
    if (!residual_[t].empty())
      for (size_t i = 0; i < p.numel; i++) m[t][i] += residual_[t][i];
    gemm(false, false, s.rows, R, s.cols, 1.0f, m[t].data(), s.cols, q_[t].data(), Rmax, 0.0f,
         first.data() + p_off[t], R);
  }
  if (n_ > 1) dp_->all_reduce(first.data(), first.data(), nx, comm::DType::f32, comm::ReduceOp::sum);
  for (size_t t = 0; t < T; t++) {
    if (rank_of[t] == 0) continue;
    const Shape2 s = matrix_shape(ps[t]);
    const int R = rank_of[t];
    float* P = first.data() + p_off[t];
    orthonormalize(P, s.rows, R);
    float* Q = second.data() + q_off[t];
    gemm(true, false, s.cols, R, s.rows, 1.0f, m[t].data(), s.cols, P, R, 0.0f, Q, R);  // Q' = M^T P
    if (!residual_[t].empty()) {
      // residual = M - P Q'^T (this rank's reconstruction)
      std::memcpy(residual_[t].data(), m[t].data(), sizeof(float) * ps[t].numel);
      gemm(false, true, s.rows, s.cols, R, -1.0f, P, R, Q, R, 1.0f, residual_[t].data(), s.cols);
    }
  }
  if (n_ > 1 && nq) dp_->all_reduce(second.data(), second.data(), nq, comm::DType::f32, comm::ReduceOp::sum);
  for (size_t t = 0; t < T; t++) {
    const nn::Param& p = ps[t];
    float* g = params_.grad() + p.offset;
    if (rank_of[t] == 0) {
      std::memcpy(g, first.data() + x_off[t], sizeof(float) * p.numel);
      continue;
    }
    const Shape2 s = matrix_shape(p);
    const int R = rank_of[t], Rmax = (int)(q_[t].size() / s.cols);
    const float* P = first.data() + p_off[t];
    const float* Q = second.data() + q_off[t];
    gemm(false, true, s.rows, s.cols, R, 1.0f, P, R, Q, R, 0.0f, g, s.cols);
    for (int i = 0; i < s.cols; i++)  // warm start: the next step's Q is this step's summed Q'
      for (int c = 0; c < R; c++) q_[t][(size_t)i * Rmax + c] = Q[(size_t)i * R + c];
  }
}

}  // namespace mt::compress
