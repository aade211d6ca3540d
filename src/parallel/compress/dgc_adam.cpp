#include "parallel/compress/dgc_adam.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "parallel/compress/codec.h"

namespace mt::compress {

DgcAdamExchange::DgcAdamExchange(nn::ParamRegistry& params, comm::Communicator* dp, const CompressSpec& spec,
                                 bool masking, bool dense_vectors, bool global_topk)
    : params_(params), dp_(dp), spec_(spec), masking_(masking), global_(global_topk) {
  all_spec_.method = Method::topk;
  all_spec_.ratio = 1.0;
  MT_ASSERT(params.finalized() && params.grad(), "DgcAdamExchange needs a finalized registry with gradients");
  MT_CHECK_INPUT(spec.method == Method::topk, "DGC with AdamW needs --compress topk:RATIO, got --compress ",
                 spec.str());
  if (dp_) {
    n_ = dp_->size();
    r_ = dp_->rank();
  }
  for (const nn::Param& p : params.params()) {
    dense_.push_back(dense_vectors && p.local_shape.size() < 2);
    u_.emplace_back(p.numel, 0.0f);
    a_.emplace_back(p.numel, 0.0f);
    goff_.push_back(gn_);
    if (global_ && !dense_.back()) {
      gtensor_.push_back(goff_.size() - 1);
      gn_ += p.numel;
    }
  }
  MT_CHECK_INPUT(!global_ || gn_ > 0, "--dgc-global-topk: every tensor is sent whole (--dgc-dense-vectors), no "
                 "tensor is left for the top-k");
  gflat_.resize(gn_);
}

std::vector<std::vector<float>*> DgcAdamExchange::state_buffers() {
  std::vector<std::vector<float>*> out;
  for (auto& u : u_) out.push_back(&u);
  for (auto& a : a_) out.push_back(&a);
  return out;
}

void DgcAdamExchange::exchange(float* g, const DgcAdamStepInputs& in) {
  const auto& ps = params_.params();
  const size_t T = ps.size();
  const double d = in.density > 0 ? in.density : spec_.ratio;
  MT_ASSERT(d > 0 && d <= 1, "DgcAdamExchange: kept fraction ", d);
  if (d != density_) {  // the payload layout of this step's density
    density_ = d;
    spec_.ratio = d;
    off_.assign(T + 1, 0);
    for (size_t t = 0; t < T; t++)
      off_[t + 1] = off_[t] + (global_ && !dense_[t] ? 0 : payload_bytes(dense_[t] ? all_spec_ : spec_, ps[t].numel));
    gbytes_ = global_ ? payload_bytes(spec_, gn_) : 0;  // the group's payload after the per-tensor ones
  }
  const size_t B = off_[T] + gbytes_;
  const float b1 = in.beta1, gs = in.g_scale, bc1 = in.bc1;
  const float inv_n = 1.0f / (float)n_;
  out_.assign(B, 0);
  std::vector<float> dec;
  for (size_t t = 0; t < T; t++) {
    const nn::Param& p = ps[t];
    float* u = u_[t].data();
    float* a = a_[t].data();
    const float* gt = g + p.offset;
    const float* D = in.precond + p.offset;
    if (in.m0) {  // the first compressed step: the ranks' momenta sum to AdamW's, nothing accumulated yet
      const float* m0 = in.m0 + p.offset;
      for (size_t i = 0; i < p.numel; i++) {
        u[i] = m0[i] * inv_n;
        a[i] = 0.0f;
      }
    }
    for (size_t i = 0; i < p.numel; i++) {
      const float gi = __builtin_assoc_barrier(gt[i] * gs);
      u[i] = b1 * u[i] + (1.0f - b1) * gi;
      a[i] += (u[i] / bc1) / D[i];
    }
    if (global_ && !dense_[t]) {  // into the group; selected after the loop
      std::memcpy(gflat_.data() + goff_[t], a, sizeof(float) * p.numel);
      continue;
    }
    uint8_t* payload = out_.data() + off_[t];
    const CompressSpec& spec = dense_[t] ? all_spec_ : spec_;
    encode(spec, a, p.numel, {0, 0, r_, (int)t}, payload);
    for (uint32_t i : sparse_indices(spec, payload, p.numel)) {
      a[i] = 0.0f;
      if (masking_ && !dense_[t]) u[i] = 0.0f;
    }
  }
  if (global_) {
    uint8_t* payload = out_.data() + off_[T];
    encode(spec_, gflat_.data(), gn_, {0, 0, r_, (int)T}, payload);
    for (uint32_t j : sparse_indices(spec_, payload, gn_)) {
      // the group position j lies in the last group tensor whose offset is <= j
      size_t lo = 0, hi = gtensor_.size();
      while (hi - lo > 1) {
        const size_t mid = (lo + hi) / 2;
        (goff_[gtensor_[mid]] <= j ? lo : hi) = mid;
      }
      const size_t t = gtensor_[lo], i = j - goff_[t];
      a_[t][i] = 0.0f;
      if (masking_) u_[t][i] = 0.0f;
    }
  }
  all_.resize(B * n_);
  if (n_ > 1)
    dp_->all_gather(out_.data(), all_.data(), B * n_, comm::DType::u8);
  else
    std::memcpy(all_.data(), out_.data(), B);
  std::memset(g, 0, sizeof(float) * params_.size());
  for (int r = 0; r < n_; r++)
    for (size_t t = 0; t < T; t++)
      if (!(global_ && !dense_[t]))  // the group's tensors: below
        decode_add(dense_[t] ? all_spec_ : spec_, all_.data() + (size_t)r * B + off_[t], ps[t].numel,
                   g + ps[t].offset);
  if (global_) {
    std::fill(gflat_.begin(), gflat_.end(), 0.0f);
    for (int r = 0; r < n_; r++) decode_add(spec_, all_.data() + (size_t)r * B + off_[T], gn_, gflat_.data());
    for (size_t t : gtensor_) std::memcpy(g + ps[t].offset, gflat_.data() + goff_[t], sizeof(float) * ps[t].numel);
  }
}

}  // namespace mt::compress
