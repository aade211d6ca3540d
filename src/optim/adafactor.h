// Adafactor (Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost", 2018), without
// momentum and without relative step sizes, over the store's pieces. Per tensor, t = step + 1:
//   beta2_t = 1 - t^-0.8
//   matrix [rows, cols]:  R = beta2_t R + (1 - beta2_t) rowmean(g^2 + eps1)      (factored "adafactor.row/NAME")
//                         C = beta2_t C + (1 - beta2_t) colmean(g^2 + eps1)      (factored "adafactor.col/NAME")
//                         V = outer(R, C) / mean(R)
//   vector:               V = beta2_t V + (1 - beta2_t)(g^2 + eps1)               (flat "adafactor.v")
//   U = g / sqrt(V);  U /= max(1, RMS(U));  w -= lr (U + wd w)     (wd only on tensors of >= 2 dims)
// with eps1 = 1e-16 (not the paper's 1e-30: float32 round-off in gradient entries that should cancel to zero
// would then become full-size steps, and no two summation orders could agree).
//
// Whole-tensor statistics under any layout, in two statistics rounds (optimizer.h): round 0 sums g^2 per row
// and per column of each matrix (rows + cols sums, in full-tensor coordinates, so tp shards and ZeRO pieces
// add up), from which every rank holding any part of the tensor forms the same new R and C; round 1 sums U^2
// per tensor for RMS(U). step() stores R and C (for every matrix of the registry, also those of which this
// rank owns no piece under ZeRO) and updates the pieces. R, C and V are float32 state; a matrix element's
// 1 / sqrt(V) is formed in double as sqrt(mean(R) / R_row) / sqrt(C_col), one factor per row and column (V
// itself can reach 1e-32 and below, under float32's normal range).
// Memory: R and C cost rows + cols floats per matrix; the flat V spans every element (matrices' entries
// unused) so that ZeRO shards and checkpoints it like any flat state: 1 float per parameter, AdamW's 2.
#pragma once

#include <cstdint>
#include <vector>

#include "nn/params.h"
#include "optim/optimizer.h"

namespace mt::optim {

struct AdafactorConfig {
  float weight_decay = 0.0f;
};

inline constexpr double kAdafactorEps1 = 1e-16;

class Adafactor : public Optimizer {
 public:
  // n: this rank's flat state size; params: the registry whose tensors the pieces' indices name (throws
  // InputError for a tensor of more than 2 dimensions).
  Adafactor(size_t n, const nn::ParamRegistry& params, const AdafactorConfig& cfg);
  void step(float* params, const float* grads, const std::vector<Segment>& segments, float lr, int64_t step) override;

  int stat_rounds() const override { return 2; }
  size_t stat_count(int round, const nn::Param& p) const override;
  PieceSums piece_sums(int round, int64_t step) override;
  void set_tensor_sums(int round, TensorSums sums) override;

  // 1 - t^-0.8, t = step + 1 (0 at the first step: the first moments are that step's alone).
  static double beta2_at(int64_t step);

 private:
  struct Matrix {
    int64_t rows = 0, cols = 0;  // 0: a vector
    size_t row = 0, col = 0;     // factored state buffers
    std::vector<float> r, c;     // this step's new R and C (round 0), stored by step()
    double mean_r = 0;           // mean of the new R
    std::vector<double> rinv, cinv;  // sqrt(mean(R) / R_i), 1 / sqrt(C_j) of the new R and C
  };
  AdafactorConfig cfg_;
  size_t v_;
  std::vector<Matrix> mat_;    // by registry index
  std::vector<double> sum_u2_;  // by registry index: this step's sum of U^2 over the whole tensor (round 1)
  int64_t step_ = -1;          // the step the rounds were run for
  int rounds_ = 0;             // rounds run for it
};

}  // namespace mt::optim
