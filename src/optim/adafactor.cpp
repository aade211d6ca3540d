#include "optim/adafactor.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mt::optim {

namespace {

// Calls f(i, row, col) for each element i of a piece, (row, col) its place in the full tensor of `cols`
// columns: walked without a division per element for a tensor held whole, through Param::full_index for a
// tensor-parallel shard.
template <class F>
inline void for_each_rc(const Segment& s, int64_t cols, F&& f) {
  if (s.param_of && s.param_of->shard.axis >= 0) {
    for (size_t i = 0; i < s.count; i++) {
      const int64_t full = s.param_of->full_index(s.offset + i);
      f(i, full / cols, full % cols);
    }
    return;
  }
  int64_t r = (int64_t)s.offset / cols, c = (int64_t)s.offset % cols;
  for (size_t i = 0; i < s.count; i++) {
    f(i, r, c);
    if (++c == cols) c = 0, r++;
  }
}

inline float scaled(float g, float gs) { return __builtin_assoc_barrier(g * gs); }  // as a scaling pass rounds

// U of a matrix element: g / sqrt(R_row C_col / mean(R)) = g sqrt(mean(R) / R_row) / sqrt(C_col), the two
// factors formed once per row and column (Matrix::rinv, cinv).
inline double u_matrix(float g, double rinv, double cinv) { return (double)g * rinv * cinv; }

// The new V of a vector element (float32 state) and U from it.
inline float v_vector(float g, float v, double b2) { return (float)(b2 * v + (1.0 - b2) * ((double)g * g + kAdafactorEps1)); }
inline double u_vector(float g, float v2) { return (double)g / std::sqrt((double)v2); }

}  // namespace

Adafactor::Adafactor(size_t n, const nn::ParamRegistry& params, const AdafactorConfig& cfg)
    : cfg_(cfg), v_(state_.declare_flat("adafactor.v", n)) {
  for (const nn::Param& p : params.params()) {
    MT_CHECK_INPUT(p.full_shape.size() <= 2, "--optimizer adafactor factors tensors of 1 or 2 dimensions; ", p.name,
                   " has ", p.full_shape.size());
    Matrix m;
    if (p.full_shape.size() == 2) {
      m.rows = p.full_shape[0];
      m.cols = p.full_shape[1];
      m.row = state_.declare("adafactor.row/" + p.name, {m.rows});
      m.col = state_.declare("adafactor.col/" + p.name, {m.cols});
    }
    mat_.push_back(std::move(m));
  }
  sum_u2_.assign(mat_.size(), 0.0);
}

double Adafactor::beta2_at(int64_t step) { return 1.0 - std::pow((double)step + 1.0, -0.8); }

size_t Adafactor::stat_count(int round, const nn::Param& p) const {
  if (round == 1) return 1;  // sum U^2
  return p.full_shape.size() == 2 ? (size_t)(p.full_shape[0] + p.full_shape[1]) : 0;  // g^2 by row, by column
}

PieceSums Adafactor::piece_sums(int round, int64_t step) {
  MT_ASSERT(round == 0 || (round == 1 && rounds_ == 1 && step == step_), "Adafactor round ", round, " of step ", step,
            " after ", rounds_, " rounds of step ", step_);
  step_ = step;
  const float gs = grad_scale_;
  if (round == 0)
    return [this, gs](const Segment& s, const float*, const float* g, double* out) {
      const Matrix& m = mat_[s.tensor];
      double* rows = out;
      double* cols = out + m.rows;
      for_each_rc(s, m.cols, [&](size_t i, int64_t r, int64_t c) {
        const float gi = scaled(g[i], gs);
        const double q = (double)gi * gi;
        rows[r] += q;
        cols[c] += q;
      });
    };
  const float* v = state_.data(v_);
  const double b2 = beta2_at(step);
  return [this, gs, v, b2](const Segment& s, const float*, const float* g, double* out) {
    const Matrix& m = mat_[s.tensor];
    double uu = 0;
    if (m.rows > 0) {
      for_each_rc(s, m.cols, [&](size_t i, int64_t r, int64_t c) {
        const double u = u_matrix(scaled(g[i], gs), m.rinv[r], m.cinv[c]);
        uu += u * u;
      });
    } else {
      const float* vs = v + s.state;
      for (size_t i = 0; i < s.count; i++) {
        const float gi = scaled(g[i], gs);
        const double u = u_vector(gi, v_vector(gi, vs[i], b2));
        uu += u * u;
      }
    }
    out[0] += uu;
  };
}

