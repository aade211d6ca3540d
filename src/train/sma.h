// Crossbow's synchronous model averaging (SMA; Koliousis et al., VLDB 2019), the rule alone, over flat
// buffers of n floats. k learners (L per rank x dp ranks), each with its own weights w_j, and one central
// average model z (every rank holds the same copy). One step, for every learner j at once:
//
//   c_j  = alpha (w_j - z)                          the correction, from the weights before the step
//   w_j <- opt_j(w_j, g_j(w_j)) - c_j               opt_j: the run's optimizer with learner j's own state
//                                                   (plain SGD: w_j - lr g_j, the paper's form)
//   z   <- z + sum_j c_j + mu (z - z_prev)          z_prev: z before the previous step (z_prev = z at start)
//
// Float32 throughout; sum_j c_j is a float32 sum (in learner order on a rank, then an all-reduce over dp).
#pragma once

#include <cstddef>

namespace mt::train {

// After learner j's optimizer step: w_new (the optimizer's result) becomes w_new - c with c = alpha (w - z),
// w the learner's weights before the step; c is added to csum. All four: n floats.
void sma_correct(float* w_new, const float* w, const float* z, float alpha, float* csum, size_t n);
// z <- z + csum + mu (z - z_prev), then z_prev <- the old z.
void sma_center(float* z, float* z_prev, const float* csum, float mu, size_t n);

}  // namespace mt::train
