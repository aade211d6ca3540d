#include "parallel/compress/onebit.h"

#include <cstring>

#include "core/error.h"
#include "parallel/compress/codec.h"

namespace mt::compress {

namespace {
CompressSpec sign_spec() {
  CompressSpec s;
  s.method = Method::sign;
  return s;
}
}  // namespace

void sign_compress_with_error(const float* x, float* e, size_t n, uint8_t* payload) {
  const CompressSpec spec = sign_spec();
  std::vector<float> y(n), c(n, 0.0f);
  for (size_t i = 0; i < n; i++) y[i] = x[i] + e[i];
  encode(spec, y.data(), n, {}, payload);
  decode_add(spec, payload, n, c.data());
  for (size_t i = 0; i < n; i++) e[i] = y[i] - c[i];
}

void sign_server_with_error(const uint8_t* const* payloads, int N, float* e, size_t n, float* out) {
  const CompressSpec spec = sign_spec();
  std::vector<float> z(n, 0.0f);
  for (int r = 0; r < N; r++) decode_add(spec, payloads[r], n, z.data());
  const float inv = 1.0f / (float)N;
  for (size_t i = 0; i < n; i++) z[i] = z[i] * inv + e[i];
  std::vector<uint8_t> p(payload_bytes(spec, n));
  encode(spec, z.data(), n, {}, p.data());
  std::memset(out, 0, sizeof(float) * n);
  decode_add(spec, p.data(), n, out);
  for (size_t i = 0; i < n; i++) e[i] = z[i] - out[i];
}

OnebitMomentumExchange::OnebitMomentumExchange(nn::ParamRegistry& params, comm::Communicator* dp, float beta1)
    : params_(params), dp_(dp && dp->size() > 1 ? dp : nullptr), b1_(beta1) {
  MT_ASSERT(params.finalized(), "OnebitMomentumExchange needs a finalized registry");
  if (dp_) n_ = dp_->size();
  for (const nn::Param& p : params.params()) {
    ew_.emplace_back(p.numel, 0.0f);
    es_.emplace_back(p.numel, 0.0f);
  }
}

void OnebitMomentumExchange::exchange(const float* g, float g_scale, const float* M, float* out) {
  const auto& ps = params_.params();
  const size_t T = ps.size();
  const CompressSpec spec = sign_spec();
  std::vector<size_t> off(T + 1, 0);
  for (size_t t = 0; t < T; t++) off[t + 1] = off[t] + payload_bytes(spec, ps[t].numel);
  const size_t B = off[T];
  out_.assign(B, 0);
  const float N = (float)n_;
  for (size_t t = 0; t < T; t++) {
    const nn::Param& p = ps[t];
    y_.resize(p.numel);
    for (size_t i = 0; i < p.numel; i++)  // the local momentum m_r = b1 M + (1-b1) N g_r
      y_[i] = b1_ * M[p.offset + i] + (1.0f - b1_) * (N * (g[p.offset + i] * g_scale));
    sign_compress_with_error(y_.data(), ew_[t].data(), p.numel, out_.data() + off[t]);
  }
  all_.resize(B * n_);
  if (dp_)
    dp_->all_gather(out_.data(), all_.data(), B * n_, comm::DType::u8);
  else
    std::memcpy(all_.data(), out_.data(), B);
  std::vector<const uint8_t*> per_rank(n_);
  for (size_t t = 0; t < T; t++) {
    for (int r = 0; r < n_; r++) per_rank[r] = all_.data() + (size_t)r * B + off[t];
    sign_server_with_error(per_rank.data(), n_, es_[t].data(), ps[t].numel, out + ps[t].offset);
  }
}

}  // namespace mt::compress
