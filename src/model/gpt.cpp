#include "model/gpt.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "nn/layers.h"
#include "tensor/blas.h"

namespace mt::model {

void GptConfig::validate() const {
  MT_CHECK_INPUT(n_layer > 0, "n_layer must be positive, got ", n_layer);
  MT_CHECK_INPUT(n_head > 0, "n_head must be positive, got ", n_head);
  MT_CHECK_INPUT(n_embd > 0, "n_embd must be positive, got ", n_embd);
  MT_CHECK_INPUT(vocab_size > 0 && vocab_size <= 65536,
                 "vocab_size must be in [1, 65536] (tokens are uint16), got ", vocab_size);
  MT_CHECK_INPUT(n_positions > 0, "n_positions must be positive, got ", n_positions);
  MT_CHECK_INPUT(n_embd % n_head == 0, "n_embd (", n_embd, ") is not divisible by n_head (", n_head, ")");
}

int64_t GptConfig::num_params() const {
  int64_t C = n_embd;
  int64_t per_layer = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C);
  return (int64_t)vocab_size * C + (int64_t)n_positions * C + n_layer * per_layer + 2 * C;
}

double GptConfig::flops_per_token(int T) const {
  return 6.0 * (double)num_params() + 12.0 * n_layer * (double)T * n_embd;
}

std::map<std::string, std::string> GptConfig::to_metadata() const {
  return {{"n_layer", std::to_string(n_layer)},
          {"n_head", std::to_string(n_head)},
          {"n_embd", std::to_string(n_embd)},
          {"vocab_size", std::to_string(vocab_size)},
          {"n_positions", std::to_string(n_positions)}};
}

Gpt::Gpt(const GptConfig& cfg, nn::ParamRegistry& params) : cfg_(cfg), params_(params) {
  cfg_.validate();
  const int64_t C = cfg.n_embd;
  wte_ = &params.add("wte.weight", {cfg.vocab_size, C}, {}, 0);
  wpe_ = &params.add("wpe.weight", {cfg.n_positions, C}, {}, 0);
  for (int l = 0; l < cfg.n_layer; l++) {
    std::string h = "h." + std::to_string(l) + ".";
    const int g = 1 + l;
    LayerParams lp;
    lp.ln1_w = &params.add(h + "ln_1.weight", {C}, {}, g);
    lp.ln1_b = &params.add(h + "ln_1.bias", {C}, {}, g);
    lp.qkv_w = &params.add(h + "attn.c_attn.weight", {C, 3 * C}, {}, g);
    lp.qkv_b = &params.add(h + "attn.c_attn.bias", {3 * C}, {}, g);
    lp.attproj_w = &params.add(h + "attn.c_proj.weight", {C, C}, {}, g);
    lp.attproj_b = &params.add(h + "attn.c_proj.bias", {C}, {}, g);
    lp.ln2_w = &params.add(h + "ln_2.weight", {C}, {}, g);
    lp.ln2_b = &params.add(h + "ln_2.bias", {C}, {}, g);
    lp.fc_w = &params.add(h + "mlp.c_fc.weight", {C, 4 * C}, {}, g);
    lp.fc_b = &params.add(h + "mlp.c_fc.bias", {4 * C}, {}, g);
    lp.fcproj_w = &params.add(h + "mlp.c_proj.weight", {4 * C, C}, {}, g);
    lp.fcproj_b = &params.add(h + "mlp.c_proj.bias", {C}, {}, g);
    layers_.push_back(lp);
  }
  lnf_w_ = &params.add("ln_f.weight", {C}, {}, cfg.n_layer + 1);
  lnf_b_ = &params.add("ln_f.bias", {C}, {}, cfg.n_layer + 1);
}

void Gpt::init_gpt2(uint64_t seed) {
  MT_ASSERT(params_.finalized());
  for (nn::Param& p : params_.params()) init_param(p, seed);
}

void Gpt::init_param(nn::Param& p, uint64_t seed) const {
  const std::string& n = p.name;
  auto ends_with = [&](const char* s) {
    size_t k = std::strlen(s);
    return n.size() >= k && n.compare(n.size() - k, k, s) == 0;
  };
  if (ends_with("ln_1.weight") || ends_with("ln_2.weight") || n == "ln_f.weight") {
    params_.init_constant(n, 1.0f);
  } else if (!p.decay) {
    params_.init_constant(n, 0.0f);  // biases and LayerNorm biases
  } else if (ends_with("c_proj.weight")) {
    params_.init_normal(n, seed, 0.02f / std::sqrt(2.0f * cfg_.n_layer));
  } else {
    params_.init_normal(n, seed, 0.02f);
  }
}

namespace {
std::string key(int l, const char* what) { return "h" + std::to_string(l) + "." + what; }
}  // namespace

