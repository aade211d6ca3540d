#include "train/adaptive_batch.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "core/error.h"

namespace mt::train {


std::optional<StepTimes> pinned_step_times(int rank) {
  static const std::vector<StepTimes> pins = [] {
    std::vector<StepTimes> out;
    const char* name = "MESHTRAIN_ADAPTIVE_BATCH_TIMES";
    const char* v = std::getenv(name);
    if (!v || !*v) return out;
    for (const char* p = v;;) {
      int c = -1, x = -1, u = -1, used = 0;
      const bool ok = std::sscanf(p, "%d,%d,%d%n", &c, &x, &u, &used) == 3 && (p[used] == '\0' || p[used] == ';') &&
                      c > 0 && x >= 0 && u >= 0;
      MT_CHECK_INPUT(ok, name, "=", v, " is not valid: it takes t_compute_us,t_exchange_us,t_update_us (integers, "
                     "t_compute_us > 0, the others >= 0), e.g. \"1000,3000,0\", or one such triple per rank "
                     "separated by ';'");
      out.push_back({c * 1e-6, x * 1e-6, u * 1e-6});
      if (p[used] == '\0') break;
      p += used + 1;
    }
    return out;
  }();
  if (pins.empty()) return std::nullopt;
  return pins[(size_t)rank % pins.size()];
}

double statistical_efficiency(double b_noise, double b0, double b) {
  if (std::isinf(b_noise)) return 1.0;  // no resolvable signal: the noise dominates at every batch
  b_noise = std::max(0.0, b_noise);
  return (b_noise + b0) / (b_noise + b);
}

double goodput(double b_noise, double b0, int k, const StepTimes& t) {
  return k * b0 / (k * t.compute + t.exchange + t.update) * statistical_efficiency(b_noise, b0, k * b0);
}

int choose_batches(double b_noise, double b0, int k, int max_k, const StepTimes& t) {
  if (2 * k > max_k) return k;
  return goodput(b_noise, b0, 2 * k, t) > goodput(b_noise, b0, k, t) ? 2 * k : k;
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

void AdaptiveBatch::observe(int64_t s, double t_compute, double t_exchange, double t_update, double b_noise) {
  const bool stepped = t_update >= 0;
  t_.compute = t_compute;
  if (stepped) {  // the exchange and the update of the optimizer step this data step completed
    t_.exchange = t_exchange;
    t_.update = t_update;
    updates_++;
  }
  gain_ = 0;
  if (std::isnan(b_noise) || pending_ != 0 || !stepped || s + 1 < o_.warmup || updates_ % o_.every != 0) return;
  // (decides() is this condition, asked before updates_ counts this step and without b_noise)
  b_used_ = b_noise;
  gain_ = goodput(b_noise, b0_, 2 * k_, t_) / goodput(b_noise, b0_, k_, t_);
  k_ = choose_batches(b_noise, b0_, k_, o_.max_k, t_);
}

bool AdaptiveBatch::decides(int64_t s, bool stepped) const {
  return stepped && pending_ == 0 && s + 1 >= o_.warmup && (updates_ + 1) % o_.every == 0;
}

void AdaptiveBatch::annotate(nlohmann::json& row) const {
  row["batches_per_update"] = k_used_;  // the global batches this data step's update averages (or will)
  row["updated"] = updated_;
  row["lr_scale"] = lr_scale();
  row["t_compute_s"] = t_.compute;    // this data step's forward and backward
  row["t_exchange_s"] = t_.exchange;  // the last optimizer step's exchange (not hidden by the backward)
  row["t_update_s"] = t_.update;      // and its optimizer step
  if (gain_ > 0) {  // this step decided: G(2k) / G(k), the B_noise it used (null: infinite), and the next k
    row["goodput_gain"] = gain_;
    row["goodput_noise"] = std::isinf(b_used_) ? nlohmann::json(nullptr) : nlohmann::json(b_used_);
    row["batches_next"] = k_;
  }
}

}  // namespace mt::train
