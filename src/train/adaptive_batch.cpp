#include "train/adaptive_batch.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "core/env.h"
#include "core/error.h"

namespace mt::train {

namespace {

// MESHTRAIN_ADAPTIVE_BATCH_TIMES="t_batch_us,t_update_us" replaces the measured times in the decisions (and in
// the rows) by these, so that a test's decisions depend on the noise scale alone; unset: measured.
std::optional<std::pair<double, double>> pinned_times() {
  static const std::optional<std::pair<int, int>> us = env_int_pair("MESHTRAIN_ADAPTIVE_BATCH_TIMES");
  if (!us) return std::nullopt;
  MT_CHECK_INPUT(us->first > 0, "MESHTRAIN_ADAPTIVE_BATCH_TIMES: t_batch_us must be > 0, got ", us->first);
  return std::make_pair(us->first * 1e-6, us->second * 1e-6);
}

}  // namespace

double statistical_efficiency(double b_noise, double b0, double b) {
  if (std::isinf(b_noise)) return 1.0;  // no resolvable signal: the noise dominates at every batch
  b_noise = std::max(0.0, b_noise);
  return (b_noise + b0) / (b_noise + b);
}

double goodput(double b_noise, double b0, int k, double t_batch, double t_update) {
  return k * b0 / (k * t_batch + t_update) * statistical_efficiency(b_noise, b0, k * b0);
}

int choose_batches(double b_noise, double b0, int k, int max_k, double t_batch, double t_update) {
  if (2 * k > max_k) return k;
  return goodput(b_noise, b0, 2 * k, t_batch, t_update) > goodput(b_noise, b0, k, t_batch, t_update) ? 2 * k : k;
}

AdaptiveBatch::AdaptiveBatch(const AdaptiveBatchOptions& o, double b0_items) : o_(o), b0_(b0_items) {}

bool AdaptiveBatch::count_data_step() {
  k_used_ = k_;
  if (++pending_ < k_) {
    updated_ = false;
    return false;
  }
  pending_ = 0;
  updated_ = true;
  return true;
}

float AdaptiveBatch::lr_scale() const { return (float)std::sqrt((double)k_used_); }

void AdaptiveBatch::observe(int64_t s, double t_batch, double t_update, double b_noise) {
  if (const auto pinned = pinned_times()) {
    t_batch = pinned->first;
    if (t_update >= 0) t_update = pinned->second;
  }
  if (t_update >= 0) {
    t_update_ = t_update;
    updates_++;
  }
  t_batch_ = t_batch;
  gain_ = 0;
  if (std::isnan(b_noise) || pending_ != 0 || t_update < 0 || s + 1 < o_.warmup || updates_ % o_.every != 0) return;
  b_used_ = b_noise;
  gain_ = goodput(b_noise, b0_, 2 * k_, t_batch_, t_update_) / goodput(b_noise, b0_, k_, t_batch_, t_update_);
  k_ = choose_batches(b_noise, b0_, k_, o_.max_k, t_batch_, t_update_);
}

void AdaptiveBatch::annotate(nlohmann::json& row) const {
  row["batches_per_update"] = k_used_;  // the global batches this data step's update averages (or will)
  row["updated"] = updated_;
  row["lr_scale"] = lr_scale();
  row["t_batch_s"] = t_batch_;
  row["t_update_s"] = t_update_;
  if (gain_ > 0) {  // this step decided: G(2k) / G(k), the B_noise it used (null: infinite), and the next k
    row["goodput_gain"] = gain_;
    row["goodput_noise"] = std::isinf(b_used_) ? nlohmann::json(nullptr) : nlohmann::json(b_used_);
    row["batches_next"] = k_;
  }
}

}  // namespace mt::train
