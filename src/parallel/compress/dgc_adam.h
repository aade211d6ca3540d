// DGC with AdamW, the exchange's half (the optimizer's half and the warm-up: optim/dgc_adam.h; the rule in
// full: docs/parallelism.md "DGC with AdamW"). From the freeze step K on, over the N data-parallel ranks, per
// rank r and element, with D = sqrt(v / (1-b2^K)) + eps the frozen AdamW preconditioner (the same on every
// rank), g_r the rank's share of the step's gradient (shares sum to the step's gradient) times its clipping
// factor, t = step + 1:
//
//   at step K          u_r = m / N (m: AdamW's first moment after step K-1, the same on every rank), a_r = 0
//   momentum           u_r = b1 u_r + (1-b1) g_r
//   accumulation       a_r = a_r + (u_r / (1-b1^t)) / D     (the preconditioned update, momentum-corrected)
//   top-k of a_r       per tensor the k = max(1, ceil(d n)) entries of largest |a_r| (codec.h's topk, ties to
//                      the lower index), d = R (--compress topk:R) or, with --dgc-warmup-steps W, DGC's sparsity
//                      warm-up counted from K: d = dgc_density(R, W, step - K) (dgc.h: 25%, 6.25%, 1.5625%,
//                      0.390625% in four equal stages of W steps, never below R)
//   where sent         a_r = 0, and with masking u_r = 0 (DGC's momentum factor masking)
//   dense vectors      with --dgc-dense-vectors, tensors of fewer than 2 dims (biases, LayerNorm) are sent whole
//                      every step (d = 1) and never masked: for them U = sum_r u_r / (1-b1^t) / D, Adam with the
//                      variance frozen (their payload is still topk's, 8 bytes per entry)
//   global top-k       with --dgc-global-topk, the tensors not sent whole are one group: their a_r laid end to end
//                      in tensor order, and one top-k over the group (k = max(1, ceil(d n_group)), ties to the
//                      lower position) replaces the per-tensor top-k: one threshold on the whole model's
//                      preconditioned accumulated update, so a tensor gets the share of the budget its entries win
//   result             U = the sum over ranks of the sent entries, decoded in rank order (bit-identical on
//                      every rank); the optimizer then applies p -= lr (U + wd p)
//
// Without masking and with R = 1 the sum over ranks of u_r is AdamW's momentum of the summed (clipped) shares
// and U = m / (1-b1^t) / D: Adam with the variance frozen. The payloads are codec.h's topk (8 bytes per kept
// entry) in one u8 all_gather: (N - 1) x 8 sum_t k_t bytes per rank and step.
// State (per tensor u_r, then per tensor a_r) is this rank's, in checkpoints (train/exchange_state.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "nn/params.h"
#include "parallel/compress/spec.h"

namespace mt::compress {

struct DgcAdamStepInputs {
  const float* precond = nullptr;  // D, flat (params.size())
  const float* m0 = nullptr;       // the first compressed step only: AdamW's m after step K-1 (flat); else null
  float beta1 = 0.9f;
  float bc1 = 1.0f;                // 1 - b1^t
  float g_scale = 1.0f;            // the rank's clipping factor
  double density = 0;              // the fraction kept this step (the sparsity warm-up); 0: the spec's R
};

class DgcAdamExchange {
 public:
  // params: finalized, ZeRO 0 (whole tensors); dp: the data-parallel group (null: one rank); spec: topk.
  DgcAdamExchange(nn::ParamRegistry& params, comm::Communicator* dp, const CompressSpec& spec, bool masking,
                  bool dense_vectors = false, bool global_topk = false);
  // g: this rank's gradient share (flat, params.size()); replaced by U.
  void exchange(float* g, const DgcAdamStepInputs& in);
  // The fraction kept in the last exchange.
  double density() const { return density_; }
  const std::vector<float>& momentum(size_t t) const { return u_[t]; }
  const std::vector<float>& accumulated(size_t t) const { return a_[t]; }
  // For checkpoints: per tensor u, then per tensor a.
  std::vector<std::vector<float>*> state_buffers();

 private:
  nn::ParamRegistry& params_;
  comm::Communicator* dp_;
  CompressSpec spec_;
  bool masking_;
  std::vector<char> dense_;                // per tensor: sent whole (--dgc-dense-vectors, < 2 dims)
  bool global_ = false;                    // --dgc-global-topk: one top-k over the tensors not sent whole
  std::vector<size_t> goff_;               // global: per tensor its offset in the group (dense: unused)
  std::vector<size_t> gtensor_;            // global: the group's tensors in order
  size_t gn_ = 0;                          // global: the group's size
  std::vector<float> gflat_;               // global: the group's a_r end to end, then the decoded sum
  CompressSpec all_spec_;                  // topk:1
  int n_ = 1, r_ = 0;
  std::vector<std::vector<float>> u_, a_;  // per tensor
  std::vector<size_t> off_;                // per tensor: its payload's offset (global: 0 bytes for the group's
                                           // tensors); off_[T] the per-tensor total, the group's payload after it
  size_t gbytes_ = 0;                      // global: the group's payload bytes
  double density_ = -1;                    // the kept fraction off_ was laid out for
  std::vector<uint8_t> out_, all_;
};

}  // namespace mt::compress
