// GPT-2: token + position embedding, L pre-LayerNorm transformer blocks (causal self-attention, GELU MLP),
// final LayerNorm, logits tied to the token embedding. Parameter names and layouts are Hugging Face's
// (Conv1D: y = x W + b), so checkpoints interchange with the published GPT-2 files.
//
// Legend: B sequences, T tokens each, N = B*T rows, C = n_embd, H = n_head, L = n_layer, V = vocab_size.
// Activations live in an ActivationStore under (micro-batch, name); the model object holds only shapes and
// a reference to the parameter registry.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/activation_store.h"
#include "nn/expert_parallel.h"
#include "nn/moe.h"
#include "nn/param_hooks.h"
#include "nn/params.h"
#include "nn/tensor_parallel.h"
#include "nn/tensor_parallel_layers.h"
#include "tensor/blas.h"

namespace mt::model {

struct GptConfig {
  int n_layer = 0, n_head = 0, n_embd = 0, vocab_size = 0, n_positions = 0;
  // Mixture of experts (nn/moe.h): the MLP of blocks moe_every-1, 2 moe_every-1, ... is `experts` expert
  // MLPs of width expert_hidden (0: 4C) behind a top-`moe_top_k` router. moe_every 0: a dense model.
  int moe_every = 0, experts = 0, moe_top_k = 1, expert_hidden = 0;

  // Throws InputError naming the bad field (n_embd not divisible by n_head, non-positive sizes, ...).
  void validate() const;
  bool is_moe(int layer) const { return moe_every > 0 && (layer + 1) % moe_every == 0; }
  int moe_hidden() const { return expert_hidden > 0 ? expert_hidden : 4 * n_embd; }
  int64_t num_params() const;
  // Parameters a token passes through (the router and moe_top_k experts of each MoE block).
  int64_t active_params() const;
  // Training FLOPs per token: 6 x active params (forward + backward of every weight a token uses) plus
  // attention's 12 x L x T x C (scores and weighted sum, forward and backward, dense T x T as in PaLM's).
  double flops_per_token(int T) const;
  std::map<std::string, std::string> to_metadata() const;
  bool operator==(const GptConfig&) const = default;
};

// How MoE blocks route while training (not part of the model's shape; nn/moe_router.h for the semantics).
struct MoeOptions {
  double capacity_factor = 1.25;  // F; 0 = dropless
  int group_windows = 1;          // G: tokens are routed in groups of G consecutive windows of the global batch
  nn::SecondPolicy second = nn::SecondPolicy::all;
  float aux_alpha = 0.01f, z_beta = 0.0f;
  uint64_t seed = 0;                    // the run's seed (random second-choice draws)
  nn::ExpertParallelOps* ep = nullptr;  // the expert-parallel group (null: every expert here)
  // Register only this rank's E / ep experts, flagged nn::Param::expert (their gradients and optimizer state
  // live on their replicas only); false: every rank registers every expert. Needs ep of size > 1.
  bool local_experts = false;
};

// A pipeline stage of the model: blocks [begin, end) (end -1: n_layer), stage `index` of `count`; the first
// stage holds the embeddings, the last the final LayerNorm and logits (a stage may hold no blocks). The last
// stage of a split model holds its own copy of the tied wte (its gradient is summed with the first stage's
// by the trainer), or, when the registry it is given holds the first stage's wte already (both ends on one
// rank: a V-shaped placement), uses that one.
struct StageRange {
  int begin = 0, end = -1;
  int index = 0, count = 1;
};

class Gpt {
 public:
  // Registers every parameter in `params` (call params.finalize() afterwards). With a tensor-parallel group
  // of size S (tp may be null: S = 1) each rank registers its shard, Megatron-style:
  //   c_attn (q|k|v by heads) and c_fc column-parallel: W[:, cols of my heads / my 4C/S], bias likewise;
  //   attn.c_proj and mlp.c_proj row-parallel: W[my rows, :], bias replicated (added after the sum);
  //   wte vocabulary-parallel: rows shard_of(V, S, r) (uneven when S does not divide V: nothing padded);
  //   wpe and LayerNorms replicated.
  // Per block half, forward: column-parallel linear, local math, row-parallel linear (all-reduce of the [N, C]
  // partial sums); backward: the mirror image, all-reduce of the column-parallel input gradient (the nn parts
  // of nn/tensor_parallel_layers.h hold the collectives).
  // MoE blocks: the router and the experts are replicated over the tensor-parallel group (every tp rank
  // routes all N rows of the micro-batch, gathered under sequence parallelism); their computation is split
  // over the expert-parallel group in moe.ep (each rank runs E / ep experts on the tokens sent to it). With
  // moe.local_experts a rank registers only those experts; else it keeps all experts' parameters (sharded by
  // ZeRO like any other) and the others' gradients stay exact zeros.
  Gpt(const GptConfig& cfg, nn::ParamRegistry& params, nn::TensorParallelOps* tp = nullptr, StageRange stage = {},
      const MoeOptions& moe = {});

