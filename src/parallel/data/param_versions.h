// Other versions of the parameters a rank holds, beside the ones the optimizer updates: the interface through
// which the parameter store (data_parallel.h) hands its resident parameters to a part that keeps versions
// (train/weight_versions.h: the delay-1 rule of PipeDream-2BW and the delayed parameter update). The store
// calls it at the two points of a step where the version matters; the part decides what the buffer holds.
//
// resident: what this rank keeps of the parameters, in the ZeRO stage's layout (ZeRO 0-2: the whole flat
// buffer of the rank's registry, which the model reads; ZeRO 3: this rank's packed shards, which the model's
// gathers read), n floats. Its address never changes: layers and gathers hold it.
#pragma once

#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

namespace mt::parallel {

class ParamVersions {
 public:
  virtual ~ParamVersions() = default;
  // Once, after the store initialized the parameters: the buffer and its size.
  virtual void bind(float* resident, size_t n) = 0;
  // After the step's begin, before its first forward: resident must hold the version the step reads.
  virtual void before_forward() = 0;
  // Before the optimizer reads resident (its statistics phase too): it must hold the version it updates.
  virtual void before_update() = 0;
  // Between steps: the other version kept (same layout as resident, n floats); consolidation gathers it and
  // a resume loads it.
  virtual float* other() = 0;
  virtual size_t bytes() const = 0;
  // Schedules that update after every micro-batch (pipedream, pipemare; train/weight_stash.h): before this
  // rank's forward or backward of micro-batch i, resident must hold the version that computation reads; after
  // each update of the store (resident then holds the new version).
  virtual void before_micro_forward(int /*i*/) {}
  virtual void before_micro_backward(int /*i*/) {}
  virtual void after_update() {}

  // A part that runs the update on a thread of its own (train/overlapped_update.h) takes it over instead of
  // the store running it: defer_update(grads, owned, u) at the step's update, on the main thread, with the
  // step's reduced gradient buffer (the registry's layout), the ranges of it this rank's update reads
  // (offset, count) and the update in two halves: run(params, grads) (the optimizer, no collective) on the
  // part's thread, complete(params) (the collectives that finish params: ZeRO 1's all-gather) back on the
  // main thread. The store calls before_clip() before it computes the step's norm (the optimizer's pending
  // clipping scale is set next, so the update in flight must be over) and settle() before anything reads the
  // parameters between steps (evaluation, checkpoints, the end of the run).
  struct DeferredUpdate {
    std::function<void(float* params, const float* grads)> run;
    std::function<void(float* params)> complete;
  };
  virtual bool defers_update() const { return false; }
  virtual void defer_update(const float* /*grads*/, const std::vector<std::pair<size_t, size_t>>& /*owned*/,
                            DeferredUpdate /*u*/) {}
  virtual void before_clip() {}
  virtual void settle() {}
  // Before the optimizer handed over is destroyed (the run's end, or an error unwinding mid-step): ends the
  // part's thread, letting an update in flight finish first (no collective); the part is not used after.
  virtual void stop() {}
};

}  // namespace mt::parallel
