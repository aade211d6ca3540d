#include "parallel/compress/onebit.h"

#include <algorithm>
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

void sign_server_payload(const uint8_t* const* payloads, int N, float* e, size_t n, uint8_t* out_payload) {
  const CompressSpec spec = sign_spec();
  std::vector<float> z(n, 0.0f), c(n, 0.0f);
  for (int r = 0; r < N; r++) decode_add(spec, payloads[r], n, z.data());
  const float inv = 1.0f / (float)N;
  for (size_t i = 0; i < n; i++) z[i] = z[i] * inv + e[i];
  encode(spec, z.data(), n, {}, out_payload);
  decode_add(spec, out_payload, n, c.data());
  for (size_t i = 0; i < n; i++) e[i] = z[i] - c[i];
}

void sign_server_with_error(const uint8_t* const* payloads, int N, float* e, size_t n, float* out) {
  const CompressSpec spec = sign_spec();
  std::vector<uint8_t> p(payload_bytes(spec, n));
  sign_server_payload(payloads, N, e, n, p.data());
  std::memset(out, 0, sizeof(float) * n);
  decode_add(spec, p.data(), n, out);
}

OnebitMomentumExchange::OnebitMomentumExchange(nn::ParamRegistry& params, comm::Communicator* dp, float beta1)
    : params_(params), dp_(dp && dp->size() > 1 ? dp : nullptr), b1_(beta1) {
  MT_ASSERT(params.finalized(), "OnebitMomentumExchange needs a finalized registry");
  if (dp_) {
    n_ = dp_->size();
    r_ = dp_->rank();
  }
  const CompressSpec spec = sign_spec();
  owned_.assign(n_, 0);
  for (const nn::Param& p : params.params()) {
    ew_.emplace_back(p.numel, 0.0f);
    es_.emplace_back(p.numel, 0.0f);
    bytes_.push_back(payload_bytes(spec, p.numel));
    // The server of this tensor: the rank serving the fewest bytes so far (the lowest on ties).
    const int s = (int)(std::min_element(owned_.begin(), owned_.end()) - owned_.begin());
    owner_.push_back(s);
    owned_[s] += bytes_.back();
  }
}

void OnebitMomentumExchange::all_to_all(const std::vector<uint8_t>& send, const std::vector<size_t>& send_counts,
                                        std::vector<uint8_t>& recv, const std::vector<size_t>& recv_counts) {
  size_t total = 0;
  for (size_t c : recv_counts) total += c;
  recv.resize(total);
  if (dp_)
    dp_->all_to_all_v(send.data(), send_counts.data(), nullptr, recv.data(), recv_counts.data(), nullptr,
                      comm::DType::u8);
  else
    std::memcpy(recv.data(), send.data(), total);
}

void OnebitMomentumExchange::exchange(const float* g, float g_scale, const float* M, float* out) {
  const auto& ps = params_.params();
  const size_t T = ps.size();
  const float N = (float)n_;
  // Worker side: each tensor's payload goes to its server; the send buffer holds server 0's tensors first.
  std::vector<std::vector<uint8_t>> worker(T);
  for (size_t t = 0; t < T; t++) {
    const nn::Param& p = ps[t];
    y_.resize(p.numel);
    for (size_t i = 0; i < p.numel; i++)  // the local momentum m_r = b1 M + (1-b1) N g_r
      y_[i] = b1_ * M[p.offset + i] + (1.0f - b1_) * (N * (g[p.offset + i] * g_scale));
    worker[t].resize(bytes_[t]);
    sign_compress_with_error(y_.data(), ew_[t].data(), p.numel, worker[t].data());
  }
  std::vector<uint8_t> send;
  for (int s = 0; s < n_; s++)
    for (size_t t = 0; t < T; t++)
      if (owner_[t] == s) send.insert(send.end(), worker[t].begin(), worker[t].end());
  std::vector<uint8_t> recv;
  all_to_all(send, owned_, recv, std::vector<size_t>(n_, owned_[r_]));
  // Server side, for the tensors this rank serves: the mean of the N payloads (rank order) compressed again.
  std::vector<uint8_t> served;
  std::vector<const uint8_t*> per_rank(n_);
  size_t at = 0;  // the tensor's offset within each rank's block
  for (size_t t = 0; t < T; t++) {
    if (owner_[t] != r_) continue;
    for (int r = 0; r < n_; r++) per_rank[r] = recv.data() + (size_t)r * owned_[r_] + at;
    served.resize(at + bytes_[t]);
    sign_server_payload(per_rank.data(), n_, es_[t].data(), ps[t].numel, served.data() + at);
    at += bytes_[t];
  }
  // Every server's payloads to every rank, which decodes them all.
  send.clear();
  for (int s = 0; s < n_; s++) send.insert(send.end(), served.begin(), served.end());
  all_to_all(send, std::vector<size_t>(n_, owned_[r_]), recv, owned_);
  std::vector<size_t> block(n_, 0), within(n_, 0);
  for (int r = 1; r < n_; r++) block[r] = block[r - 1] + owned_[r - 1];
  const CompressSpec spec = sign_spec();
  for (size_t t = 0; t < T; t++) {
    const int s = owner_[t];
    std::memset(out + ps[t].offset, 0, sizeof(float) * ps[t].numel);
    decode_add(spec, recv.data() + block[s] + within[s], ps[t].numel, out + ps[t].offset);
    within[s] += bytes_[t];
  }
}

}  // namespace mt::compress