double Gpt::forward(nn::ActivationStore& store, int mb, const int32_t* inputs, const int32_t* targets, int B, int T,
                    float dscale, nn::ParamHooks* hooks) {
  nn::ParamHooks none;
  nn::ParamHooks& hk = hooks ? *hooks : none;
  const int C = cfg_.n_embd, H = cfg_.n_head, V = cfg_.vocab_size, L = cfg_.n_layer;
  const int N = B * T;
  MT_ASSERT(T <= cfg_.n_positions, "T ", T, " > n_positions ", cfg_.n_positions);

  // Token ids are kept (as raw int32 bits in a float buffer) for the embedding backward.
  auto* ids = reinterpret_cast<int32_t*>(store.get(mb, "ids", N));
  std::memcpy(ids, inputs, sizeof(int32_t) * N);
  auto* pos = reinterpret_cast<int32_t*>(store.get(mb, "pos", N));
  for (int n = 0; n < N; n++) pos[n] = n % T;

  float* x = store.get(mb, "x0", (size_t)N * C);
  hk.before_forward(0);  // the embeddings stay in use until the logits at the end
  nn::embedding_forward(x, ids, wte_->data, N, C, false);
  nn::embedding_forward(x, pos, wpe_->data, N, C, true);

  for (int l = 0; l < L; l++) {
    const LayerParams& p = layers_[l];
    float* ln1 = store.get(mb, key(l, "ln1"), (size_t)N * C);
    float* ln1_mean = store.get(mb, key(l, "ln1_mean"), N);
    float* ln1_rstd = store.get(mb, key(l, "ln1_rstd"), N);
    float* qkv = store.get(mb, key(l, "qkv"), (size_t)N * 3 * C);
    float* att = store.get(mb, key(l, "att"), (size_t)B * H * T * T);
    float* atty = store.get(mb, key(l, "atty"), (size_t)N * C);
    float* res2 = store.get(mb, key(l, "res2"), (size_t)N * C);
    float* ln2 = store.get(mb, key(l, "ln2"), (size_t)N * C);
    float* ln2_mean = store.get(mb, key(l, "ln2_mean"), N);
    float* ln2_rstd = store.get(mb, key(l, "ln2_rstd"), N);
    float* fch = store.get(mb, key(l, "fch"), (size_t)N * 4 * C);
    float* fch_gelu = store.get(mb, key(l, "fch_gelu"), (size_t)N * 4 * C);
    float* res3 = store.get(mb, key(l, "res3"), (size_t)N * C);

    hk.before_forward(1 + l);
    nn::layernorm_forward(ln1, ln1_mean, ln1_rstd, x, p.ln1_w->data, p.ln1_b->data, N, C);
    nn::linear_forward(qkv, ln1, p.qkv_w->data, p.qkv_b->data, N, C, 3 * C);
    nn::attention_forward(atty, att, qkv, B, T, C, H);
    nn::linear_forward(res2, atty, p.attproj_w->data, p.attproj_b->data, N, C, C, x);
    nn::layernorm_forward(ln2, ln2_mean, ln2_rstd, res2, p.ln2_w->data, p.ln2_b->data, N, C);
    nn::linear_forward(fch, ln2, p.fc_w->data, p.fc_b->data, N, C, 4 * C);
    nn::gelu_forward(fch_gelu, fch, (size_t)N * 4 * C);
    nn::linear_forward(res3, fch_gelu, p.fcproj_w->data, p.fcproj_b->data, N, 4 * C, C, res2);
    hk.after_forward(1 + l);
    x = res3;
  }
  float* lnf = store.get(mb, "lnf", (size_t)N * C);
  float* lnf_mean = store.get(mb, "lnf_mean", N);
  float* lnf_rstd = store.get(mb, "lnf_rstd", N);
  hk.before_forward(L + 1);
  nn::layernorm_forward(lnf, lnf_mean, lnf_rstd, x, lnf_w_->data, lnf_b_->data, N, C);
  hk.after_forward(L + 1);
  double loss = 0.0;
  if (targets) {
    float* logits = store.get(mb, "logits", (size_t)N * V);
    gemm(false, true, N, V, C, 1.0f, lnf, C, wte_->data, C, 0.0f, logits, V);
    loss = nn::softmax_cross_entropy(logits, targets, N, V, dscale, nullptr);
  }
  hk.after_forward(0);
  return loss;
}