  bool first_stage() const { return stage_.index == 0; }
  bool last_stage() const { return stage_.index == stage_.count - 1; }

  const GptConfig& config() const { return cfg_; }

  // GPT-2 initialization: weights normal(0, 0.02), residual projections (attn.c_proj, mlp.c_proj) scaled by
  // 1/sqrt(2L), biases 0, LayerNorm weights 1. Counter-based: independent of layout.
  void init_gpt2(uint64_t seed);
  // The same for one parameter, whose data pointer holds (its shard of) the full tensor.
  void init_param(nn::Param& p, uint64_t seed) const;

  // Parameter groups (nn/param_hooks.h): 0 = embeddings (wte, wpe), 1 + l = block l, n_layer + 1 = ln_f.

  // Forward over inputs[B,T] (token ids < V, T <= n_positions; checked by the caller at the data boundary).
  // With targets: returns the summed cross-entropy over the N targets and leaves dlogits = dloss * dscale
  // in the store for backward (dscale = 1 / tokens in the global batch makes the gradient that of the
  // global mean). Without targets: stops after the final LayerNorm (for logits_last) and returns 0.
  // A stage that is not the first takes its input activation [B*T, C] in stage_input instead of token ids
  // (inputs may then be null); a stage that is not the last returns 0 and leaves stage_output(), or, given
  // output_into (room for stage_output's rows_here(B*T) x C floats; only a stage that is not the last and holds
  // blocks: output_into_applies()), writes its last block's output there instead of into the store (the pipeline
  // executor's message buffer: no copy at the send; nothing of this stage's backward reads it).
  double forward(nn::ActivationStore& store, int mb, const int32_t* inputs, const int32_t* targets, int B, int T,
                 float dscale, nn::ParamHooks* hooks = nullptr, const float* stage_input = nullptr,
                 float* output_into = nullptr);
  bool output_into_applies() const { return !last_stage() && end_ > begin_; }
  // Accumulates parameter gradients for micro-batch mb (forward must have run with targets). A stage that
  // is not the last takes the gradient of its output in dout; one that is not the first leaves the
  // gradient of its input in stage_input_grad() (valid until the next backward).
  void backward(nn::ActivationStore& store, int mb, int B, int T, nn::ParamHooks* hooks = nullptr,
                const float* dout = nullptr);
  // The backward split in two (a pipeline's zero-bubble schedules): backward_input computes what backward
  // computes except the parameter gradients (the input's gradient in stage_input_grad(), as backward leaves
  // it) and keeps, under mb, the output gradients those need (and, with recomputation, the recomputed
  // intermediates); backward_weight then accumulates the parameter gradients of mb from them and calls the
  // groups' after_backward hooks (backward_input opens each group with before_backward and closes it with
  // after_forward: its parameters were used, its gradients are not final).
  // Together they give every parameter gradient the bits backward gives, when the weight halves of a step run
  // in the order of the micro-batches. Release mb only after backward_weight. An MoE block's experts and router
  // take their gradients in backward_input (not split), and so does the last stage's own copy of the tied wte
  // (tie_grad_in_input_).
  void backward_input(nn::ActivationStore& store, int mb, int B, int T, nn::ParamHooks* hooks = nullptr,
                      const float* dout = nullptr);
  void backward_weight(nn::ActivationStore& store, int mb, int B, int T, nn::ParamHooks* hooks = nullptr);
  const float* stage_output(nn::ActivationStore& store, int mb, int B, int T);
  const float* stage_input_grad(nn::ActivationStore& store, int B, int T);
  // After forward without targets: out[B,V] = logits of the last position of each sequence.
  void logits_last(nn::ActivationStore& store, int mb, int B, int T, float* out);

  // MoE routing position of the next forward: the optimizer step (random second-choice draws) and the
  // global index of the micro-batch's first window in the global batch (groups, draws). Kept per
  // micro-batch for recomputation.
  void set_moe_position(int64_t step, int64_t first_window) { moe_pos_ = {step, first_window}; }
  // The MoE blocks of this stage (null for dense blocks), by layer.
  const std::vector<std::unique_ptr<nn::MoeMlp>>& moe_layers() const { return moe_; }

  // Activation recomputation: forward keeps only each block's input per micro-batch; backward recomputes
  // the block's intermediates (into one scratch set) just before its gradients. Same results bit for bit.
  void set_recompute(bool on) { recompute_ = on; }

