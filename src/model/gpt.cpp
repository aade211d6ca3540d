#include "model/gpt.h"

#include <cmath>
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <utility>
#include <vector>

#include "core/error.h"
#include "comm/types.h"
#include "nn/layers.h"
#include "nn/tensor_parallel_layers.h"
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

Gpt::Gpt(const GptConfig& cfg, nn::ParamRegistry& params, nn::TensorParallelOps* tp, StageRange stage)
    : cfg_(cfg), params_(params), tp_(tp), rows_(tp, false) {
  cfg_.validate();
  stage_ = stage;
  begin_ = stage.begin;
  end_ = stage.end < 0 ? cfg.n_layer : stage.end;
  MT_CHECK_INPUT(0 <= begin_ && begin_ <= end_ && end_ <= cfg.n_layer, "a pipeline stage of blocks [", begin_,
                 ", ", end_, ") does not fit a model of ", cfg.n_layer, " layers");
  MT_ASSERT(stage.count >= 1 && stage.index >= 0 && stage.index < stage.count);
  MT_ASSERT(stage.index > 0 || begin_ == 0, "the first stage starts at block 0");
  MT_ASSERT(stage.index < stage.count - 1 || end_ == cfg.n_layer, "the last stage ends at the last block");
  const int64_t C = cfg.n_embd;
  const int S = tp_size(), r = tp ? tp->rank() : 0;
  MT_CHECK_INPUT(cfg.n_head % S == 0, "n_head (", cfg.n_head, ") is not divisible by --tp (", S,
                 "): tensor parallelism splits attention by whole heads");
  const int64_t Cs = C / S;  // this rank's channels of q, k, v and of the attention output
  auto col = [&](int64_t width, int blocks) {
    return S == 1 ? nn::Shard{} : nn::Shard{1, r * width, (r + 1) * width, blocks};
  };
  auto row = [&](int64_t height) { return S == 1 ? nn::Shard{} : nn::Shard{0, r * height, (r + 1) * height, 1}; };
  auto vec = [&](int64_t width, int blocks) {
    return S == 1 ? nn::Shard{} : nn::Shard{0, r * width, (r + 1) * width, blocks};
  };
  comm::Shard vs = comm::shard_of((size_t)cfg.vocab_size, S, r);
  v0_ = (int64_t)vs.offset;
  v1_ = v0_ + (int64_t)vs.count;
  const nn::Shard wte_shard = S == 1 ? nn::Shard{} : nn::Shard{0, v0_, v1_, 1};
  if (first_stage()) {
    wte_ = &params.add("wte.weight", {cfg.vocab_size, C}, wte_shard, 0);
    wpe_ = &params.add("wpe.weight", {cfg.n_positions, C}, {}, 0);
  }
  layers_.resize(cfg.n_layer);
  for (int l = begin_; l < end_; l++) {
    std::string h = "h." + std::to_string(l) + ".";
    const int g = 1 + l;
    LayerParams lp;
    lp.ln1_w = &params.add(h + "ln_1.weight", {C}, {}, g);
    lp.ln1_b = &params.add(h + "ln_1.bias", {C}, {}, g);
    lp.qkv_w = &params.add(h + "attn.c_attn.weight", {C, 3 * C}, col(Cs, 3), g);
    lp.qkv_b = &params.add(h + "attn.c_attn.bias", {3 * C}, vec(Cs, 3), g);
    lp.attproj_w = &params.add(h + "attn.c_proj.weight", {C, C}, row(Cs), g);
    lp.attproj_b = &params.add(h + "attn.c_proj.bias", {C}, {}, g);
    lp.ln2_w = &params.add(h + "ln_2.weight", {C}, {}, g);
    lp.ln2_b = &params.add(h + "ln_2.bias", {C}, {}, g);
    lp.fc_w = &params.add(h + "mlp.c_fc.weight", {C, 4 * C}, col(4 * Cs, 1), g);
    lp.fc_b = &params.add(h + "mlp.c_fc.bias", {4 * C}, vec(4 * Cs, 1), g);
    lp.fcproj_w = &params.add(h + "mlp.c_proj.weight", {4 * C, C}, row(4 * Cs), g);
    lp.fcproj_b = &params.add(h + "mlp.c_proj.bias", {C}, {}, g);
    layers_[l] = lp;
  }
  if (last_stage()) {
    lnf_w_ = &params.add("ln_f.weight", {C}, {}, cfg.n_layer + 1);
    lnf_b_ = &params.add("ln_f.bias", {C}, {}, cfg.n_layer + 1);
    if (!first_stage()) wte_ = &params.add("wte.weight", {cfg.vocab_size, C}, wte_shard, cfg.n_layer + 1);
  }
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

void Gpt::block_forward(nn::ActivationStore& store, int smb, int slot, int l, const float* x, float* res3, int B,
                        int T) {
  const int S = tp_size();
  const int C = cfg_.n_embd, Cs = C / S, Hs = cfg_.n_head / S, N = B * T, Nr = rows_here(N);
  const LayerParams& p = layers_[l];
  // Residual-stream tensors (x, res2, res3 and the LayerNorm outputs) have Nr rows: all N, or this rank's
  // N / S under sequence parallelism, where the LayerNorm output is all-gathered before the column-parallel
  // product and the row-parallel product is reduce-scattered instead of all-reduced.
  float* ln1 = store.get(smb, key(slot, "ln1"), (size_t)Nr * C);
  float* ln1_mean = store.get(smb, key(slot, "ln1_mean"), Nr);
  float* ln1_rstd = store.get(smb, key(slot, "ln1_rstd"), Nr);
  float* qkv = store.get(smb, key(slot, "qkv"), (size_t)N * 3 * Cs);
  float* att = store.get(smb, key(slot, "att"), (size_t)B * Hs * T * T);
  float* atty = store.get(smb, key(slot, "atty"), (size_t)N * Cs);
  float* res2 = store.get(smb, key(slot, "res2"), (size_t)Nr * C);
  float* ln2 = store.get(smb, key(slot, "ln2"), (size_t)Nr * C);
  float* ln2_mean = store.get(smb, key(slot, "ln2_mean"), Nr);
  float* ln2_rstd = store.get(smb, key(slot, "ln2_rstd"), Nr);
  float* fch = store.get(smb, key(slot, "fch"), (size_t)N * 4 * Cs);
  float* fch_gelu = store.get(smb, key(slot, "fch_gelu"), (size_t)N * 4 * Cs);
  nn::layernorm_forward(ln1, ln1_mean, ln1_rstd, x, p.ln1_w->data, p.ln1_b->data, Nr, C);
  nn::linear_forward(qkv, gather_rows(store, ln1, N, C), p.qkv_w->data, p.qkv_b->data, N, C, 3 * Cs);
  nn::attention_forward(atty, att, qkv, B, T, Cs, Hs);
  row_parallel_forward(store, res2, atty, p.attproj_w->data, p.attproj_b->data, x, N, Cs, C);
  nn::layernorm_forward(ln2, ln2_mean, ln2_rstd, res2, p.ln2_w->data, p.ln2_b->data, Nr, C);
  nn::linear_forward(fch, gather_rows(store, ln2, N, C), p.fc_w->data, p.fc_b->data, N, C, 4 * Cs);
  nn::gelu_forward(fch_gelu, fch, (size_t)N * 4 * Cs);
  row_parallel_forward(store, res3, fch_gelu, p.fcproj_w->data, p.fcproj_b->data, res2, N, 4 * Cs, C);
}

int Gpt::rows_here(int N) const { return rows_.rows_here(N); }

const float* Gpt::gather_rows(nn::ActivationStore& store, const float* local, int N, int C) {
  return rows_.gather(local, sp_ ? store.get(kScratchMb, "sp_gather", (size_t)N * C) : nullptr, N, C);
}

void Gpt::scatter_rows(nn::ActivationStore& store, float* full, float* local, int N, int C) {
  rows_.reduce(full, local, N, C);
}

double Gpt::forward(nn::ActivationStore& store, int mb, const int32_t* inputs, const int32_t* targets, int B, int T,
                    float dscale, nn::ParamHooks* hooks, const float* stage_input) {
  nn::ParamHooks none;
  nn::ParamHooks& hk = hooks ? *hooks : none;
  const int S = tp_size();
  const int C = cfg_.n_embd, L = cfg_.n_layer, Vl = (int)(v1_ - v0_);
  const int N = B * T, Nr = rows_here(N), n0 = sp_ ? tp_->rank() * Nr : 0;
  MT_ASSERT(T <= cfg_.n_positions, "T ", T, " > n_positions ", cfg_.n_positions);

  float* x = store.get(mb, "x0", (size_t)Nr * C);
  if (first_stage()) {
  // Token ids are kept (as raw int32 bits in a float buffer) for the embedding backward; positions of this
  // rank's rows only.
  auto* ids = reinterpret_cast<int32_t*>(store.get(mb, "ids", N));
  std::memcpy(ids, inputs, sizeof(int32_t) * N);
  auto* pos = reinterpret_cast<int32_t*>(store.get(mb, "pos", Nr));
  for (int n = 0; n < Nr; n++) pos[n] = (n0 + n) % T;

  hk.before_forward(0);  // the embeddings stay in use until the logits at the end
  if (S == 1) {
    nn::embedding_forward(x, ids, wte_->data, N, C, false);
  } else {
    float* e = sp_ ? store.get(kScratchMb, "sp_full", (size_t)N * C) : x;
    nn::vocab_parallel_embedding_forward(rows_, e, x, ids, wte_->data, v0_, v1_, N, C);
  }
  nn::embedding_forward(x, pos, wpe_->data, Nr, C, true);
  } else {
    MT_ASSERT(stage_input, "a stage after the first needs its input activation");
    std::memcpy(x, stage_input, sizeof(float) * Nr * C);
  }

  for (int l = begin_; l < end_; l++) {
    float* res3 = store.get(mb, key(l, "res3"), (size_t)Nr * C);
    hk.before_forward(1 + l);
    // With recomputation the block's intermediates go to one scratch set shared by all layers (rebuilt in
    // backward); only the block's output (the next block's input) is kept per layer.
    block_forward(store, recompute_ ? kScratchMb : mb, recompute_ ? -1 : l, l, x, res3, B, T);
    hk.after_forward(1 + l);
    x = res3;
  }
  double loss = 0.0;
  if (last_stage()) {
  float* lnf = store.get(mb, "lnf", (size_t)Nr * C);
  float* lnf_mean = store.get(mb, "lnf_mean", Nr);
  float* lnf_rstd = store.get(mb, "lnf_rstd", Nr);
  hk.before_forward(L + 1);
  nn::layernorm_forward(lnf, lnf_mean, lnf_rstd, x, lnf_w_->data, lnf_b_->data, Nr, C);
  if (first_stage()) hk.after_forward(L + 1);  // else wte is in group L+1: keep it open for the logits
  if (targets) {
    float* logits = store.get(mb, "logits", (size_t)N * Vl);
    gemm(false, true, N, Vl, C, 1.0f, gather_rows(store, lnf, N, C), C, wte_->data, C, 0.0f, logits, Vl);
    loss = S == 1 ? nn::softmax_cross_entropy(logits, targets, N, Vl, dscale, nullptr)
                  : nn::vocab_parallel_cross_entropy(*tp_, logits, targets, N, v0_, v1_, dscale);
  }
  if (!first_stage()) hk.after_forward(L + 1);
  }
  if (first_stage()) hk.after_forward(0);
  return loss;
}

const float* Gpt::stage_output(nn::ActivationStore& store, int mb, int B, int T) {
  return store.get(mb, end_ > begin_ ? key(end_ - 1, "res3") : std::string("x0"),
                   (size_t)rows_here(B * T) * cfg_.n_embd);
}

const float* Gpt::stage_input_grad(nn::ActivationStore& store, int B, int T) {
  return store.get(kScratchMb, "dres", (size_t)rows_here(B * T) * cfg_.n_embd);
}

void Gpt::backward(nn::ActivationStore& store, int mb, int B, int T, nn::ParamHooks* hooks, const float* dout) {
  nn::ParamHooks none;
  nn::ParamHooks& hk = hooks ? *hooks : none;
  const int S = tp_size();
  const int C = cfg_.n_embd, L = cfg_.n_layer, Cs = C / S, Hs = cfg_.n_head / S, Vl = (int)(v1_ - v0_);
  const int N = B * T, Nr = rows_here(N);
  // Scratch shared by all micro-batches (one backward runs at a time): the running gradient of the
  // residual stream (this rank's Nr rows) and per-layer temporaries.
  const int kScratch = kScratchMb;
  float* dres = store.get(kScratch, "dres", (size_t)Nr * C);
  float* dln = store.get(kScratch, "dln", (size_t)Nr * C);
  float* dfull = sp_ ? store.get(kScratch, "sp_dfull", (size_t)N * C) : dln;  // a gradient of all N rows
  float* datty = store.get(kScratch, "datty", (size_t)N * Cs);
  float* dqkv = store.get(kScratch, "dqkv", (size_t)N * 3 * Cs);
  float* dfch = store.get(kScratch, "dfch", (size_t)N * 4 * Cs);
  // Sequence parallelism: this micro-batch's part of the replicated LayerNorm gradients, summed over the group.
  float* dlnp = sp_ ? store.get(kScratch, "sp_dln_params", (size_t)4 * C) : nullptr;
  // The gradient of the residual stream over all N rows (the row-parallel products' output gradient).
  auto dres_all = [&]() -> const float* {
    return rows_.gather(dres, sp_ ? store.get(kScratch, "sp_dres_full", (size_t)N * C) : nullptr, N, C);
  };

  if (first_stage()) hk.before_backward(0);  // wte's gradient: the logits' part now, the lookup's at the end
  if (last_stage()) {
  const float* dlogits = store.get(mb, "logits", (size_t)N * Vl);
  const float* lnf = store.get(mb, "lnf", (size_t)Nr * C);
  const float* xL = store.get(mb, end_ > begin_ ? key(end_ - 1, "res3") : std::string("x0"), (size_t)Nr * C);
  if (!first_stage()) hk.before_backward(L + 1);  // this stage's wte copy is in group L+1
  gemm(false, false, N, C, Vl, 1.0f, dlogits, Vl, wte_->data, C, 0.0f, dfull, C);
  scatter_rows(store, dfull, dln, N, C);  // each rank holds its vocabulary rows' share of dlnf
  gemm(true, false, Vl, C, N, 1.0f, dlogits, Vl, gather_rows(store, lnf, N, C), C, 1.0f, wte_->grad, C);
  std::memset(dres, 0, sizeof(float) * Nr * C);
  if (first_stage()) hk.before_backward(L + 1);
  if (sp_) {
    std::memset(dlnp, 0, sizeof(float) * 2 * C);
    nn::layernorm_backward(dres, dlnp, dlnp + C, dln, xL, lnf_w_->data, store.get(mb, "lnf_mean", Nr),
                           store.get(mb, "lnf_rstd", Nr), Nr, C);
    rows_.sum_replicated({{lnf_w_, dlnp}, {lnf_b_, dlnp + C}});
  } else {
    nn::layernorm_backward(dres, lnf_w_->grad, lnf_b_->grad, dln, xL, lnf_w_->data, store.get(mb, "lnf_mean", N),
                           store.get(mb, "lnf_rstd", N), N, C);
  }
  hk.after_backward(L + 1);
  } else {
    MT_ASSERT(dout, "a stage before the last needs the gradient of its output");
    std::memcpy(dres, dout, sizeof(float) * Nr * C);
  }

  for (int l = end_ - 1; l >= begin_; l--) {
    const LayerParams& p = layers_[l];
    hk.before_backward(1 + l);  // ZeRO-3 gathers the block's parameters: recomputation needs them too
    const float* x = store.get(mb, l > begin_ ? key(l - 1, "res3") : std::string("x0"), (size_t)Nr * C);
    const int smb = recompute_ ? kScratchMb : mb, slot = recompute_ ? -1 : l;
    if (recompute_) block_forward(store, smb, slot, l, x, store.get(kScratchMb, "rc_out", (size_t)Nr * C), B, T);
    const float* ln1 = store.get(smb, key(slot, "ln1"), (size_t)Nr * C);
    const float* qkv = store.get(smb, key(slot, "qkv"), (size_t)N * 3 * Cs);
    const float* att = store.get(smb, key(slot, "att"), (size_t)B * Hs * T * T);
    const float* atty = store.get(smb, key(slot, "atty"), (size_t)N * Cs);
    const float* res2 = store.get(smb, key(slot, "res2"), (size_t)Nr * C);
    const float* ln2 = store.get(smb, key(slot, "ln2"), (size_t)Nr * C);
    const float* fch = store.get(smb, key(slot, "fch"), (size_t)N * 4 * Cs);
    const float* fch_gelu = store.get(smb, key(slot, "fch_gelu"), (size_t)N * 4 * Cs);
    if (sp_) std::memset(dlnp, 0, sizeof(float) * 4 * C);
    float* d_ln2_w = sp_ ? dlnp : p.ln2_w->grad;
    float* d_ln2_b = sp_ ? dlnp + C : p.ln2_b->grad;
    float* d_ln1_w = sp_ ? dlnp + 2 * C : p.ln1_w->grad;
    float* d_ln1_b = sp_ ? dlnp + 3 * C : p.ln1_b->grad;

    // res3 = res2 + gelu(ln2 Wfc + bfc) Wfcproj + bfcproj
    nn::linear_backward(dfch, p.fcproj_w->grad, p.fcproj_b->grad, dres_all(), fch_gelu, p.fcproj_w->data, N, 4 * Cs,
                        C);
    nn::gelu_backward(dfch, fch, dfch, (size_t)N * 4 * Cs);
    nn::linear_backward(dfull, p.fc_w->grad, p.fc_b->grad, dfch, gather_rows(store, ln2, N, C), p.fc_w->data, N, C,
                        4 * Cs);
    scatter_rows(store, dfull, dln, N, C);  // column-parallel: the input gradient is a sum over the group
    nn::layernorm_backward(dres, d_ln2_w, d_ln2_b, dln, res2, p.ln2_w->data, store.get(smb, key(slot, "ln2_mean"), Nr),
                           store.get(smb, key(slot, "ln2_rstd"), Nr), Nr, C);
    // res2 = x + attention(ln1(x)) Wproj + bproj
    nn::linear_backward(datty, p.attproj_w->grad, p.attproj_b->grad, dres_all(), atty, p.attproj_w->data, N, Cs, C);
    nn::attention_backward(dqkv, datty, qkv, att, B, T, Cs, Hs);
    nn::linear_backward(dfull, p.qkv_w->grad, p.qkv_b->grad, dqkv, gather_rows(store, ln1, N, C), p.qkv_w->data, N,
                        C, 3 * Cs);
    scatter_rows(store, dfull, dln, N, C);
    nn::layernorm_backward(dres, d_ln1_w, d_ln1_b, dln, x, p.ln1_w->data, store.get(smb, key(slot, "ln1_mean"), Nr),
                           store.get(smb, key(slot, "ln1_rstd"), Nr), Nr, C);
    if (sp_)
      rows_.sum_replicated({{p.ln2_w, d_ln2_w}, {p.ln2_b, d_ln2_b}, {p.ln1_w, d_ln1_w}, {p.ln1_b, d_ln1_b}});
    hk.after_backward(1 + l);
  }
  if (!first_stage()) return;  // dres is the gradient of this stage's input (stage_input_grad)
  const auto* ids = reinterpret_cast<const int32_t*>(store.get(mb, "ids", N));
  const auto* pos = reinterpret_cast<const int32_t*>(store.get(mb, "pos", Nr));
  if (S == 1) {
    nn::embedding_backward(wte_->grad, dres, ids, N, C);
  } else {
    nn::vocab_parallel_embedding_backward(wte_->grad, dres_all(), ids, v0_, v1_, N, C);
  }
  if (sp_) {
    // Positions: T rows of wpe at most are touched; sum this micro-batch's part over the group.
    float* dwpe = store.get(kScratch, "sp_dwpe", (size_t)T * C);
    std::memset(dwpe, 0, sizeof(float) * T * C);
    nn::embedding_backward(dwpe, dres, pos, Nr, C);
    rows_.sum_replicated({{wpe_, dwpe}}, (size_t)T * C);
  } else {
    nn::embedding_backward(wpe_->grad, dres, pos, N, C);
  }
  hk.after_backward(0);
}

void Gpt::row_parallel_forward(nn::ActivationStore& store, float* out, const float* inp, const float* W,
                               const float* b, const float* residual, int N, int Cin, int C) {
  float* partial = sp_ ? store.get(kScratchMb, "sp_full", (size_t)N * C) : nullptr;
  nn::row_parallel_linear_forward(rows_, partial, out, inp, W, b, residual, N, Cin, C);
}

void Gpt::logits_last(nn::ActivationStore& store, int mb, int B, int T, float* out) {
  MT_ASSERT(!sp_ && tp_size() == 1, "logits_last is for the single-process model (sampling)");
  const int C = cfg_.n_embd, V = cfg_.vocab_size;
  const float* lnf = store.get(mb, "lnf", (size_t)B * T * C);
  for (int b = 0; b < B; b++) {
    gemm(false, true, 1, V, C, 1.0f, lnf + ((size_t)b * T + T - 1) * C, C, wte_->data, C, 0.0f, out + (size_t)b * V, V);
  }
}

size_t Gpt::activation_bytes(int B, int T) const {
  // This rank's share under tensor parallelism: heads, MLP width and vocabulary rows are split; with sequence
  // parallelism the residual stream and LayerNorm outputs too (N / S rows).
  const size_t S = tp_size(), C = cfg_.n_embd, Cs = C / S, N = (size_t)B * T, Nr = sp_ ? N / S : N;
  const size_t block = Nr * C * 3 /*ln1 res2 ln2*/ + N * Cs * (1 + 3 + 8) /*atty qkv fch fch_gelu*/ +
                       (size_t)B * (cfg_.n_head / S) * T * T + 4 * Nr /*means, rstds*/;
  const size_t kept_per_layer = Nr * C /*res3, the next block's input*/ + (recompute_ ? 0 : block);
  size_t total = Nr * C /*x0*/ + 2 * N /*ids, pos*/ + cfg_.n_layer * kept_per_layer + (recompute_ ? block : 0) +
                 Nr * C + 2 * Nr /*lnf*/ + N * (size_t)(v1_ - v0_) /*logits*/;
  return total * sizeof(float);
}

}  // namespace mt::model
