#include "nn/moe.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"
#include "nn/layers.h"
#include "tensor/bf16.h"
#include "tensor/blas.h"

namespace mt::nn {

void MoeStats::reset(int E) {
  admitted.assign(E, 0);
  first.assign(E, 0);
  choices = dropped = groups = tokens = 0;
  aux_sum = z_sum = exchange_s = 0;
  exchange_bytes = 0;
}

MoeMlp::MoeMlp(const RouterConfig& rc, int layer, int C, int hidden, const std::string& prefix, ParamRegistry& params,
               int group, ExpertParallelOps* ep, bool register_all)
    : rc_(rc), layer_(layer), C_(C), H_(hidden), prefix_(prefix), ep_(ep) {
  const int P = ep_size(), r = ep ? ep->rank() : 0;
  MT_ASSERT(rc.experts % P == 0, "experts ", rc.experts, " not divisible by the expert-parallel size ", P);
  e0_ = r * (rc.experts / P);
  e1_ = e0_ + rc.experts / P;
  router_ = &params.add(prefix + "router.weight", {C, rc.experts}, {}, group);
  router_->products = true;
  router_->read_f32 = false;
  for (int e = register_all ? 0 : e0_; e < (register_all ? rc.experts : e1_); e++) {
    const std::string n = prefix + "experts." + std::to_string(e) + ".";
    const Expert x{&params.add(n + "c_fc.weight", {C, hidden}, {}, group), &params.add(n + "c_fc.bias", {hidden}, {}, group),
                   &params.add(n + "c_proj.weight", {hidden, C}, {}, group), &params.add(n + "c_proj.bias", {C}, {}, group)};
    x.fc_w->products = x.proj_w->products = true;
    x.fc_w->read_f32 = x.proj_w->read_f32 = false;
    if (!register_all) x.fc_w->expert = x.fc_b->expert = x.proj_w->expert = x.proj_b->expert = true;
    if (e >= e0_ && e < e1_) local_.push_back(x);
  }
  stats_.reset(rc.experts);
}

void MoeMlp::init_param(Param& p, uint64_t seed, int n_layer) const {
  const std::string& n = p.name;
  auto ends_with = [&](const char* s) {
    const size_t k = std::strlen(s);
    return n.size() >= k && n.compare(n.size() - k, k, s) == 0;
  };
  CounterRng rng(seed, n);
  float stddev = ends_with("c_proj.weight") ? 0.02f / std::sqrt(2.0f * (float)n_layer) : 0.02f;
  if (ends_with(".bias")) stddev = 0;
  for (size_t i = 0; i < p.numel; i++) p.data[i] = stddev == 0 ? 0.0f : (float)rng.normal((uint64_t)p.full_index(i)) * stddev;
}

float* MoeMlp::send_rows(std::vector<float>& local, size_t floats) {
  if (ep_size() > 1) return ep_->send_buffer(floats);
  local.resize(floats);
  return local.data();
}

void MoeMlp::exchange(const float* in, float* out, bool to_experts, const int64_t* counts_here,
                      const int64_t* counts_there) {
  const int P = ep_size(), E = rc_.experts, Le = E / P;
  const size_t C = (size_t)C_;
  if (P == 1) {
    int64_t rows = 0;
    for (int e = 0; e < E; e++) rows += counts_here[e];
    if (rows) std::memcpy(out, in, sizeof(float) * rows * C);
    return;
  }
  // here[r]: floats between this rank's tokens and rank r's experts; there[r]: between rank r's tokens and
  // this rank's experts.
  std::vector<size_t> here(P, 0), there(P, 0);
  int64_t there_rows = 0;
  for (int r = 0; r < P; r++)
    for (int le = 0; le < Le; le++) {
      here[r] += (size_t)counts_here[r * Le + le] * C;
      there[r] += (size_t)counts_there[r * Le + le] * C;
      there_rows += counts_there[r * Le + le];
    }
  // Rows by source rank: what the dispatch receives, or what the combine sends (then in the group's send buffer,
  // which peers read directly; the dispatch's send buffer is `in`, the caller's).
  std::vector<float> received(to_experts ? (size_t)there_rows * C : 0);
  float* by_source = to_experts ? received.data() : ep_->send_buffer((size_t)there_rows * C);
  // Offsets of (source r, local expert le) in the by-source order and in the by-expert order.
  std::vector<size_t> src_off(P * Le), exp_off(P * Le);
  size_t o = 0;
  for (int r = 0; r < P; r++)
    for (int le = 0; le < Le; le++) src_off[r * Le + le] = o, o += (size_t)counts_there[r * Le + le] * C;
  o = 0;
  for (int le = 0; le < Le; le++)
    for (int r = 0; r < P; r++) exp_off[r * Le + le] = o, o += (size_t)counts_there[r * Le + le] * C;
  const auto t0 = std::chrono::steady_clock::now();
  size_t sent = 0;
  if (to_experts) {
    ep_->exchange_rows(in, here.data(), by_source, there.data());
    for (int i = 0; i < P * Le; i++)
      if (counts_there[i] > 0)  // an empty block may sit at a null pointer (memcpy from null is undefined)
        std::memcpy(out + exp_off[i], by_source + src_off[i], sizeof(float) * counts_there[i] * C);
    for (int r = 0; r < P; r++)
      if (r != ep_->rank()) sent += here[r];
  } else {
    for (int i = 0; i < P * Le; i++)
      if (counts_there[i] > 0)
        std::memcpy(by_source + src_off[i], in + exp_off[i], sizeof(float) * counts_there[i] * C);
    ep_->exchange_rows(by_source, there.data(), out, here.data());
    for (int r = 0; r < P; r++)
      if (r != ep_->rank()) sent += there[r];
  }
  stats_.exchange_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats_.exchange_bytes += sent * sizeof(float);
  if (tracer_ && tracer_->enabled()) {
    const double t1 = trace::ChromeTrace::now_us(), us = std::chrono::duration<double, std::micro>(
                                                                  std::chrono::steady_clock::now() - t0).count();
    tracer_->add(trace::Track::comm,
                 str(to_experts ? "moe dispatch" : "moe combine", " h.", layer_, " (all_to_all_v, ",
                     sent * sizeof(float), " bytes out)"),
                 "comm", t1 - us, t1);
  }
}

void MoeMlp::forward(ActivationStore& store, int mb, const float* x, const float* residual, float* out, int N,
                     const RouterDraws& draws) {
  const int E = rc_.experts, K = rc_.top_k, P = ep_size(), Le = e1_ - e0_;
  State& st = store.object<State>(mb, prefix_ + "moe");
  // Router.
  float* logits = store.get(mb, prefix_ + "logits", (size_t)N * E);
  linear_forward(logits, x, router_->weight(), nullptr, N, C_, E, nullptr, prec_);
  RouterDraws d = draws;
  d.layer = layer_;
  route(logits, N, rc_, d, st.routing);
  const Routing& R = st.routing;
  // Admitted pairs by expert (then group, then slot: the slot order within a group is admission order).
  st.count.assign(E, 0);
  for (int t = 0; t < N; t++)
    for (int k = 0; k < K; k++)
      if (R.admitted(t, k)) st.count[R.expert[(size_t)t * K + k]]++;
  std::vector<int64_t> at(E, 0);
  for (int e = 1; e < E; e++) at[e] = at[e - 1] + st.count[e - 1];
  const int64_t A = at[E - 1] + st.count[E - 1];
  st.order.assign(A, 0);
  const int Ng = rc_.group_tokens;
  for (int g = 0; g < N / Ng; g++) {
    std::vector<int64_t> base(E);
    for (int e = 0; e < E; e++) base[e] = at[e];
    for (int t = g * Ng; t < (g + 1) * Ng; t++)
      for (int k = 0; k < K; k++)
        if (R.admitted(t, k)) {
          const size_t i = (size_t)t * K + k;
          st.order[base[R.expert[i]] + R.slot[i]] = (int32_t)i;
        }
    for (int e = 0; e < E; e++) at[e] += R.group_count[(size_t)g * E + e];
  }
  // Counts from every source rank for this rank's experts.
  st.incoming.assign((size_t)P * Le, 0);
  if (P == 1)
    st.incoming = st.count;
  else
    ep_->exchange_counts(st.count.data(), st.incoming.data(), Le);
  int64_t Al = 0;
  for (int64_t c : st.incoming) Al += c;
  // Dispatch.
  const size_t C = (size_t)C_, H = (size_t)H_;
  std::vector<float> xs_local;
  float* xs = send_rows(xs_local, (size_t)A * C);
  for (int64_t a = 0; a < A; a++) std::memcpy(xs + a * C, x + (size_t)(st.order[a] / K) * C, sizeof(float) * C);
  // Under bf16 the experts' inputs and GELU outputs, which backward reads only through products, are kept in
  // bf16 (the same bits the products round them to, half the bytes); xin arrives in float32 and is rounded once.
  const bool bf16 = prec_ == Precision::bf16;
  std::vector<float> xin32(bf16 ? (size_t)Al * C : 0);
  float* xin = bf16 ? xin32.data() : store.get(mb, prefix_ + "xin", (size_t)Al * C);
  exchange(xs, xin, true, st.count.data(), st.incoming.data());
  uint16_t* xin16 = bf16 ? store.get_bf16(mb, prefix_ + "xin16", (size_t)Al * C) : nullptr;
  if (bf16) to_bf16(xin, xin16, (size_t)Al * C);
  // Experts.
  float* h = store.get(mb, prefix_ + "h", (size_t)Al * H);
  float* act = bf16 ? nullptr : store.get(mb, prefix_ + "a", (size_t)Al * H);
  uint16_t* act16 = bf16 ? store.get_bf16(mb, prefix_ + "a16", (size_t)Al * H) : nullptr;
  float* o = store.get(mb, prefix_ + "o", (size_t)Al * C);
  size_t row = 0;
  for (int le = 0; le < Le; le++) {
    const int64_t n = st.rows_for(le, P);
    if (n == 0) continue;
    const Expert& w = local_[le];
    if (bf16) {
      linear_forward(h + row * H, xin16 + row * C, w.fc_w->weight(), w.fc_b->data, (int)n, C_, H_, nullptr);
      gelu_forward_bf16(act16 + row * H, h + row * H, (size_t)n * H);
      linear_forward(o + row * C, act16 + row * H, w.proj_w->weight(), w.proj_b->data, (int)n, H_, C_, nullptr);
    } else {
      linear_forward(h + row * H, xin + row * C, w.fc_w->weight(), w.fc_b->data, (int)n, C_, H_, nullptr, prec_);
      gelu_forward(act + row * H, h + row * H, (size_t)n * H);
      linear_forward(o + row * C, act + row * H, w.proj_w->weight(), w.proj_b->data, (int)n, H_, C_, nullptr, prec_);
    }
    row += (size_t)n;
  }
  // Combine.
  float* ys = store.get(mb, prefix_ + "ys", (size_t)A * C);
  exchange(o, ys, false, st.count.data(), st.incoming.data());
  if (!residual)
    std::memset(out, 0, sizeof(float) * N * C);
  else if (out != residual)
    std::memcpy(out, residual, sizeof(float) * N * C);
  for (int64_t a = 0; a < A; a++) {
    const int32_t i = st.order[a];
    const float g = R.gate[i];
    float* y = out + (size_t)(i / K) * C;
    const float* src = &ys[a * C];
    for (size_t c = 0; c < C; c++) y[c] += g * src[c];
  }
  // Statistics.
  if (!recording_) return;
  for (int e = 0; e < E; e++) {
    stats_.admitted[e] += st.count[e];
    stats_.first[e] += R.first_load[e];
  }
  stats_.choices += R.choices;
  stats_.dropped += R.dropped;
  stats_.aux_sum += R.aux_sum;
  stats_.z_sum += R.z_sum;
  stats_.groups += N / Ng;
  stats_.tokens += N;
}

void MoeMlp::backward(ActivationStore& store, int mb, const float* x, const float* dy, float* dx, int N,
                      float aux_scale, float z_scale) {
  backward_(store, mb, x, nullptr, dy, dx, N, aux_scale, z_scale);
}

void MoeMlp::backward(ActivationStore& store, int mb, const uint16_t* x16, const float* dy, float* dx, int N,
                      float aux_scale, float z_scale) {
  backward_(store, mb, nullptr, x16, dy, dx, N, aux_scale, z_scale);
}

void MoeMlp::backward_(ActivationStore& store, int mb, const float* x, const uint16_t* x16, const float* dy, float* dx,
                       int N, float aux_scale, float z_scale) {
  const int E = rc_.experts, K = rc_.top_k, P = ep_size(), Le = e1_ - e0_;
  State& st = store.object<State>(mb, prefix_ + "moe");
  const Routing& R = st.routing;
  const size_t C = (size_t)C_, H = (size_t)H_;
  const int64_t A = (int64_t)st.order.size();
  int64_t Al = 0;
  for (int64_t c : st.incoming) Al += c;
  const float* ys = store.get(mb, prefix_ + "ys", (size_t)A * C);
  // Gates and the experts' output gradients.
  std::vector<float> dgate((size_t)N * K, 0.0f), dys_local;
  float* dys = send_rows(dys_local, (size_t)A * C);
  for (int64_t a = 0; a < A; a++) {
    const int32_t i = st.order[a];
    const float* d = dy + (size_t)(i / K) * C;
    const float* y = &ys[a * C];
    double dot = 0;
    for (size_t c = 0; c < C; c++) dot += (double)d[c] * y[c];
    dgate[i] = (float)dot;
    const float g = R.gate[i];
    for (size_t c = 0; c < C; c++) dys[a * C + c] = g * d[c];
  }
  std::vector<float> dout((size_t)Al * C), dxin((size_t)Al * C), dh((size_t)Al * H);
  exchange(dys, dout.data(), true, st.count.data(), st.incoming.data());
  const bool bf16 = prec_ == Precision::bf16;  // as forward keeps them
  const float* xin = bf16 ? nullptr : store.get(mb, prefix_ + "xin", (size_t)Al * C);
  const uint16_t* xin16 = bf16 ? store.get_bf16(mb, prefix_ + "xin16", (size_t)Al * C) : nullptr;
  const float* h = store.get(mb, prefix_ + "h", (size_t)Al * H);
  const float* act = bf16 ? nullptr : store.get(mb, prefix_ + "a", (size_t)Al * H);
  const uint16_t* act16 = bf16 ? store.get_bf16(mb, prefix_ + "a16", (size_t)Al * H) : nullptr;
  size_t row = 0;
  for (int le = 0; le < Le; le++) {
    const int64_t n = st.rows_for(le, P);
    if (n == 0) continue;
    const Expert& w = local_[le];
    float* dh_e = dh.data() + row * H;
    float* dx_e = dxin.data() + row * C;
    const float* do_e = dout.data() + row * C;
    if (bf16)
      linear_backward(dh_e, w.proj_w->grad_out(), w.proj_b->grad_out(), do_e, act16 + row * H, w.proj_w->weight(), (int)n,
                      H_, C_, false);
    else
      linear_backward(dh_e, w.proj_w->grad_out(), w.proj_b->grad_out(), do_e, act + row * H, w.proj_w->weight(), (int)n,
                      H_, C_, false, prec_);
    gelu_backward(dh_e, h + row * H, dh_e, (size_t)n * H);
    if (bf16)
      linear_backward(dx_e, w.fc_w->grad_out(), w.fc_b->grad_out(), dh_e, xin16 + row * C, w.fc_w->weight(), (int)n, C_,
                      H_, false);
    else
      linear_backward(dx_e, w.fc_w->grad_out(), w.fc_b->grad_out(), dh_e, xin + row * C, w.fc_w->weight(), (int)n, C_, H_,
                      false, prec_);
    row += (size_t)n;
  }
  std::vector<float> dxs((size_t)A * C);
  exchange(dxin.data(), dxs.data(), false, st.count.data(), st.incoming.data());
  // Router, then the experts' input gradients on top.
  float* dlogits = store.get(mb, prefix_ + "logits", (size_t)N * E);  // logits are not needed any more
  route_backward(dlogits, R, dgate.data(), aux_scale, z_scale);
  if (x16)
    linear_backward(dx, router_->grad_out(), nullptr, dlogits, x16, router_->weight(), N, C_, E, false);
  else
    linear_backward(dx, router_->grad_out(), nullptr, dlogits, x, router_->weight(), N, C_, E, false, prec_);
  for (int64_t a = 0; a < A; a++) {
    float* d = dx + (size_t)(st.order[a] / K) * C;
    const float* s = &dxs[a * C];
    for (size_t c = 0; c < C; c++) d[c] += s[c];
  }
}

}  // namespace mt::nn
