#include "model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <utility>
#include <vector>

#include "comm/types.h"
#include "core/error.h"
#include "nn/layers.h"
#include "nn/tensor_parallel_layers.h"
#include "tensor/bf16.h"
#include "tensor/blas.h"

namespace mt::model {

Gpt::Gpt(const GptConfig& cfg, nn::ParamRegistry& params, nn::TensorParallelOps* tp, StageRange stage,
         const MoeOptions& moe)
    : cfg_(cfg), params_(params), tp_(tp), rows_(tp, false), moe_opt_(moe) {
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
  moe_.resize(cfg.n_layer);
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
    if (cfg.is_moe(l)) {
      lp.fc_w = lp.fc_b = lp.fcproj_w = lp.fcproj_b = nullptr;
      const nn::RouterConfig rc{cfg.experts, cfg.moe_top_k, moe.capacity_factor, 0, moe.second};
      // A rank computes only its experts. Local experts: it registers only those (flagged, reduced over their
      // replicas); else every expert, and the data-parallel reduction adds each expert's gradient from the
      // ranks that computed it (the others add exact zeros).
      const bool all = !(moe.local_experts && moe.ep && moe.ep->size() > 1);
      moe_[l] = std::make_unique<nn::MoeMlp>(rc, l, (int)C, cfg.moe_hidden(), h + "mlp.", params, g, moe.ep, all);
    } else {
      lp.fc_w = &params.add(h + "mlp.c_fc.weight", {C, 4 * C}, col(4 * Cs, 1), g);
      lp.fc_b = &params.add(h + "mlp.c_fc.bias", {4 * C}, vec(4 * Cs, 1), g);
      lp.fcproj_w = &params.add(h + "mlp.c_proj.weight", {4 * C, C}, row(4 * Cs), g);
      lp.fcproj_b = &params.add(h + "mlp.c_proj.bias", {C}, {}, g);
    }
    for (nn::Param* w : {lp.qkv_w, lp.attproj_w, lp.fc_w, lp.fcproj_w})
      if (w) w->products = true, w->read_f32 = false;
    layers_[l] = lp;
  }
  if (last_stage()) {
    lnf_w_ = &params.add("ln_f.weight", {C}, {}, cfg.n_layer + 1);
    lnf_b_ = &params.add("ln_f.bias", {C}, {}, cfg.n_layer + 1);
    // The last stage's own copy of the tied wte, unless the first stage registered it in this registry already
    // (a V-shaped placement puts both ends on one rank: one tensor, its two uses adding to one gradient).
    nn::Param* held = first_stage() ? wte_ : params.find("wte.weight");
    if (!first_stage())
      wte_ = held ? held : &params.add("wte.weight", {cfg.vocab_size, C}, wte_shard, cfg.n_layer + 1);
    wte_->products = true;                      // the tied logits
    if (!held) wte_->read_f32 = first_stage();  // the lookup (a copy shared with the first stage keeps it)
    tie_grad_in_input_ = !first_stage() && !held;
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
                        int T, int mb) {
  const int S = tp_size();
  const int C = cfg_.n_embd, Cs = C / S, Hs = cfg_.n_head / S, N = B * T, Nr = rows_here(N);
  const LayerParams& p = layers_[l];
  // Residual-stream tensors (x, res2, res3 and the LayerNorm outputs) have Nr rows: all N, or this rank's
  // N / S under sequence parallelism, where the LayerNorm output is all-gathered before the column-parallel
  // product and the row-parallel product is reduce-scattered instead of all-reduced.
  // Inputs that backward reads only through products (ln1, qkv, atty, ln2, fch_gelu) are kept in bf16 under
  // --precision bf16 (the products round them anyway: the same bits, half the bytes, no repacking in backward):
  // written in float32 to one scratch, then rounded into the store. Under SP the LayerNorm outputs are kept as
  // this rank's rows and all-gathered in bf16 (half the bytes); an MoE block's ln2 is read in backward only by
  // the router's product (its forward still routes and dispatches from the float32 rows in the scratch).
  const bool bf16 = prec_ == Precision::bf16;
  float* tmp = bf16 ? bf16_src(store, N) : nullptr;
  auto kept = [&](const char* name, int rows, int cols) {
    uint16_t* h = store.get_bf16(smb, key(slot, name), (size_t)rows * cols);
    pack_bf16(tmp, rows, cols, cols, h);
    return h;
  };
  float* ln1 = bf16 ? tmp : store.get(smb, key(slot, "ln1"), (size_t)Nr * C);
  float* ln1_mean = store.get(smb, key(slot, "ln1_mean"), Nr);
  float* ln1_rstd = store.get(smb, key(slot, "ln1_rstd"), Nr);
  float* qkv = bf16 ? tmp : store.get(smb, key(slot, "qkv"), (size_t)N * 3 * Cs);
  float* att = store.get(smb, key(slot, "att"), (size_t)B * Hs * T * T);
  float* atty = bf16 ? tmp : store.get(smb, key(slot, "atty"), (size_t)N * Cs);
  float* res2 = store.get(smb, key(slot, "res2"), (size_t)Nr * C);
  float* ln2 = bf16 ? tmp : store.get(smb, key(slot, "ln2"), (size_t)Nr * C);
  float* ln2_mean = store.get(smb, key(slot, "ln2_mean"), Nr);
  float* ln2_rstd = store.get(smb, key(slot, "ln2_rstd"), Nr);
  nn::layernorm_forward(ln1, ln1_mean, ln1_rstd, x, p.ln1_w->data, p.ln1_b->data, Nr, C);
  float* gathered = sp_scratch(store, "sp_gather", (size_t)N * C);
  float* partial = sp_scratch(store, "sp_full", (size_t)N * C);
  uint16_t* gathered16 = bf16 && sp_ ? store.get_bf16(kScratchMb, "sp_gather16", (size_t)N * C) : nullptr;
  if (bf16)
    nn::column_parallel_linear_forward(rows_, gathered16, qkv, kept("ln1_16", Nr, C), p.qkv_w->weight(), p.qkv_b->data,
                                       N, C, 3 * Cs);
  else
    nn::column_parallel_linear_forward(rows_, gathered, qkv, ln1, p.qkv_w->weight(), p.qkv_b->data, N, C, 3 * Cs, prec_);
  if (bf16)  // ln1's float32 in tmp is spent (rounded above): qkv's scratch now
    nn::attention_forward(atty, att, kept("qkv16", N, 3 * Cs), B, T, Cs, Hs);
  else
    nn::attention_forward(atty, att, qkv, B, T, Cs, Hs, prec_);
  if (bf16)
    nn::row_parallel_linear_forward(rows_, partial, res2, kept("atty16", N, Cs), p.attproj_w->weight(), p.attproj_b->data,
                                    x, N, Cs, C);
  else
    nn::row_parallel_linear_forward(rows_, partial, res2, atty, p.attproj_w->weight(), p.attproj_b->data, x, N, Cs, C,
                                    prec_);
  nn::layernorm_forward(ln2, ln2_mean, ln2_rstd, res2, p.ln2_w->data, p.ln2_b->data, Nr, C);
  const uint16_t* ln2_16 = bf16 ? kept("ln2_16", Nr, C) : nullptr;
  if (moe_[l]) {
    moe_forward(store, smb, l, ln2, res2, res3, B, T, mb);
    return;
  }
  float* fch = store.get(smb, key(slot, "fch"), (size_t)N * 4 * Cs);
  if (bf16)
    nn::column_parallel_linear_forward(rows_, gathered16, fch, ln2_16, p.fc_w->weight(), p.fc_b->data, N, C, 4 * Cs);
  else
    nn::column_parallel_linear_forward(rows_, gathered, fch, ln2, p.fc_w->weight(), p.fc_b->data, N, C, 4 * Cs, prec_);
  if (bf16) {
    // Only fcproj's products read gelu(fch) (gelu_backward reads fch): kept as the bf16 they round it to.
    uint16_t* fch_gelu16 = store.get_bf16(smb, key(slot, "fch_gelu16"), (size_t)N * 4 * Cs);
    nn::gelu_forward_bf16(fch_gelu16, fch, (size_t)N * 4 * Cs);
    nn::row_parallel_linear_forward(rows_, partial, res3, fch_gelu16, p.fcproj_w->weight(), p.fcproj_b->data, res2, N,
                                    4 * Cs, C);
    return;
  }
  float* fch_gelu = store.get(smb, key(slot, "fch_gelu"), (size_t)N * 4 * Cs);
  nn::gelu_forward(fch_gelu, fch, (size_t)N * 4 * Cs);
  nn::row_parallel_linear_forward(rows_, partial, res3, fch_gelu, p.fcproj_w->weight(), p.fcproj_b->data, res2, N, 4 * Cs,
                                  C, prec_);
}

namespace {
// Where a micro-batch's MoE routing stands (kept per micro-batch for backward and recomputation).
struct MoePosition {
  int64_t step = 0, first_window = 0;
  float dscale = 0;
};
// Tokens per routing group: G windows, or the whole micro-batch when it holds fewer (sampling).
int group_tokens(int G, int B, int T) { return (B % G == 0 ? G : B) * T; }
}  // namespace

// res3 = res2 + MoE(ln2). The router and experts are replicated over the tensor-parallel group: every rank
// routes all N rows (gathered under sequence parallelism) and keeps its own rows of the result.
void Gpt::moe_forward(nn::ActivationStore& store, int smb, int l, const float* ln2, const float* res2, float* res3,
                      int B, int T, int mb) {
  const int C = cfg_.n_embd, N = B * T, Nr = rows_here(N);
  nn::MoeMlp& m = *moe_[l];
  const MoePosition& pos = store.object<MoePosition>(mb, "moe_pos");
  m.set_group_tokens(group_tokens(moe_opt_.group_windows, B, T));
  const nn::RouterDraws draws{moe_opt_.seed, pos.step, l, pos.first_window * T};
  const float* x = gather_rows(store, ln2, N, C);
  if (!sp_) {
    m.forward(store, smb, x, res2, res3, N, draws);
    return;
  }
  float* full = store.get(kScratchMb, "moe_full", (size_t)N * C);
  m.forward(store, smb, x, nullptr, full, N, draws);
  const float* mine = full + (size_t)tp_->rank() * Nr * C;
  for (size_t i = 0; i < (size_t)Nr * C; i++) res3[i] = res2[i] + mine[i];
}

// dln (this rank's rows) = d MoE / d ln2 given dres_all (all N rows of the block output's gradient).
void Gpt::moe_backward(nn::ActivationStore& store, int smb, int l, const float* ln2, const uint16_t* ln2_16,
                       uint16_t* gathered16, const float* dres_all, float* dln, int B, int T, int mb) {
  const int C = cfg_.n_embd, N = B * T, Nr = rows_here(N);
  nn::MoeMlp& m = *moe_[l];
  const MoePosition& pos = store.object<MoePosition>(mb, "moe_pos");
  const float Ng = (float)group_tokens(moe_opt_.group_windows, B, T);
  float* dx = sp_ ? store.get(kScratchMb, "moe_dfull", (size_t)N * C) : dln;
  const float aux = moe_opt_.aux_alpha * Ng * pos.dscale, z = moe_opt_.z_beta * pos.dscale;
  if (ln2_16)
    m.backward(store, smb, rows_.gather(ln2_16, gathered16, N, C), dres_all, dx, N, aux, z);
  else
    m.backward(store, smb, gather_rows(store, ln2, N, C), dres_all, dx, N, aux, z);
  if (sp_) std::memcpy(dln, dx + (size_t)tp_->rank() * Nr * C, sizeof(float) * Nr * C);
}

int Gpt::rows_here(int N) const { return rows_.rows_here(N); }

void Gpt::set_precision(Precision p) {
  prec_ = p;
  for (auto& m : moe_)
    if (m) m->set_precision(p);
}

float* Gpt::bf16_src(nn::ActivationStore& store, int N) {
  const int C = cfg_.n_embd, Cs = C / tp_size();
  return store.get(kScratchMb, "bf16_src", (size_t)N * std::max(C, 3 * Cs));
}

float* Gpt::sp_scratch(nn::ActivationStore& store, const char* name, size_t count) {
  return sp_ ? store.get(kScratchMb, name, count) : nullptr;
}

const float* Gpt::gather_rows(nn::ActivationStore& store, const float* local, int N, int C) {
  return rows_.gather(local, sp_scratch(store, "sp_gather", (size_t)N * C), N, C);
}


double Gpt::forward(nn::ActivationStore& store, int mb, const int32_t* inputs, const int32_t* targets, int B, int T,
                    float dscale, nn::ParamHooks* hooks, const float* stage_input, float* output_into) {
  MT_ASSERT(!output_into || output_into_applies(), "output_into given to the last stage or one without blocks");
  nn::GroupHooks hk(params_, hooks);
  const int S = tp_size();
  const int C = cfg_.n_embd, L = cfg_.n_layer, Vl = (int)(v1_ - v0_);
  const int N = B * T, Nr = rows_here(N), n0 = sp_ ? tp_->rank() * Nr : 0;
  MT_ASSERT(T <= cfg_.n_positions, "T ", T, " > n_positions ", cfg_.n_positions);

  float* x = store.get(mb, "x0", (size_t)Nr * C);
  if (cfg_.moe_every > 0) store.object<MoePosition>(mb, "moe_pos") = {moe_pos_.first, moe_pos_.second, dscale};
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
    float* res3 = output_into && l == end_ - 1 ? output_into : store.get(mb, key(l, "res3"), (size_t)Nr * C);
    hk.before_forward(1 + l);
    // With recomputation the block's intermediates go to one scratch set shared by all layers (rebuilt in
    // backward); only the block's output (the next block's input) is kept per layer.
    block_forward(store, recompute_ ? kScratchMb : mb, recompute_ ? -1 : l, l, x, res3, B, T, mb);
    hk.after_forward(1 + l);
    x = res3;
    // The block before this one is complete (this one has read its output): the store may spill it
    // (--offload-activations; a no-op otherwise).
    if (l > begin_) store.spill(mb, key(l - 1, ""));
  }
  double loss = 0.0;
  if (last_stage()) {
  // Under bf16 a step's lnf is read later only by the logits' weight-gradient product: kept in bf16 (rounded from
  // the scratch). Without targets (sampling, logits for Python) it stays float32 under "lnf" for the caller.
  const bool keep_lnf16 = prec_ == Precision::bf16 && targets;
  float* lnf = keep_lnf16 ? bf16_src(store, N) : store.get(mb, "lnf", (size_t)Nr * C);
  float* lnf_mean = store.get(mb, "lnf_mean", Nr);
  float* lnf_rstd = store.get(mb, "lnf_rstd", Nr);
  hk.before_forward(L + 1);
  nn::layernorm_forward(lnf, lnf_mean, lnf_rstd, x, lnf_w_->data, lnf_b_->data, Nr, C);
  if (keep_lnf16) pack_bf16(lnf, Nr, C, C, store.get_bf16(mb, "lnf16", (size_t)Nr * C));
  if (first_stage()) hk.after_forward(L + 1);  // else wte is in group L+1: keep it open for the logits
  if (targets) {
    float* logits = store.get(mb, "logits", (size_t)N * Vl);
    nn::vocab_parallel_logits_forward(rows_, sp_scratch(store, "sp_gather", (size_t)N * C), logits, lnf, wte_->weight(), N,
                                      C, Vl, prec_);
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
  backward_pass(store, mb, B, T, hooks, dout, false);
}

void Gpt::backward_input(nn::ActivationStore& store, int mb, int B, int T, nn::ParamHooks* hooks, const float* dout) {
  backward_pass(store, mb, B, T, hooks, dout, true);
}

// The whole backward, or (input_only) its input half: the same kernels with the parameter gradients skipped
// (GradOut null), the output gradients the weight half needs copied under (mb, "h{l}.d_*"), the recomputed
// intermediates kept under the micro-batch, and the parameters bracketed as a use, not as final gradients.
void Gpt::backward_pass(nn::ActivationStore& store, int mb, int B, int T, nn::ParamHooks* hooks, const float* dout,
                        bool input_only) {
  nn::GroupHooks hk(params_, hooks);
  // The parameter gradient of p (skipped in the input half).
  auto grad = [&](nn::Param* p) { return input_only ? nn::GradOut() : p->grad_out(); };
  // Keeps an output gradient that a parameter gradient reads, for the weight half.
  auto keep = [&](int l, const char* name, const float* src, size_t n) {
    if (input_only) std::memcpy(store.get(mb, key(l, name), n), src, sizeof(float) * n);
  };
  // Around a group's use. Opened as a backward either way (ZeRO 3 gathers the parameters, ZeRO 2 and 3 bind the
  // gradient buffers: an MoE block's experts and router write theirs in the input half); closed as a use only
  // in the input half (ZeRO 3 frees the parameters), since the gradients are final only at backward_weight.
  auto open = [&](int g) { hk.before_backward(g); };
  auto close = [&](int g) { input_only ? hk.after_forward(g) : hk.after_backward(g); };
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
  // Under SP: all N rows of the residual stream's gradient (the row-parallel products' output gradient) and of
  // the column-parallel products' input (dfull holds the group sum of their input gradient), rebuilt in each use.
  float* dres_full = sp_scratch(store, "sp_dres_full", (size_t)N * C);
  float* gathered = sp_scratch(store, "sp_gather", (size_t)N * C);
  auto dres_all = [&]() -> const float* { return rows_.gather(dres, dres_full, N, C); };

  if (first_stage()) open(0);  // wte's gradient: the logits' part now, the lookup's at the end
  if (last_stage()) {
  const float* dlogits = store.get(mb, "logits", (size_t)N * Vl);
  const float* xL = store.get(mb, end_ > begin_ ? key(end_ - 1, "res3") : std::string("x0"), (size_t)Nr * C);
  if (!first_stage()) open(L + 1);  // this stage's wte copy is in group L+1
  // The last stage's own wte copy takes its gradient here even in the input half (tie_grad_in_input_).
  const nn::GradOut dwte = tie_grad_in_input_ ? wte_->grad_out() : grad(wte_);
  if (prec_ == Precision::bf16)  // lnf kept in bf16 (forward)
    nn::vocab_parallel_logits_backward(rows_, sp_ ? store.get_bf16(kScratchMb, "sp_gather16", (size_t)N * C) : nullptr,
                                       dfull, dln, dwte, dlogits, store.get_bf16(mb, "lnf16", (size_t)Nr * C),
                                       wte_->weight(), N, C, Vl);
  else
    nn::vocab_parallel_logits_backward(rows_, gathered, dfull, dln, dwte, dlogits,
                                       store.get(mb, "lnf", (size_t)Nr * C), wte_->weight(), N, C, Vl, prec_);
  std::memset(dres, 0, sizeof(float) * Nr * C);
  if (first_stage()) open(L + 1);
  keep(L, "d_lnf", dln, (size_t)Nr * C);
  if (input_only) {
    nn::layernorm_backward(dres, nullptr, nullptr, dln, xL, lnf_w_->data, store.get(mb, "lnf_mean", Nr),
                           store.get(mb, "lnf_rstd", Nr), Nr, C);
  } else if (sp_) {
    std::memset(dlnp, 0, sizeof(float) * 2 * C);
    nn::layernorm_backward(dres, dlnp, dlnp + C, dln, xL, lnf_w_->data, store.get(mb, "lnf_mean", Nr),
                           store.get(mb, "lnf_rstd", Nr), Nr, C);
    rows_.sum_replicated({{lnf_w_, dlnp}, {lnf_b_, dlnp + C}});
  } else {
    nn::layernorm_backward(dres, lnf_w_->grad_out(), lnf_b_->grad_out(), dln, xL, lnf_w_->data,
                           store.get(mb, "lnf_mean", N), store.get(mb, "lnf_rstd", N), N, C);
  }
  close(L + 1);
  } else {
    MT_ASSERT(dout, "a stage before the last needs the gradient of its output");
    std::memcpy(dres, dout, sizeof(float) * Nr * C);
  }

  for (int l = end_ - 1; l >= begin_; l--) {
    const LayerParams& p = layers_[l];
    // A spilled block comes back ahead of its backward: the one this block reads the input of, and the next.
    for (int k = l - 1; k >= std::max(begin_, l - 2); k--) store.fetch(mb, key(k, ""));
    open(1 + l);  // ZeRO-3 gathers the block's parameters: recomputation needs them too
    const float* x = store.get(mb, l > begin_ ? key(l - 1, "res3") : std::string("x0"), (size_t)Nr * C);
    // The input half keeps recomputed intermediates under the micro-batch: the weight half reads them.
    const bool scratch = recompute_ && !input_only;
    const int smb = scratch ? kScratchMb : mb, slot = scratch ? -1 : l;
    if (recompute_) {
      if (moe_[l]) moe_[l]->set_recording(false);  // counted in forward already
      block_forward(store, smb, slot, l, x, store.get(kScratchMb, "rc_out", (size_t)Nr * C), B, T, mb);
      if (moe_[l]) moe_[l]->set_recording(true);
    }
    // As block_forward keeps them: ln1, qkv, atty, ln2 and fch_gelu in bf16 under --precision bf16 (the LayerNorm
    // outputs as this rank's rows under SP, gathered in bf16 for the products).
    const bool bf16 = prec_ == Precision::bf16;
    const float* att = store.get(smb, key(slot, "att"), (size_t)B * Hs * T * T);
    const float* res2 = store.get(smb, key(slot, "res2"), (size_t)Nr * C);
    const float* ln2 = bf16 ? nullptr : store.get(smb, key(slot, "ln2"), (size_t)Nr * C);
    const uint16_t* ln2_16 = bf16 ? store.get_bf16(smb, key(slot, "ln2_16"), (size_t)Nr * C) : nullptr;
    uint16_t* gathered16 = bf16 && sp_ ? store.get_bf16(kScratchMb, "sp_gather16", (size_t)N * C) : nullptr;
    if (sp_ && !input_only) std::memset(dlnp, 0, sizeof(float) * 4 * C);
    // Under SP the LayerNorm parameters' gradients of this micro-batch go to dlnp first (summed over the group).
    const nn::GradOut d_ln2_w = input_only ? nn::GradOut() : sp_ ? nn::GradOut(dlnp) : p.ln2_w->grad_out();
    const nn::GradOut d_ln2_b = input_only ? nn::GradOut() : sp_ ? nn::GradOut(dlnp + C) : p.ln2_b->grad_out();
    const nn::GradOut d_ln1_w = input_only ? nn::GradOut() : sp_ ? nn::GradOut(dlnp + 2 * C) : p.ln1_w->grad_out();
    const nn::GradOut d_ln1_b = input_only ? nn::GradOut() : sp_ ? nn::GradOut(dlnp + 3 * C) : p.ln1_b->grad_out();

    if (moe_[l]) {
      moe_backward(store, smb, l, ln2, ln2_16, gathered16, dres_all(), dln, B, T, mb);
    } else {
      // res3 = res2 + gelu(ln2 Wfc + bfc) Wfcproj + bfcproj
      const float* fch = store.get(smb, key(slot, "fch"), (size_t)N * 4 * Cs);
      keep(l, "d_res3", dres, (size_t)Nr * C);
      if (prec_ == Precision::bf16) {
        const uint16_t* fch_gelu16 = store.get_bf16(smb, key(slot, "fch_gelu16"), (size_t)N * 4 * Cs);
        nn::row_parallel_linear_backward(rows_, dres_full, dfch, grad(p.fcproj_w), grad(p.fcproj_b), dres,
                                         fch_gelu16, p.fcproj_w->weight(), N, 4 * Cs, C);
      } else {
        const float* fch_gelu = store.get(smb, key(slot, "fch_gelu"), (size_t)N * 4 * Cs);
        nn::row_parallel_linear_backward(rows_, dres_full, dfch, grad(p.fcproj_w), grad(p.fcproj_b), dres,
                                         fch_gelu, p.fcproj_w->weight(), N, 4 * Cs, C, prec_);
      }
      nn::gelu_backward(dfch, fch, dfch, (size_t)N * 4 * Cs);
      keep(l, "d_fch", dfch, (size_t)N * 4 * Cs);
      if (bf16)
        nn::column_parallel_linear_backward(rows_, gathered16, dfull, dln, grad(p.fc_w), grad(p.fc_b), dfch,
                                            ln2_16, p.fc_w->weight(), N, C, 4 * Cs);
      else
        nn::column_parallel_linear_backward(rows_, gathered, dfull, dln, grad(p.fc_w), grad(p.fc_b), dfch,
                                            ln2, p.fc_w->weight(), N, C, 4 * Cs, prec_);
    }
    keep(l, "d_ln2", dln, (size_t)Nr * C);
    nn::layernorm_backward(dres, d_ln2_w, d_ln2_b, dln, res2, p.ln2_w->data, store.get(smb, key(slot, "ln2_mean"), Nr),
                           store.get(smb, key(slot, "ln2_rstd"), Nr), Nr, C);
    // res2 = x + attention(ln1(x)) Wproj + bproj
    keep(l, "d_res2", dres, (size_t)Nr * C);
    if (bf16)
      nn::row_parallel_linear_backward(rows_, dres_full, datty, grad(p.attproj_w), grad(p.attproj_b), dres,
                                       store.get_bf16(smb, key(slot, "atty16"), (size_t)N * Cs), p.attproj_w->weight(), N,
                                       Cs, C);
    else
      nn::row_parallel_linear_backward(rows_, dres_full, datty, grad(p.attproj_w), grad(p.attproj_b), dres,
                                       store.get(smb, key(slot, "atty"), (size_t)N * Cs), p.attproj_w->weight(), N, Cs, C,
                                       prec_);
    if (bf16)
      nn::attention_backward(dqkv, datty, store.get_bf16(smb, key(slot, "qkv16"), (size_t)N * 3 * Cs), att, B, T, Cs,
                             Hs);
    else
      nn::attention_backward(dqkv, datty, store.get(smb, key(slot, "qkv"), (size_t)N * 3 * Cs), att, B, T, Cs, Hs,
                             prec_);
    keep(l, "d_qkv", dqkv, (size_t)N * 3 * Cs);
    if (bf16)
      nn::column_parallel_linear_backward(rows_, gathered16, dfull, dln, grad(p.qkv_w), grad(p.qkv_b), dqkv,
                                          store.get_bf16(smb, key(slot, "ln1_16"), (size_t)Nr * C), p.qkv_w->weight(), N,
                                          C, 3 * Cs);
    else
      nn::column_parallel_linear_backward(rows_, gathered, dfull, dln, grad(p.qkv_w), grad(p.qkv_b), dqkv,
                                          store.get(smb, key(slot, "ln1"), (size_t)Nr * C), p.qkv_w->weight(), N, C, 3 * Cs,
                                          prec_);
    keep(l, "d_ln1", dln, (size_t)Nr * C);
    nn::layernorm_backward(dres, d_ln1_w, d_ln1_b, dln, x, p.ln1_w->data, store.get(smb, key(slot, "ln1_mean"), Nr),
                           store.get(smb, key(slot, "ln1_rstd"), Nr), Nr, C);
    if (sp_ && !input_only)
      rows_.sum_replicated({{p.ln2_w, dlnp}, {p.ln2_b, dlnp + C}, {p.ln1_w, dlnp + 2 * C}, {p.ln1_b, dlnp + 3 * C}});
    close(1 + l);
    if (!input_only) store.drop(mb, key(l, ""));  // read by no later step of this backward
  }
  if (!first_stage()) return;  // dres is the gradient of this stage's input (stage_input_grad)
  if (input_only) {  // the embeddings' gradients are the weight half's
    keep(-1, "d_x0", dres, (size_t)Nr * C);
    close(0);
    return;
  }
  const auto* ids = reinterpret_cast<const int32_t*>(store.get(mb, "ids", N));
  const auto* pos = reinterpret_cast<const int32_t*>(store.get(mb, "pos", Nr));
  if (S == 1) {
    nn::embedding_backward(wte_->grad_acc(), dres, ids, N, C);
  } else {
    nn::vocab_parallel_embedding_backward(wte_->grad_acc(), dres_all(), ids, v0_, v1_, N, C);
  }
  if (sp_) {
    // Positions: T rows of wpe at most are touched; sum this micro-batch's part over the group.
    float* dwpe = store.get(kScratch, "sp_dwpe", (size_t)T * C);
    std::memset(dwpe, 0, sizeof(float) * T * C);
    nn::embedding_backward(dwpe, dres, pos, Nr, C);
    rows_.sum_replicated({{wpe_, dwpe}}, (size_t)T * C);
  } else {
    nn::embedding_backward(wpe_->grad_acc(), dres, pos, N, C);
  }
  hk.after_backward(0);
}

// The weight half: every parameter gradient the input half skipped, from the output gradients it kept and the
// forward's (or the recomputation's) activations, with the same kernels in the same order as the whole
// backward, so each parameter gets the same bits; the groups' hooks hear here that their gradients are final.
// Under sequence parallelism the products' inputs and output gradients are all-gathered again (the tensor
// group runs the same list, so its collectives match).
void Gpt::backward_weight(nn::ActivationStore& store, int mb, int B, int T, nn::ParamHooks* hooks) {
  nn::GroupHooks hk(params_, hooks);
  const int S = tp_size();
  const int C = cfg_.n_embd, L = cfg_.n_layer, Cs = C / S, Vl = (int)(v1_ - v0_);
  const int N = B * T, Nr = rows_here(N);
  float* dfull = sp_ ? store.get(kScratchMb, "sp_dfull", (size_t)N * C) : nullptr;
  float* dlnp = sp_ ? store.get(kScratchMb, "sp_dln_params", (size_t)4 * C) : nullptr;
  float* dres_full = sp_scratch(store, "sp_dres_full", (size_t)N * C);
  float* gathered = sp_scratch(store, "sp_gather", (size_t)N * C);
  auto kept = [&](int l, const char* name, size_t n) -> const float* { return store.get(mb, key(l, name), n); };

  if (first_stage()) hk.before_backward(0);
  if (last_stage()) {
    const float* dlogits = store.get(mb, "logits", (size_t)N * Vl);
    const float* xL = store.get(mb, end_ > begin_ ? key(end_ - 1, "res3") : std::string("x0"), (size_t)Nr * C);
    if (!first_stage()) hk.before_backward(L + 1);
    if (tie_grad_in_input_) {
      // wte's gradient was taken by the input half
    } else if (prec_ == Precision::bf16)  // lnf kept in bf16 (forward)
      nn::vocab_parallel_logits_backward(rows_,
                                         sp_ ? store.get_bf16(kScratchMb, "sp_gather16", (size_t)N * C) : nullptr,
                                         dfull, nullptr, wte_->grad_out(), dlogits,
                                         store.get_bf16(mb, "lnf16", (size_t)Nr * C), wte_->weight(), N, C, Vl);
    else
      nn::vocab_parallel_logits_backward(rows_, gathered, dfull, nullptr, wte_->grad_out(), dlogits,
                                         store.get(mb, "lnf", (size_t)Nr * C), wte_->weight(), N, C, Vl, prec_);
    if (first_stage()) hk.before_backward(L + 1);
    const float* dlnf = kept(L, "d_lnf", (size_t)Nr * C);
    if (sp_) {
      std::memset(dlnp, 0, sizeof(float) * 2 * C);
      nn::layernorm_backward(nullptr, dlnp, dlnp + C, dlnf, xL, lnf_w_->data, store.get(mb, "lnf_mean", Nr),
                             store.get(mb, "lnf_rstd", Nr), Nr, C);
      rows_.sum_replicated({{lnf_w_, dlnp}, {lnf_b_, dlnp + C}});
    } else {
      nn::layernorm_backward(nullptr, lnf_w_->grad_out(), lnf_b_->grad_out(), dlnf, xL, lnf_w_->data,
                             store.get(mb, "lnf_mean", N), store.get(mb, "lnf_rstd", N), N, C);
    }
    hk.after_backward(L + 1);
  }
  for (int l = end_ - 1; l >= begin_; l--) {
    const LayerParams& p = layers_[l];
    hk.before_backward(1 + l);
    const float* x = store.get(mb, l > begin_ ? key(l - 1, "res3") : std::string("x0"), (size_t)Nr * C);
    const int slot = l;  // backward_input kept recomputed intermediates under the micro-batch too
    const bool bf16 = prec_ == Precision::bf16;
    uint16_t* gathered16 = bf16 && sp_ ? store.get_bf16(kScratchMb, "sp_gather16", (size_t)N * C) : nullptr;
    const float* res2 = store.get(mb, key(slot, "res2"), (size_t)Nr * C);
    if (sp_) std::memset(dlnp, 0, sizeof(float) * 4 * C);
    const nn::GradOut d_ln2_w = sp_ ? nn::GradOut(dlnp) : p.ln2_w->grad_out();
    const nn::GradOut d_ln2_b = sp_ ? nn::GradOut(dlnp + C) : p.ln2_b->grad_out();
    const nn::GradOut d_ln1_w = sp_ ? nn::GradOut(dlnp + 2 * C) : p.ln1_w->grad_out();
    const nn::GradOut d_ln1_b = sp_ ? nn::GradOut(dlnp + 3 * C) : p.ln1_b->grad_out();
    // The weight halves of the block's two linear pairs, from the kept inputs (bf16 copies under --precision
    // bf16): a row-parallel one (input `in`, [N, K] on this rank, out [N, C]) and a column-parallel one (input the
    // layernorm's output `ln`, [Nr, C], out [N, K] on this rank).
    auto row_weight = [&](nn::Param* w, nn::Param* b, const float* dout, const char* in, const char* in16, int K) {
      if (bf16)
        nn::row_parallel_linear_backward(rows_, dres_full, nullptr, w->grad_out(), b->grad_out(), dout,
                                         store.get_bf16(mb, key(slot, in16), (size_t)N * K), w->weight(), N, K, C);
      else
        nn::row_parallel_linear_backward(rows_, dres_full, nullptr, w->grad_out(), b->grad_out(), dout,
                                         store.get(mb, key(slot, in), (size_t)N * K), w->weight(), N, K, C, prec_);
    };
    auto column_weight = [&](nn::Param* w, nn::Param* b, const float* dout, const char* ln, const char* ln16, int K) {
      if (bf16)
        nn::column_parallel_linear_backward(rows_, gathered16, nullptr, nullptr, w->grad_out(), b->grad_out(), dout,
                                            store.get_bf16(mb, key(slot, ln16), (size_t)Nr * C), w->weight(), N, C, K);
      else
        nn::column_parallel_linear_backward(rows_, gathered, dfull, nullptr, w->grad_out(), b->grad_out(), dout,
                                            store.get(mb, key(slot, ln), (size_t)Nr * C), w->weight(), N, C, K, prec_);
    };
    if (!moe_[l]) {  // an MoE block's experts and router took their gradients in backward_input
      const float* d_res3 = kept(l, "d_res3", (size_t)Nr * C);
      const float* dfch = kept(l, "d_fch", (size_t)N * 4 * Cs);
      row_weight(p.fcproj_w, p.fcproj_b, d_res3, "fch_gelu", "fch_gelu16", 4 * Cs);
      column_weight(p.fc_w, p.fc_b, dfch, "ln2", "ln2_16", 4 * Cs);
    }
    nn::layernorm_backward(nullptr, d_ln2_w, d_ln2_b, kept(l, "d_ln2", (size_t)Nr * C), res2, p.ln2_w->data,
                           store.get(mb, key(slot, "ln2_mean"), Nr), store.get(mb, key(slot, "ln2_rstd"), Nr), Nr, C);
    row_weight(p.attproj_w, p.attproj_b, kept(l, "d_res2", (size_t)Nr * C), "atty", "atty16", Cs);
    column_weight(p.qkv_w, p.qkv_b, kept(l, "d_qkv", (size_t)N * 3 * Cs), "ln1", "ln1_16", 3 * Cs);
    nn::layernorm_backward(nullptr, d_ln1_w, d_ln1_b, kept(l, "d_ln1", (size_t)Nr * C), x, p.ln1_w->data,
                           store.get(mb, key(slot, "ln1_mean"), Nr), store.get(mb, key(slot, "ln1_rstd"), Nr), Nr, C);
    if (sp_)
      rows_.sum_replicated({{p.ln2_w, dlnp}, {p.ln2_b, dlnp + C}, {p.ln1_w, dlnp + 2 * C}, {p.ln1_b, dlnp + 3 * C}});
    hk.after_backward(1 + l);
  }
  if (!first_stage()) return;
  const float* dx0 = kept(-1, "d_x0", (size_t)Nr * C);
  const auto* ids = reinterpret_cast<const int32_t*>(store.get(mb, "ids", N));
  const auto* pos = reinterpret_cast<const int32_t*>(store.get(mb, "pos", Nr));
  if (S == 1) {
    nn::embedding_backward(wte_->grad_acc(), dx0, ids, N, C);
  } else {
    nn::vocab_parallel_embedding_backward(wte_->grad_acc(), rows_.gather(dx0, dres_full, N, C), ids, v0_, v1_, N, C);
  }
  if (sp_) {
    float* dwpe = store.get(kScratchMb, "sp_dwpe", (size_t)T * C);
    std::memset(dwpe, 0, sizeof(float) * T * C);
    nn::embedding_backward(dwpe, dx0, pos, Nr, C);
    rows_.sum_replicated({{wpe_, dwpe}}, (size_t)T * C);
  } else {
    nn::embedding_backward(wpe_->grad_acc(), dx0, pos, N, C);
  }
  hk.after_backward(0);
}

void Gpt::logits_last(nn::ActivationStore& store, int mb, int B, int T, float* out) {
  MT_ASSERT(!sp_ && tp_size() == 1, "logits_last is for the single-process model (sampling)");
  const int C = cfg_.n_embd, V = cfg_.vocab_size;
  const float* lnf = store.get(mb, "lnf", (size_t)B * T * C);
  for (int b = 0; b < B; b++) {
    gemm(false, true, 1, V, C, 1.0f, lnf + ((size_t)b * T + T - 1) * C, C, wte_->data, C, 0.0f, out + (size_t)b * V, V,
         prec_);
  }
}

size_t Gpt::activation_bytes(int B, int T) const {
  // This rank's share under tensor parallelism: heads, MLP width and vocabulary rows are split; with sequence
  // parallelism the residual stream and LayerNorm outputs too (N / S rows).
  const size_t S = tp_size(), C = cfg_.n_embd, Cs = C / S, N = (size_t)B * T, Nr = sp_ ? N / S : N;
  // Under bf16 the inputs only products read are kept in bf16 (block_forward): half their floats.
  const bool bf16 = prec_ == Precision::bf16;
  const size_t ln = bf16 ? Nr * C / 2 : Nr * C;  // one LayerNorm output
  const size_t mlp = N * Cs * (bf16 ? 4 + 2 : 4 + 4) /*fch fch_gelu*/;
  const size_t block = 2 * ln /*ln1 ln2*/ + Nr * C /*res2*/ + (bf16 ? N * Cs / 2 : N * Cs) /*atty*/ +
                       (bf16 ? N * Cs * 3 / 2 : N * Cs * 3) /*qkv*/ + mlp + (size_t)B * (cfg_.n_head / S) * T * T + 4 * Nr /*means, rstds*/;
  // An MoE block keeps, instead of fch and fch_gelu, the router logits and (with about k N admitted rows)
  // the experts' inputs, hidden pre- and post-GELU, outputs and the combined rows.
  const size_t A = N * (size_t)cfg_.moe_top_k, Hx = cfg_.moe_hidden();
  // Under bf16 the experts' inputs and GELU outputs are kept in bf16 (moe.cpp): half their floats.
  const size_t experts = bf16 ? A * (2 * C + C / 2 + Hx + Hx / 2) : A * (3 * C + 2 * Hx);
  const size_t moe_block = block - mlp + N * (size_t)cfg_.experts + experts;
  size_t total = Nr * C /*x0*/ + 2 * N /*ids, pos*/ + (bf16 ? Nr * C / 2 : Nr * C) + 2 * Nr /*lnf*/ +
                 N * (size_t)(v1_ - v0_) /*logits*/;
  size_t biggest = 0;
  for (int l = begin_; l < end_; l++) {
    const size_t b = moe_[l] ? moe_block : block;
    total += Nr * C /*res3, the next block's input*/ + (recompute_ ? 0 : b);
    biggest = std::max(biggest, b);
  }
  if (recompute_) total += biggest;
  if (bf16) total += N * std::max(C, 3 * Cs);  // block_forward's float32 scratch for the kept inputs
  if (bf16 && sp_) total += N * C / 2;         // and the bf16 all-gather of a kept LayerNorm output
  return total * sizeof(float);
}

size_t Gpt::backward_scratch_bytes(int B, int T) const {
  const size_t S = tp_size(), C = cfg_.n_embd, Cs = C / S, N = (size_t)B * T, Nr = sp_ ? N / S : N;
  size_t f = 2 * Nr * C /*dres dln*/ + N * Cs * (1 + 3 + 4) /*datty dqkv dfch*/;
  if (sp_) f += 3 * N * C /*sp_dfull sp_dres_full sp_gather*/ + 4 * C /*sp_dln_params*/;
  if (recompute_) f += Nr * C /*rc_out*/;
  return f * sizeof(float);
}

size_t Gpt::product_scratch_bytes(int B, int T) const {
  if (prec_ != Precision::bf16) return 0;
  const size_t S = tp_size(), C = cfg_.n_embd, Cs = C / S, N = (size_t)B * T, V = v1_ - v0_;
  const size_t grad = N * std::max(V, 4 * Cs), in = N * std::max(C, 4 * Cs), weight = V * C;
  // Native: packed bf16 copies in four slots: an output gradient (the logits' at most), an input, and the
  // backend's two (measured at V 8192, C 384, N 1024: N V, N C and V C). Emulated: those, and float32 copies of
  // both operands of the largest product (the logits' gradient and the embedding); an upper figure there.
  const size_t packed = 2 * (grad + 2 * in + weight);
  return bf16_native() ? packed : packed + 4 * (grad + weight);
}

}  // namespace mt::model
