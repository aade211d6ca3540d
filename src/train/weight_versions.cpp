#include "train/weight_versions.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "parallel/pipeline/schedule_generator.h"
#include "train/train_config.h"

namespace mt::train {

void DelayOneVersions::bind(float* resident, size_t n) {
  MT_ASSERT(resident || n == 0, "no resident parameters to keep versions of");
  a_ = resident;
  n_ = n;
  s_.resize(n);
  if (n) std::memcpy(s_.data(), a_, n * sizeof(float));
}

void DelayOneVersions::before_forward() { std::swap_ranges(a_, a_ + n_, s_.data()); }

void DelayOneVersions::before_update() {
  if (n_) std::memcpy(a_, s_.data(), n_ * sizeof(float));
}

bool delay_one(const TrainConfig& cfg) {
  if (cfg.delayed_update) return true;
  if (cfg.pp <= 1) return false;
  const std::string& name = cfg.schedule.empty() ? std::string(pipeline::kDefaultSchedule) : cfg.schedule;
  return pipeline::find_schedule(name).weight_versions() > 1;
}

std::unique_ptr<parallel::ParamVersions> make_weight_versions(const TrainConfig& cfg) {
  if (!delay_one(cfg)) return nullptr;
  return std::make_unique<DelayOneVersions>();
}

}  // namespace mt::train