void Gpt::backward(nn::ActivationStore& store, int mb, int B, int T, nn::ParamHooks* hooks) {
  nn::ParamHooks none;
  nn::ParamHooks& hk = hooks ? *hooks : none;
  const int C = cfg_.n_embd, H = cfg_.n_head, V = cfg_.vocab_size, L = cfg_.n_layer;
  const int N = B * T;
  // Scratch shared by all micro-batches (one backward runs at a time): the running gradient of the
  // residual stream and per-layer temporaries.
  const int kScratch = -1;
  float* dres = store.get(kScratch, "dres", (size_t)N * C);
  float* dln = store.get(kScratch, "dln", (size_t)N * C);
  float* datty = store.get(kScratch, "datty", (size_t)N * C);
  float* dqkv = store.get(kScratch, "dqkv", (size_t)N * 3 * C);
  float* dfch = store.get(kScratch, "dfch", (size_t)N * 4 * C);

  const float* dlogits = store.get(mb, "logits", (size_t)N * V);
  const float* lnf = store.get(mb, "lnf", (size_t)N * C);
  const float* xL = store.get(mb, L > 0 ? key(L - 1, "res3") : std::string("x0"), (size_t)N * C);
  hk.before_backward(0);  // wte's gradient gets the logits' part now and the lookup's part at the end
  gemm(false, false, N, C, V, 1.0f, dlogits, V, wte_->data, C, 0.0f, dln, C);
  gemm(true, false, V, C, N, 1.0f, dlogits, V, lnf, C, 1.0f, wte_->grad, C);
  std::memset(dres, 0, sizeof(float) * N * C);
  hk.before_backward(L + 1);
  nn::layernorm_backward(dres, lnf_w_->grad, lnf_b_->grad, dln, xL, lnf_w_->data, store.get(mb, "lnf_mean", N),
                         store.get(mb, "lnf_rstd", N), N, C);
  hk.after_backward(L + 1);

  for (int l = L - 1; l >= 0; l--) {
    const LayerParams& p = layers_[l];
    const float* x = store.get(mb, l > 0 ? key(l - 1, "res3") : std::string("x0"), (size_t)N * C);
    const float* ln1 = store.get(mb, key(l, "ln1"), (size_t)N * C);
    const float* qkv = store.get(mb, key(l, "qkv"), (size_t)N * 3 * C);
    const float* att = store.get(mb, key(l, "att"), (size_t)B * H * T * T);
    const float* atty = store.get(mb, key(l, "atty"), (size_t)N * C);
    const float* res2 = store.get(mb, key(l, "res2"), (size_t)N * C);
    const float* ln2 = store.get(mb, key(l, "ln2"), (size_t)N * C);
    const float* fch = store.get(mb, key(l, "fch"), (size_t)N * 4 * C);
    const float* fch_gelu = store.get(mb, key(l, "fch_gelu"), (size_t)N * 4 * C);

    hk.before_backward(1 + l);
    // res3 = res2 + gelu(ln2 Wfc + bfc) Wfcproj + bfcproj
    nn::linear_backward(dfch, p.fcproj_w->grad, p.fcproj_b->grad, dres, fch_gelu, p.fcproj_w->data, N, 4 * C, C);
    nn::gelu_backward(dfch, fch, dfch, (size_t)N * 4 * C);
    nn::linear_backward(dln, p.fc_w->grad, p.fc_b->grad, dfch, ln2, p.fc_w->data, N, C, 4 * C);
    nn::layernorm_backward(dres, p.ln2_w->grad, p.ln2_b->grad, dln, res2, p.ln2_w->data,
                           store.get(mb, key(l, "ln2_mean"), N), store.get(mb, key(l, "ln2_rstd"), N), N, C);
    // res2 = x + attention(ln1(x)) Wproj + bproj
    nn::linear_backward(datty, p.attproj_w->grad, p.attproj_b->grad, dres, atty, p.attproj_w->data, N, C, C);
    nn::attention_backward(dqkv, datty, qkv, att, B, T, C, H);
    nn::linear_backward(dln, p.qkv_w->grad, p.qkv_b->grad, dqkv, ln1, p.qkv_w->data, N, C, 3 * C);
    nn::layernorm_backward(dres, p.ln1_w->grad, p.ln1_b->grad, dln, x, p.ln1_w->data,
                           store.get(mb, key(l, "ln1_mean"), N), store.get(mb, key(l, "ln1_rstd"), N), N, C);
    hk.after_backward(1 + l);
  }
  const auto* ids = reinterpret_cast<const int32_t*>(store.get(mb, "ids", N));
  const auto* pos = reinterpret_cast<const int32_t*>(store.get(mb, "pos", N));
  nn::embedding_backward(wte_->grad, dres, ids, N, C);
  nn::embedding_backward(wpe_->grad, dres, pos, N, C);
  hk.after_backward(0);
}

void Gpt::logits_last(nn::ActivationStore& store, int mb, int B, int T, float* out) {
  const int C = cfg_.n_embd, V = cfg_.vocab_size;
  const float* lnf = store.get(mb, "lnf", (size_t)B * T * C);
  for (int b = 0; b < B; b++) {
    gemm(false, true, 1, V, C, 1.0f, lnf + ((size_t)b * T + T - 1) * C, C, wte_->data, C, 0.0f, out + (size_t)b * V, V);
  }
}

size_t Gpt::activation_bytes(int B, int T) const {
  const size_t C = cfg_.n_embd, N = (size_t)B * T;
  size_t per_layer = N * C * 5 /*ln1 atty res2 ln2 res3*/ + N * 3 * C + N * 4 * C * 2 + (size_t)B * cfg_.n_head * T * T +
                     4 * N /*means, rstds*/;
  size_t total = N * C /*x0*/ + 2 * N /*ids, pos*/ + cfg_.n_layer * per_layer + N * C + 2 * N /*lnf*/ +
                 N * cfg_.vocab_size /*logits*/;
  return total * sizeof(float);
}

}  // namespace mt::model
