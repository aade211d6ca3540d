#include "parallel/compress/dgc_adam.h"

#include <cstring>

#include "core/error.h"
#include "parallel/compress/codec.h"

namespace mt::compress {

DgcAdamExchange::DgcAdamExchange(nn::ParamRegistry& params, comm::Communicator* dp, const CompressSpec& spec,
                                 bool masking, bool dense_vectors)
    : params_(params), dp_(dp), spec_(spec), masking_(masking) {
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
  }
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
    for (size_t t = 0; t < T; t++) off_[t + 1] = off_[t] + payload_bytes(dense_[t] ? all_spec_ : spec_, ps[t].numel);
  }
  const size_t B = off_[T];
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
    uint8_t* payload = out_.data() + off_[t];
    const CompressSpec& spec = dense_[t] ? all_spec_ : spec_;
    encode(spec, a, p.numel, {0, 0, r_, (int)t}, payload);
    for (uint32_t i : sparse_indices(spec, payload, p.numel)) {
      a[i] = 0.0f;
      if (masking_ && !dense_[t]) u[i] = 0.0f;
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
      decode_add(dense_[t] ? all_spec_ : spec_, all_.data() + (size_t)r * B + off_[t], ps[t].numel,
                 g + ps[t].offset);
}

}  // namespace mt::compress