  // Sequence parallelism (Megatron-LM's, with tensor parallelism): the residual stream, LayerNorms and
  // embedding sums hold only this rank's N / S consecutive token rows; the LayerNorm output is all-gathered
  // before each column-parallel product and each row-parallel product is reduce-scattered (instead of one
  // all-reduce: the same bytes, and S times less activation memory in those regions). LayerNorm and position
  // gradients are computed from this rank's rows and summed over the group per micro-batch. A pipeline stage
  // then passes N / S rows. N (micro-batch x T) must be divisible by S. Same results to float32 rounding.
  void set_sequence_parallel(bool on) {
    sp_ = on && tp_size() > 1;
    rows_ = nn::TpRows(tp_, sp_);
  }
  bool sequence_parallel() const { return sp_; }

  // The precision of every matrix product (tensor/blas.h): linear layers, attention, the tied logits, the MoE
  // router and experts, forward and backward. bf16 (--precision bf16): inputs rounded to bfloat16, float32
  // accumulation; LayerNorm, GELU, softmax, the loss, residuals and all gradients stay float32.
  void set_precision(Precision p);
  Precision precision() const { return prec_; }
  // Rows of the residual stream this rank holds for a micro-batch of N token rows.
  int rows_here(int N) const;

  // Bytes of activations backward needs for a micro-batch of B x T (what forward keeps in the store).
  size_t activation_bytes(int B, int T) const;
  // The backward's scratch (kScratchMb, shared by micro-batches) above activation_bytes: the residual stream's
  // running gradient and the per-layer gradient temporaries (backward()'s dres, dln, datty, dqkv, dfch; under
  // sequence parallelism the gathered rows; under --recompute the recomputed block's output).
  size_t backward_scratch_bytes(int B, int T) const;
  // Under --precision bf16, the calling thread's copies of the products' operands (tensor/bf16.h
  // packed_bf16_scratch, tensor/gemm_bf16.cpp's emulated float32 copies), grown to the largest and kept; 0 in fp32.
  size_t product_scratch_bytes(int B, int T) const;

 private:
  struct LayerParams {
    nn::Param *ln1_w, *ln1_b, *qkv_w, *qkv_b, *attproj_w, *attproj_b, *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w,
        *fcproj_b;
  };
  void backward_pass(nn::ActivationStore& store, int mb, int B, int T, nn::ParamHooks* hooks, const float* dout,
                     bool input_only);
  static constexpr int kScratchMb = -1;  // store slot shared by all micro-batches (one backward at a time)
  int tp_size() const { return tp_ ? tp_->size() : 1; }
  // One transformer block from input x to output res3, intermediates under (smb, "h{slot}.*").
  void block_forward(nn::ActivationStore& store, int smb, int slot, int l, const float* x, float* res3, int B, int T,
                     int mb);
  void moe_forward(nn::ActivationStore& store, int smb, int l, const float* ln2, const float* res2, float* res3,
                   int B, int T, int mb);
  // ln2: this rank's rows in float32, or (--precision bf16) ln2_16 in bf16, gathered under SP into gathered16.
  void moe_backward(nn::ActivationStore& store, int smb, int l, const float* ln2, const uint16_t* ln2_16,
                    uint16_t* gathered16, const float* dres_all, float* dln, int B, int T, int mb);
  // A scratch buffer of the store under sequence parallelism (shared by all micro-batches), else null.
  float* sp_scratch(nn::ActivationStore& store, const char* name, size_t count);
  // --precision bf16: the float32 scratch an input kept in bf16 is written to before it is rounded into the store
  // (N x max(C, local 3C): the widest such input, a block's qkv; shared by every block and the final LayerNorm).
  float* bf16_src(nn::ActivationStore& store, int N);
  // All N rows of a row-split tensor (nn::TpRows::gather with its scratch from the store): the MoE input.
  const float* gather_rows(nn::ActivationStore& store, const float* local, int N, int C);
  GptConfig cfg_;
  nn::ParamRegistry& params_;
  nn::TensorParallelOps* tp_ = nullptr;
  bool recompute_ = false;
  bool sp_ = false;
  Precision prec_ = Precision::fp32;
  nn::TpRows rows_{nullptr, false};  // the tensor-parallel layers' collectives (nn/tensor_parallel_layers.h)
  int begin_ = 0, end_ = 0;  // this stage's blocks
  StageRange stage_;
  int64_t v0_ = 0, v1_ = 0;  // this rank's vocabulary rows of wte
  nn::Param *wte_, *wpe_, *lnf_w_, *lnf_b_;
  // The last stage holds its own copy of the tied wte (pp > 1, not a V placement): a split backward takes that
  // copy's gradient (the logits' part) in its input half, so the tie sum can start once the last stage's last
  // input half is over, not after its deferred weight halves. The copy's contributions still arrive one per
  // micro-batch in ascending order, so the sum is the same bits as the whole backward's.
  bool tie_grad_in_input_ = false;
  std::vector<LayerParams> layers_;
  MoeOptions moe_opt_;
  std::vector<std::unique_ptr<nn::MoeMlp>> moe_;
  std::pair<int64_t, int64_t> moe_pos_{0, 0};
};

}  // namespace mt::model
