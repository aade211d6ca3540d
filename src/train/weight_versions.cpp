#include "train/weight_versions.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "tensor/blas.h"
#include "parallel/pipeline/schedule_generator.h"
#include "train/train_config.h"
#include "train/overlapped_update.h"
#include "train/pipemare.h"
#include "train/weight_stash.h"

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

bool micro_updates(const TrainConfig& cfg) {
  if (cfg.pp <= 1 || cfg.schedule.empty()) return false;
  return pipeline::find_schedule(cfg.schedule).micro_updates() != pipeline::ScheduleGenerator::MicroUpdates::none;
}

std::unique_ptr<parallel::ParamVersions> make_weight_versions(const TrainConfig& cfg,
                                                              const pipeline::Schedule* schedule) {
  if (micro_updates(cfg)) {
    MT_ASSERT(schedule && schedule->size() > 0, "per-micro-batch updates without the run's schedule");
    int m = 0;  // micro-batches of a step: the forwards of stage 0's rank (one chunk per rank)
    for (const pipeline::Action& a : (*schedule)[(size_t)schedule->placement.slot(0, 0).rank])
      if (a.kind == pipeline::ActionKind::forward) m++;
    if (cfg.pipemare_correction >= 0) return std::make_unique<PipeMareVersions>(m, cfg.pipemare_correction);
    return std::make_unique<WeightStash>(pipeline::find_schedule(cfg.schedule).micro_updates(), m,
                                         cfg.vertical_sync ? vertical_sync_versions(*schedule, m) : std::vector<int>{});
  }
  if (!delay_one(cfg)) return nullptr;
  if (cfg.overlap_update) {
    const char* hold = std::getenv("MESHTRAIN_OVERLAP_HOLD");  // tests: overlapped_update.h
    return std::make_unique<OverlappedDelayOne>(cfg.comm_timeout > 0 ? cfg.comm_timeout : 300, num_threads(),
                                                hold && std::string(hold) == "1");
  }
  return std::make_unique<DelayOneVersions>();
}

}  // namespace mt::train
