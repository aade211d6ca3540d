// The delay-1 rule with the update on a thread of its own (--overlap-update with --delayed-update): ZeRO-Offload's
// delayed parameter update as the issue describes it, step t's optimizer update running while step t+1's forward
// and backward run. The math is the delay-1 rule of train/weight_versions.h, bit for bit: the same optimizer
// calls on the same inputs in the same order, only on another thread and later.
//
// Buffers: A, the store's resident parameters (the model reads them; ZeRO 0/1: the registry's flat buffer), B,
// the version the optimizer updates, and G, a copy of the owned part of the step's reduced gradient (the
// registry's gradient buffer is written by the next step's backward while the update reads G). The bf16 mirror
// is the store's, refreshed from A at every step's begin, on the main thread; the worker never touches A, the
// mirror or the registry's gradient buffer. States, with step t's forward and backward reading W(t-1):
//
//   settled  A = W(t)    B = W(t-1)   nothing in flight   (the serial part's between-step layout: what
//                                                          evaluation, checkpoints and a resume see)
//   ready    A = W(t-1)  B = W(t)     nothing in flight
//   flight   A = W(t-1)  B -> W(t)    the worker runs opt(W(t-1), g_{t-1}) on B (then the main thread's
//                                     all-gather of B's shards under ZeRO 1)
//
//   bind                 B <- A                   settled (W(-1) = W(0))
//   before_forward       settled: swap(A, B)      -> ready;  flight: nothing (the update keeps running)
//   before_clip          flight: wait, complete   -> ready   (step t's norm is next; the optimizer's pending
//                                                             clipping scale must not change under the worker)
//   defer_update (g_t)   ready: A <- B (= W(t)), G <- g_t, start opt(B, G) -> flight
//   settle               flight: wait, complete, swap(A, B) -> settled
//
// So the update of step t overlaps step t+1's forward, backward and gradient reduction, and the main thread
// waits for it (with a deadline, --comm-timeout) only before step t+1's norm. Every collective (the gradient
// all-reduce / reduce-scatter, the norm, ZeRO 1's all-gather of the updated shards) stays on the main thread,
// in the serial order: the worker runs the optimizer alone (AdamW or SGD, elementwise; offloaded optimizer
// state streams through its tile buffers from the worker).
//
// Cost per step: two copies of the resident parameters' owned gradient and of the parameters (A <- B), against
// the serial part's swap and copy; memory: B and G (8 bytes per resident float).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>

#include "parallel/data/param_versions.h"
#include "tensor/buffer.h"

namespace mt::train {

class OverlappedDelayOne : public parallel::ParamVersions {
 public:
  // deadline_s: the longest the main thread waits for an update (> 0); threads: the worker's OpenMP threads;
  // hold (tests; MESHTRAIN_OVERLAP_HOLD=1 in the run): the worker starts each update only once the main thread
  // has begun the next step's forward (or waits for the update), which makes overlapped() count exactly the
  // updates that ran alongside a next step: a run shows the main thread does not wait for the update before
  // the next forward, whatever the timing.
  OverlappedDelayOne(double deadline_s, int threads, bool hold = false);
  ~OverlappedDelayOne() override;

  void bind(float* resident, size_t n) override;
  void before_forward() override;
  void before_update() override {}  // not called: the update is deferred
  float* other() override;
  size_t bytes() const override { return 2 * n_ * sizeof(float); }
  bool defers_update() const override { return true; }
  void defer_update(const float* grads, const std::vector<std::pair<size_t, size_t>>& owned,
                    DeferredUpdate u) override;
  void before_clip() override;
  void settle() override;
  void stop() override;

  // Counters (for the summary and the tests): updates handed over, and how many of them were still running
  // when the next step's forward began (measured by the worker's state at before_forward, not by time).
  int64_t deferred() const { return deferred_; }
  int64_t overlapped() const { return overlapped_; }
  double waited_s() const { return waited_s_; }

 private:
  enum class State { settled, ready, flight };
  void finish();  // flight -> ready
  void worker();

  double deadline_s_;
  int threads_;
  float* a_ = nullptr;
  size_t n_ = 0;
  AlignedBuffer b_ = AlignedBuffer::shared(0);  // ZeRO 1 all-gathers the update in place here: peers read it
  AlignedBuffer g_;
  State state_ = State::settled;
  DeferredUpdate job_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false;
  bool has_job_ = false, done_ = true, quit_ = false, abandoned_ = false, released_ = true;
  std::exception_ptr error_;
  std::thread thread_;

  int64_t deferred_ = 0, overlapped_ = 0;
  double waited_s_ = 0;
};

}  // namespace mt::train
