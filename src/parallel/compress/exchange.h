// Compressed gradient exchange over the data-parallel group (ZeRO 0), replacing the exact all-reduce. Under
// tensor or pipeline parallelism it runs over the dp group of each (tp, pp) coordinate, on the rank's part.
//
// Every rank holds its share of the global-batch gradient (the shares sum to the exact gradient). exchange()
// turns the registry's gradient buffer, in place, into the sum over ranks of what each rank's compressed share
// decodes to, bit-identical on every rank (each rank decodes every payload itself, in rank order), so the
// replicas never drift apart.
//
//   per-tensor codecs (codec.h: topk, randk, qsgd, nuqsgd, sign): every rank encodes each tensor (plus its
//     error-feedback residual for the biased codecs, keeping x - decode(x) as the next residual), one all_gather
//     of the concatenated byte payloads (u8) moves them, every rank decodes and sums.
//   powersgd:R (Vogels et al. 2019): per matrix M [rows, cols] (plus residual), P = M Q with Q [cols, R] warm-
//     started from the previous step (seeded normal at first, the same on every rank); all_reduce P;
//     orthonormalize P's columns (Gram-Schmidt); Q' = M^T P; residual = M - P Q'^T (the local reconstruction);
//     all_reduce Q'; the gradient is P Q'^T summed, i.e. the sum over ranks of P P^T M_r. Vectors and matrices
//     too small to gain (R (rows + cols) >= rows cols) join one exact all_reduce with P. Only P, Q and those
//     cross the wire.
//   adaptive (Accordion, Agarwal et al. 2021): every K steps each layer (parameter group) compares the norm of
//     its gradient accumulated over the last K steps with the K before; a relative change >= eta marks a
//     critical regime, which gets the light setting (CompressSpec::light) for the next K steps, else the chosen
//     (heavy) one. The first 2K steps are treated as critical (no earlier interval to compare with). The
//     decision uses the exchanged gradient, the same on every rank.
//   dgc (Deep Gradient Compression, dgc.h; topk only): each rank clips its share, accumulates it as momentum-
//     corrected velocity, sends the top-k of the accumulated velocity at the step's warm-up density and clears
//     both velocities where it sent; the payloads move and decode as for topk.
//
// Residuals and PowerSGD's Q are this rank's state; a resumed run starts them afresh (zero, seeded).
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "nn/params.h"
#include "parallel/compress/dgc.h"
#include "parallel/compress/spec.h"

namespace mt::compress {

struct AdaptiveOptions {
  bool enabled = false;
  int every = 10;     // K
  double eta = 0.5;   // relative change of the gradient norm that marks a critical regime
};

class GradientExchange {
 public:
  // params: finalized, with this rank's whole gradient of its part of the replica (no ZeRO shard; a tp shard
  // of a tensor is a tensor of its own here); dp: the data-parallel group (may be null: one rank). split: the
  // ranks holding the other parts of the same layers (tp; may be null), over which adaptive sums each
  // layer's norm (copies of a tensor counted once) so that all of them take the same setting, and the copies
  // every tp rank holds of a tensor (LayerNorms, biases) stay equal; DGC sums its clipping norm over it the
  // same way. dgc: Deep Gradient Compression (spec must be topk, adaptive off).
  GradientExchange(nn::ParamRegistry& params, comm::Communicator* dp, const CompressSpec& spec,
                   const AdaptiveOptions& adaptive, uint64_t seed, comm::Communicator* split = nullptr,
                   const DgcOptions& dgc = {});

  // In place on params.grad(), for optimizer step `step` (steps must come in order).
  void exchange(int64_t step);

  // The setting each layer (parameter group) used in the last exchange: 1 light, 0 heavy; and the share of
  // layers on the light setting.
  const std::vector<int>& light_layers() const { return light_; }
  double light_fraction() const;
  // DGC: the fraction of entries kept in the last exchange and the clipping factor this rank applied.
  double density() const { return step_spec_.ratio; }
  float clip_factor() const { return clip_; }
  const DgcMomentum& momentum() const { return momentum_; }
  // The buffers this rank carries between steps, for checkpoints: per tensor the error-feedback residual,
  // PowerSGD's Q and DGC's velocity (each possibly empty), in that order. Accordion's interval state is not
  // among them.
  std::vector<std::vector<float>*> state_buffers();

 private:
  const CompressSpec& spec_of(const nn::Param& p) const;
  void update_levels(int64_t step);
  void exchange_codec(int64_t step);
  void exchange_powersgd();
  float dgc_clip() const;

  nn::ParamRegistry& params_;
  comm::Communicator* dp_;
  comm::Communicator* split_;
  CompressSpec heavy_, light_spec_;
  AdaptiveOptions adaptive_;
  uint64_t seed_;
  DgcOptions dgc_;
  DgcMomentum momentum_;     // DGC: per tensor velocity u
  CompressSpec step_spec_;   // DGC: heavy_ at this step's warm-up density
  float clip_ = 1.0f;
  int n_ = 1, r_ = 0;
  std::vector<std::vector<float>> residual_;  // per tensor (error feedback)
  std::vector<std::vector<float>> q_;         // per tensor: PowerSGD's Q [cols, max rank] (matrices only)
  std::vector<int> light_;                    // per group
  std::vector<double> prev_norm_;             // per group: accumulated-gradient norm of the previous interval
  std::vector<float> acc_;                    // adaptive: gradient accumulated over the current interval
  std::vector<uint8_t> out_, all_;
  std::vector<float> scratch_;
};

}  // namespace mt::compress
