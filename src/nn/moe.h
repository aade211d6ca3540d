// A mixture-of-experts MLP: a router (nn/moe_router.h) sends each token to K of E expert MLPs (each the
// dense MLP's form: c_fc, GELU, c_proj, with biases) and sums their outputs weighted by the gates. The
// experts may be spread over an expert-parallel group (nn/expert_parallel.h): rank r of P holds experts
// [r E/P, (r+1) E/P), and admitted tokens travel there and back by all-to-all(v); nothing else moves.
//
// Legend: N tokens of the micro-batch, C channels, E experts, K choices, Hx expert hidden width, P ranks of
// the expert-parallel group, A admitted (token, choice) pairs of this rank's tokens, Al pairs its experts got.
//
//   forward:  logits[N,E] = x Wr; route; pack x rows of admitted pairs by expert  [A, C]
//             -- dispatch (all-to-allv, P > 1) -->  per local expert: h = xin Wfc + bfc [Al,Hx], a = gelu(h),
//             o = a Wproj + bproj [Al, C]  -- combine (all-to-allv back) -->  y = residual + sum_k gate_k o_k
//   backward: dgate_k = <dy, o_k>, do_k = gate_k dy; the same two exchanges carry do out and dxin back;
//             dx = sum_k dxin_k + dlogits Wr^T (router: nn/moe_router.h route_backward).
// Cost per micro-batch: router 2NCE flops; experts 4 A C Hx flops (A ~ K N when little is dropped); two
// all-to-allv of A C floats each way per pass (only admitted rows; a rank's own experts' rows stay put).
//
// Parameters (Hugging Face-style names under the block's prefix, y = x W + b like the dense ones):
//   {prefix}router.weight [C, E] (no bias), {prefix}experts.{e}.c_fc.weight [C, Hx], .c_fc.bias [Hx],
//   .c_proj.weight [Hx, C], .c_proj.bias [C]. A rank registers only its own experts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/activation_store.h"
#include "nn/expert_parallel.h"
#include "nn/moe_router.h"
#include "nn/params.h"
#include "tensor/blas.h"
#include "trace/chrome_trace.h"

namespace mt::nn {

// What one MoE layer saw, summed over the micro-batches since the last reset (for metrics and the summary).
struct MoeStats {
  std::vector<int64_t> admitted;   // [E] tokens each expert computed (this rank's tokens)
  std::vector<int64_t> first;      // [E] first choices per expert, before capacity
  int64_t choices = 0, dropped = 0;
  double aux_sum = 0, z_sum = 0;   // sums over groups / tokens (nn/moe_router.h)
  int64_t groups = 0, tokens = 0;
  uint64_t exchange_bytes = 0;     // bytes this rank sent in dispatch and combine, both passes
  double exchange_s = 0;           // time spent in them
  void reset(int E);
};

class MoeMlp {
 public:
  // Registers the router and this rank's experts under `prefix` (e.g. "h.1.mlp.") in parameter group `group`,
  // the experts flagged Param::expert (their gradients reduce over the expert's replicas only); with
  // register_all, every expert, unflagged (the others stay unused here: their gradients are exact zeros, so a
  // data-parallel sum over ranks adds up each expert's gradient from the ranks that computed it).
  MoeMlp(const RouterConfig& rc, int layer, int C, int hidden, const std::string& prefix, ParamRegistry& params,
         int group, ExpertParallelOps* ep = nullptr, bool register_all = false);

