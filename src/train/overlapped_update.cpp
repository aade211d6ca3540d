#include "train/overlapped_update.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "trace/chrome_trace.h"

namespace mt::train {

OverlappedDelayOne::OverlappedDelayOne(double deadline_s, int threads, bool hold)
    : deadline_s_(deadline_s), threads_(std::max(1, threads)), hold_(hold) {
  MT_ASSERT(deadline_s > 0, "an overlapped update needs a deadline, got ", deadline_s, " s");
  thread_ = std::thread([this] { worker(); });
}

OverlappedDelayOne::~OverlappedDelayOne() { stop(); }

void OverlappedDelayOne::stop() {
  if (!thread_.joinable()) return;
  {
    std::unique_lock<std::mutex> lk(mu_);
    quit_ = true;
    released_ = true;
    cv_.notify_all();
    // A worker past its deadline (the run is failing with that error) gets one more deadline to end, then is
    // left behind rather than waited for without end.
    if (abandoned_ && !cv_.wait_for(lk, std::chrono::duration<double>(deadline_s_), [&] { return done_; })) {
      lk.unlock();
      thread_.detach();
      return;
    }
  }
  thread_.join();
}

void OverlappedDelayOne::worker() {
  omp_set_num_threads(threads_);  // this thread's own OpenMP teams
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return has_job_ || quit_; });
    if (!has_job_) return;  // quit with nothing left to run
    has_job_ = false;
    if (hold_) cv_.wait(lk, [&] { return released_ || quit_; });
    lk.unlock();
    std::exception_ptr err;
    try {
      job_.run(b_.data(), g_.data());
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    error_ = err;
    done_ = true;
    cv_.notify_all();
  }
}

void OverlappedDelayOne::bind(float* resident, size_t n) {
  MT_ASSERT(resident || n == 0, "no resident parameters to keep versions of");
  a_ = resident;
  n_ = n;
  b_.resize(n);
  g_.resize(n);
  if (n) std::memcpy(b_.data(), a_, n * sizeof(float));
  state_ = State::settled;
}

void OverlappedDelayOne::before_forward() {
  if (state_ == State::settled) {
    std::swap_ranges(a_, a_ + n_, b_.data());
    state_ = State::ready;
    return;
  }
  MT_ASSERT(state_ == State::flight, "a step began with the delayed update neither settled nor in flight");
  std::lock_guard<std::mutex> lk(mu_);
  if (!done_) overlapped_++;  // the update is still running as this step's forward begins
  released_ = true;
  cv_.notify_all();
}

void OverlappedDelayOne::finish() {
  if (state_ != State::flight) return;
  const double t0 = trace::ChromeTrace::now_us();
  {
    std::unique_lock<std::mutex> lk(mu_);
    released_ = true;
    cv_.notify_all();
    if (!cv_.wait_for(lk, std::chrono::duration<double>(deadline_s_), [&] { return done_; })) {
      abandoned_ = true;
      throw Error(str("the delayed parameter update (--overlap-update) did not finish within ", deadline_s_,
                      " s (--comm-timeout)"));
    }
    if (error_) {
      state_ = State::ready;  // nothing in flight any more; the run fails with the update's error
      std::rethrow_exception(std::exchange(error_, nullptr));
    }
  }
  waited_s_ += (trace::ChromeTrace::now_us() - t0) * 1e-6;
  if (job_.complete) job_.complete(b_.data());  // collectives: on this thread, in the serial order
  state_ = State::ready;
}

void OverlappedDelayOne::before_clip() { finish(); }

void OverlappedDelayOne::defer_update(const float* grads, const std::vector<std::pair<size_t, size_t>>& owned,
                                      DeferredUpdate u) {
  finish();
  MT_ASSERT(state_ == State::ready, "an update handed over with the versions settled (no step began)");
  if (n_) std::memcpy(a_, b_.data(), n_ * sizeof(float));  // the next step reads the version the update starts from
  for (const auto& [off, cnt] : owned) {
    MT_ASSERT(off + cnt <= n_, "an owned gradient range [", off, ", ", off + cnt, ") past ", n_, " floats");
    std::memcpy(g_.data() + off, grads + off, cnt * sizeof(float));
  }
  std::lock_guard<std::mutex> lk(mu_);
  job_ = std::move(u);
  has_job_ = true;
  done_ = false;
  released_ = false;
  deferred_++;
  state_ = State::flight;
  cv_.notify_all();
}

void OverlappedDelayOne::settle() {
  if (state_ != State::flight) return;
  finish();
  std::swap_ranges(a_, a_ + n_, b_.data());
  state_ = State::settled;
}

float* OverlappedDelayOne::other() {
  MT_ASSERT(state_ == State::settled, "the other weight version read with the delayed update not settled");
  return b_.data();
}

}  // namespace mt::train
