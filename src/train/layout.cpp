#include "train/layout.h"

#include <algorithm>

#include "core/error.h"
#include "train/train_config.h"

namespace mt::train {

BatchShare BatchShare::even(int first, int count, int u) {
  BatchShare s;
  s.first = first;
  for (int w = 0; w < count; w += u) s.sizes.push_back(std::min(u, count - w));
  return s;
}

int BatchShare::count() const {
  int n = 0;
  for (int x : sizes) n += x;
  return n;
}

int BatchShare::micro_first(int i) const {
  int w = first;
  for (int k = 0; k < i; k++) w += sizes[(size_t)k];
  return w;
}

int BatchShare::micro_size() const {
  int u = 1;
  for (int x : sizes) u = std::max(u, x);
  return u;
}

BatchLayout::BatchLayout(const TrainConfig& cfg, int dp_ranks) : B_(cfg.batch_size), N_(dp_ranks) {
  const int mbs = cfg.micro_batch_size;
  MT_CHECK_INPUT(B_ > 0, "--batch-size must be positive, got ", B_);
  MT_CHECK_INPUT(N_ >= 1, "the data-parallel degree must be >= 1, got ", N_);
  MT_CHECK_INPUT(mbs >= 0, "--micro-batch-size must be >= 0, got ", mbs);
  MT_CHECK_INPUT(B_ % (N_ * (mbs > 0 ? mbs : 1)) == 0, "--batch-size ", B_, " is not divisible by --dp ", N_,
                 " x --micro-batch-size ", mbs > 0 ? mbs : 1);
  u_ = mbs > 0 ? mbs : B_ / N_;
  explicit_u_ = mbs > 0;
  if (cfg.sequence_parallel) {
    const int tp = cfg.tp;
    MT_CHECK_INPUT(tp > 1, "--sequence-parallel needs --tp > 1");
    const int64_t rows = (int64_t)u_ * cfg.seq_len;  // token rows per micro-batch
    MT_CHECK_INPUT(rows % tp == 0, "--sequence-parallel splits the ", rows, " token rows of a micro-batch (",
                   mbs > 0 ? "--micro-batch-size" : "--batch-size / --dp", " x --seq-len ", cfg.seq_len,
                   ") over --tp ", tp, ": they must be divisible");
  }
  spec_ = {cfg.schedule.empty() ? pipeline::kDefaultSchedule : cfg.schedule, cfg.pp, micro_count(), cfg.virtual_stages};
  if (cfg.pp > 1) pipeline::validate(spec_);
}

BatchShare BatchLayout::share(int r, int64_t) const {
  MT_ASSERT(r >= 0 && r < N_, "data-parallel rank ", r, " of ", N_);
  return BatchShare::even(r * per_rank(), per_rank(), u_);
}

BatchShare BatchLayout::eval_share(int r) const {
  MT_ASSERT(r >= 0 && r < N_, "data-parallel rank ", r, " of ", N_);
  const int e = (B_ + N_ - 1) / N_;
  const int first = std::min(B_, r * e), count = std::min(B_, first + e) - first;
  // Without --micro-batch-size the share is one micro-batch (at least one window wide: an empty share
  // runs no micro-batch).
  const int u = explicit_u_ ? u_ : std::max(count, 1);
  return BatchShare::even(first, count, u);
}

}  // namespace mt::train
