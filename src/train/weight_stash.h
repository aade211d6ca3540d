// Weight versions for schedules that update each stage after every micro-batch (--schedule pipedream,
// pipemare; schedule_generator.h MicroUpdates). The rule (docs/parallelism.md, "PipeDream and PipeMare"):
// on each rank, versions are numbered by the updates of this step so far (0: the weights the step started
// with; n after the update of the n-th backward of the list). The forward of micro-batch i reads the newest
// version at the moment it runs (--vertical-sync: the version v_i stage 0 read for it, the number of updates
// before forward i in stage 0's list); the backward of i reads the version its forward read (stashed,
// pipedream) or the newest (pipemare); every update is applied to the newest version.
//
// The model reads one buffer, resident (A: its address is held by layers), which between steps and at every
// update holds the newest version. A version still needed by a micro-batch in flight is saved before A
// changes (an update, or an older version copied in for another micro-batch) and dropped when no micro-batch
// in flight needs it. Cost: a copy of the rank's resident parameters each time A changes version (at most
// two per computation); memory: A plus up to one saved copy per version held (the newest is saved too while an
// older one is in A; bytes() reports the most). Under 1F1B without --vertical-sync the versions held on stage
// s of p are at most p - s (the newest included), reached under the flush once m >= 2 (p - 1 - s): peak() is
// the count, which the summary reports per rank. Without a flush (MicroVersions::begin_window) the same holds
// over a window of steps, numbered as one list; a window (a step, when the run flushes) ends with all backwards
// and updates done, so between windows only the newest version exists: checkpoints hold one version.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <vector>

#include "parallel/data/param_versions.h"
#include "parallel/mesh/mesh.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_generator.h"
#include "tensor/buffer.h"

namespace mt::train {

// The versions of a schedule that updates after every micro-batch, when the run goes without a flush
// (train/micro_window_steps.h): a window of steps is one list over its n = K m micro-batches, numbered from 0
// (window micro-batch n = t m + k is micro-batch k of the window's step t). begin_window starts one (every
// backward of the last one done, versions numbered from 0 again: version v of the window is the weights after
// v of its updates); from the first window on, the per-step before_forward does nothing (the steps do not flush).
class MicroVersions : public parallel::ParamVersions {
 public:
  virtual void begin_window(const pipeline::Schedule& window, int n) = 0;
};

class WeightStash : public MicroVersions {
 public:
  using MicroUpdates = pipeline::ScheduleGenerator::MicroUpdates;
  // vsync: per micro-batch i, the version its forward reads on every stage (--vertical-sync); empty: the
  // newest at the forward. m: micro-batches per step.
  WeightStash(MicroUpdates mode, int m, std::vector<int> vsync);
  void bind(float* resident, size_t n) override;
  void before_forward() override;  // the step begins: version 0 is the newest, nothing in flight
  // --vertical-sync: the window's versions are vertical_sync_versions(window, n).
  void begin_window(const pipeline::Schedule& window, int n) override;
  void before_update() override;
  void after_update() override;
  void before_micro_forward(int i) override;
  void before_micro_backward(int i) override;
  float* other() override { return nullptr; }  // between steps only one version exists
  size_t bytes() const override { return peak_saved_ * n_ * sizeof(float); }  // the most the saved copies took
  // The most versions held at once on this rank so far: the newest and every version a micro-batch whose
  // forward ran and whose backward has not yet run reads (looked at after each forward, at each backward and
  // after each update).
  int peak() const { return peak_; }
  // Which version micro-batch i's forward and backward read in the current (or last) step (-1: not yet).
  int forward_version(int i) const { return fwd_.at(i); }
  int backward_version(int i) const { return bwd_.at(i); }

 private:
  bool needed(int v) const;
  void load(int v);
  void save_newest();
  void prune();
  void count_live();
  void reset();
  MicroUpdates mode_;
  int m_;
  std::vector<int> vsync_;
  float* a_ = nullptr;
  size_t n_ = 0;
  int newest_ = 0, loaded_ = 0, peak_ = 0;
  size_t peak_saved_ = 0;
  bool windowed_ = false;
  std::vector<int> fwd_, bwd_;
  std::map<int, AlignedBuffer> saved_;
};

// The stash's view of the pipeline executor: before each forward and backward of this rank's chunk, the
// version that computation reads is put in resident; the inner runner computes.
class VersionedRunner : public pipeline::StageRunner {
 public:
  VersionedRunner(pipeline::StageRunner& inner, parallel::ParamVersions& v) : inner_(inner), v_(v) {}
  size_t activation_count() const override { return inner_.activation_count(); }
  const float* forward(int chunk, int i, const float* input) override {
    v_.before_micro_forward(i);
    return inner_.forward(chunk, i, input);
  }
  const float* backward(int chunk, int i, const float* output_grad) override {
    v_.before_micro_backward(i);
    return inner_.backward(chunk, i, output_grad);
  }

 private:
  pipeline::StageRunner& inner_;
  parallel::ParamVersions& v_;
};

// Collective over the world: per pipeline rank j (replica 0's), the most versions its stash held (peak()); v
// may be null or another kind of versions on no rank but all.
std::vector<int> gather_stash_peaks(const parallel::Mesh& mesh, parallel::ParamVersions* v);

// Per micro-batch, the number of optimizer_step actions before its forward in the list of the rank holding
// stage 0 (what --vertical-sync reads on every stage).
std::vector<int> vertical_sync_versions(const pipeline::Schedule& schedule, int m);

}  // namespace mt::train