  // out[N,C] = residual[N,C] + the experts' gated sum for x[N,C] (out may alias residual; residual null:
  // zero). Routing and the
  // experts' activations are kept in `store` under (mb, prefix...) for backward. N % group_tokens == 0.
  void forward(ActivationStore& store, int mb, const float* x, const float* residual, float* out, int N,
               const RouterDraws& draws);
  // dx[N,C] (overwritten) and the parameter gradients (accumulated) from dy[N,C] = dL/dout. aux_scale and
  // z_scale: alpha / groups and beta / tokens of the global batch (nn/moe_router.h).
  void backward(ActivationStore& store, int mb, const float* x, const float* dy, float* dx, int N, float aux_scale,
                float z_scale);
  // The same with x kept in bf16 (--precision bf16): backward reads x only through the router's product, which
  // rounds it anyway (the same bits, half the bytes kept).
  void backward(ActivationStore& store, int mb, const uint16_t* x16, const float* dy, float* dx, int N,
                float aux_scale, float z_scale);

  // What forward keeps for backward besides float buffers (in the store under (mb, prefix + "moe")).
  struct State {
    Routing routing;
    std::vector<int32_t> order;     // [A] t * K + k of each admitted pair, by expert, then group, then slot
    std::vector<int64_t> count;     // [E] admitted pairs per expert (this rank's tokens)
    std::vector<int64_t> incoming;  // [P * Le] rows from each source rank for each local expert
    // Rows local expert le computes: its rows from every source rank.
    int64_t rows_for(int le, int P) const {
      const int Le = (int)incoming.size() / P;
      int64_t n = 0;
      for (int r = 0; r < P; r++) n += incoming[(size_t)r * Le + le];
      return n;
    }
  };
  const Routing& routing(ActivationStore& store, int mb) const { return store.object<State>(mb, prefix_ + "moe").routing; }

  int experts() const { return rc_.experts; }
  int local_experts() const { return e1_ - e0_; }
  int first_local_expert() const { return e0_; }
  const RouterConfig& router_config() const { return rc_; }
  MoeStats& stats() { return stats_; }
  // Routing groups of n tokens from the next forward on (a run of whole windows; N % n == 0).
  void set_group_tokens(int n) { rc_.group_tokens = n; }
  // Whether forward adds to stats() (off while recomputing a forward that was already counted).
  void set_recording(bool on) { recording_ = on; }
  // Dispatch and combine go on the trace's comm track (null or disabled: nothing recorded).
  void set_trace(trace::ChromeTrace* t) { tracer_ = t; }
  // The router's and the experts' products (forward and backward) in this precision (layers.h).
  void set_precision(Precision p) { prec_ = p; }

  // Initialization as the dense MLP's (GPT-2): router and c_fc N(0, 0.02), c_proj N(0, 0.02 / sqrt(2 L)),
  // biases 0. Counter-based per tensor name: the same values whatever rank holds the expert.
  void init_param(Param& p, uint64_t seed, int n_layer) const;

 private:
  void backward_(ActivationStore& store, int mb, const float* x, const uint16_t* x16, const float* dy, float* dx, int N,
                 float aux_scale, float z_scale);
  struct Expert {
    Param *fc_w, *fc_b, *proj_w, *proj_b;
  };
  // Moves rows grouped by expert (counts[e] rows for expert e, e = 0..E-1, experts in order) to the ranks
  // that hold the experts (forward = true), or back. Returns the rows in the other arrangement: forward,
  // this rank's experts' rows by local expert then source rank; backward, by expert in the original order.
  void exchange(const float* in, float* out, bool to_experts, const int64_t* counts_here, const int64_t* counts_there);
  int ep_size() const { return ep_ ? ep_->size() : 1; }
  // Room for `floats` floats that a dispatch sends: the group's send buffer (ExpertParallelOps::send_buffer, valid
  // until the next exchange) when there is a group to send to, else `local`, resized.
  float* send_rows(std::vector<float>& local, size_t floats);

  RouterConfig rc_;
  int layer_, C_, H_;
  std::string prefix_;
  ExpertParallelOps* ep_;
  int e0_ = 0, e1_ = 0;
  Param* router_;
  std::vector<Expert> local_;
  MoeStats stats_;
  bool recording_ = true;
  trace::ChromeTrace* tracer_ = nullptr;
  Precision prec_ = Precision::fp32;
};

}  // namespace mt::nn