void Adafactor::set_tensor_sums(int round, TensorSums sums) {
  MT_ASSERT(sums.first.size() == mat_.size() + 1, "Adafactor: sums for ", sums.first.size() - 1, " tensors, ",
            mat_.size(), " registered");
  rounds_ = round + 1;
  if (round == 0) {
    const double b2 = beta2_at(step_);
    for (size_t t = 0; t < mat_.size(); t++) {
      Matrix& m = mat_[t];
      if (m.rows == 0) continue;
      const double* sq = sums.of((int)t);
      const float* r0 = state_.data(m.row);
      const float* c0 = state_.data(m.col);
      m.r.resize(m.rows);
      m.c.resize(m.cols);
      double total = 0;
      for (int64_t i = 0; i < m.rows; i++) {
        m.r[i] = (float)(b2 * r0[i] + (1.0 - b2) * (sq[i] / (double)m.cols + kAdafactorEps1));
        total += m.r[i];
      }
      for (int64_t j = 0; j < m.cols; j++)
        m.c[j] = (float)(b2 * c0[j] + (1.0 - b2) * (sq[m.rows + j] / (double)m.rows + kAdafactorEps1));
      m.mean_r = total / (double)m.rows;
      m.rinv.resize(m.rows);
      m.cinv.resize(m.cols);
      for (int64_t i = 0; i < m.rows; i++) m.rinv[i] = std::sqrt(m.mean_r / (double)m.r[i]);
      for (int64_t j = 0; j < m.cols; j++) m.cinv[j] = 1.0 / std::sqrt((double)m.c[j]);
    }
    return;
  }
  for (size_t t = 0; t < mat_.size(); t++) {
    MT_ASSERT(sums.count((int)t) == 1, "Adafactor: round 1 wants one sum per tensor");
    sum_u2_[t] = sums.of((int)t)[0];  // RMS(U) = sqrt(sum / whole tensor's element count), in step()
  }
}

void Adafactor::step(float* params, const float* grads, const std::vector<Segment>& segments, float lr, int64_t step) {
  MT_ASSERT(rounds_ == 2 && step_ == step, "Adafactor stepped without its two statistics rounds for step ", step);
  rounds_ = 0;
  const float gs = grad_scale_;
  grad_scale_ = 1.0f;
  const double b2 = beta2_at(step);
  for (Matrix& m : mat_)
    if (m.rows > 0) {
      std::copy(m.r.begin(), m.r.end(), state_.data(m.row));
      std::copy(m.c.begin(), m.c.end(), state_.data(m.col));
    }
  float* v = state_.data(v_);
  for (const Segment& s : segments) {
    MT_ASSERT(s.tensor >= 0 && (size_t)s.tensor < mat_.size() && s.param_of, "Adafactor stepped a piece of tensor ",
              s.tensor, " it does not know");
    const Matrix& m = mat_[s.tensor];
    int64_t numel = 1;
    for (int64_t d : s.param_of->full_shape) numel *= d;
    const double clip = std::max(1.0, std::sqrt(sum_u2_[s.tensor] / (double)numel));  // max(1, RMS(U))
    const float wd = s.decay ? cfg_.weight_decay : 0.0f;
    float* p = params + s.param;
    const float* g = grads + s.grad;
    if (m.rows > 0) {
      for_each_rc(s, m.cols, [&](size_t i, int64_t r, int64_t c) {
        const float u = (float)(u_matrix(scaled(g[i], gs), m.rinv[r], m.cinv[c]) / clip);
        p[i] -= lr * (u + wd * p[i]);
      });
    } else {
      float* vs = v + s.state;
      for (size_t i = 0; i < s.count; i++) {
        const float gi = scaled(g[i], gs);
        vs[i] = v_vector(gi, vs[i], b2);
        const float u = (float)(u_vector(gi, vs[i]) / clip);
        p[i] -= lr * (u + wd * p[i]);
      }
    }
  }
}

}  // namespace mt::optim
