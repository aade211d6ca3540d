#include "offload/state_swapper.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "offload/block_io.h"
#include "offload/shard_file.h"
#include "trace/chrome_trace.h"

namespace mt::offload {

// O_TMPFILE (with O_DIRECT where the filesystem takes it), else a named file removed at once.
int open_unnamed(const std::string& dir, bool& direct) {
  struct stat st {};
  MT_CHECK_INPUT(::stat(dir.c_str(), &st) == 0, "--offload-dir ", dir, ": ", std::strerror(errno),
                 " (create the directory first)");
  MT_CHECK_INPUT(S_ISDIR(st.st_mode), "--offload-dir ", dir, " is not a directory");
  MT_CHECK_INPUT(::access(dir.c_str(), W_OK | X_OK) == 0, "--offload-dir ", dir,
                 " is not writable: ", std::strerror(errno));
  for (int flags : {O_DIRECT, 0}) {
    int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC | flags, 0600);
    if (fd >= 0) {
      direct = flags != 0;
      return fd;
    }
    if (errno == EACCES || errno == EROFS || errno == ENOSPC || errno == EDQUOT)
      throw InputError(str("--offload-dir ", dir, ": cannot create a file there: ", std::strerror(errno)));
  }
  // No O_TMPFILE on this filesystem: a name that lives for the instant between creation and unlink.
  std::string name = dir + "/.meshtrain-offload-XXXXXX";
  int fd = ::mkostemp(name.data(), O_CLOEXEC);
  MT_CHECK_INPUT(fd >= 0, "--offload-dir ", dir, ": cannot create a file there: ", std::strerror(errno));
  ::unlink(name.c_str());
  direct = false;
  return fd;
}

StateSwapper::StateSwapper(const Options& o) : o_(o), B_(o.buffers), n_(o.n) {
  MT_ASSERT(B_ > 0 && n_ > 0, "an offloaded state of ", B_, " buffers of ", n_, " elements");
  MT_CHECK_INPUT(o.tile_bytes >= kAlign && o.tile_bytes % kAlign == 0,
                 "--offload-tile must be a positive multiple of 4096 bytes, got ", o.tile_bytes);
  MT_ASSERT(o.slots >= 2, "a swapper needs 2 slots or more, got ", o.slots);
  // A tile no larger than the buffer needs (rounded up to the alignment).
  const size_t need = (n_ * sizeof(float) + kAlign - 1) / kAlign * kAlign;
  T_ = std::min(o.tile_bytes, need) / sizeof(float);
  tiles_ = (n_ + T_ - 1) / T_;
  fd_ = open_unnamed(o.dir, direct_);
  const off_t size = (off_t)file_bytes();
  int rc = ::posix_fallocate(fd_, 0, size);
  if (rc == EOPNOTSUPP || rc == EINVAL) rc = ::ftruncate(fd_, size) == 0 ? 0 : errno;
  if (rc != 0) {
    ::close(fd_);
    throw InputError(str("--offload-dir ", o.dir, ": no room for this rank's offloaded optimizer state (", size,
                         " bytes, ", (size + (1 << 20) - 1) >> 20, " MiB): ", std::strerror(rc),
                         "; free space there or choose another --offload-dir"));
  }
  slots_.resize((size_t)o.slots);
  for (Slot& s : slots_) {
    s.buf = static_cast<float*>(std::aligned_alloc(kAlign, B_ * T_ * sizeof(float)));
    if (!s.buf) {
      for (Slot& x : slots_) std::free(x.buf);
      ::close(fd_);
      throw OutOfMemory(B_ * T_ * sizeof(float));
    }
  }
  BlockIo::Options bo;
  bo.block = std::min(kBlock, B_ * T_ * sizeof(float));
  bo.direct = direct_;
  bo.uring = o.uring;
  bo.what = str("optimizer state in --offload-dir ", o.dir);
  const int threads = std::max(1, o.io_threads);
  for (int i = 0; i < threads; i++) ios_.push_back(std::make_unique<BlockIo>(fd_, bo));
  bo.uring = false;  // the caller's whole-buffer read() and write(): one I/O at a time
  caller_io_ = std::make_unique<BlockIo>(fd_, bo);
  for (int i = 0; i < threads; i++) io_.emplace_back([this, i] { io_loop(*ios_[(size_t)i]); });
}

StateSwapper::~StateSwapper() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : io_) t.join();
  ios_.clear();
  caller_io_.reset();
  for (Slot& s : slots_) std::free(s.buf);
  ::close(fd_);
}

// ---- The I/O threads. ----

void StateSwapper::io_loop(BlockIo& io) {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
    if (stop_) return;  // queued jobs are dropped: the file goes with the swapper
    const Job j = jobs_.front();
    jobs_.pop_front();
    if (running_++ == 0) busy_since_us_ = trace::ChromeTrace::now_us();
    run_job(io, j.slot, j.write, lk);
    if (--running_ == 0) counters_.busy_s += (trace::ChromeTrace::now_us() - busy_since_us_) * 1e-6;
    cv_.notify_all();
  }
}

void StateSwapper::run_job(BlockIo& io, size_t k, bool write, std::unique_lock<std::mutex>& lk) {
  Slot& s = slots_[k];
  if (!error_.empty()) return;  // after a failure nothing more is read or written
  const size_t bytes = B_ * T_ * sizeof(float), off = s.tile * bytes;
  const size_t tile = s.tile;
  lk.unlock();
  const double t0 = trace::ChromeTrace::now_us();
  std::string err;
  try {
    io.transfer(write, off, bytes, s.buf);  // aligned: the slot itself, in blocks of up to 1 MiB
  } catch (const std::exception& e) {
    err = e.what();
  }
  const double t1 = trace::ChromeTrace::now_us();
  lk.lock();
  if (!err.empty()) {
    error_ = err;
    return;
  }
  if (write) {
    counters_.bytes_written += bytes;
    counters_.write_s += (t1 - t0) * 1e-6;
  } else {
    counters_.bytes_read += bytes;
    counters_.read_s += (t1 - t0) * 1e-6;
  }
  if (o_.record_events) events_.push_back({write, tile, t0, t1});
  if (!write) {
    s.state = State::ready;
    return;
  }
  s.state = State::free;
  // The slot just written back takes the update's next tile at once (read ahead).
  if (in_update_ && next_tile_ < tiles_) prefetch_locked(tile_at(next_tile_++));
}

void StateSwapper::file_io(bool write, size_t off, size_t bytes, void* buf) {
  caller_io_->transfer(write, off, bytes, buf);
}

// ---- The caller's side. ----

void StateSwapper::throw_if_failed_locked() const {
  if (!error_.empty()) throw OffloadError(error_);
}

template <class Pred>
void StateSwapper::wait_locked(std::unique_lock<std::mutex>& lk, const char* what, Pred pred) {
  // --comm-timeout inf: a deadline far away (a week) rather than none.
  const double limit_s = std::isfinite(o_.timeout_s) ? std::min(o_.timeout_s, 604800.0) : 604800.0;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(limit_s));
  const bool ok = cv_.wait_until(lk, deadline, [&] { return !error_.empty() || pred(); });
  throw_if_failed_locked();
  if (!ok)
    throw OffloadError(str("offload: ", what, " did not finish within ", o_.timeout_s, " s (--offload-dir ", o_.dir,
                           "; is the disk stalled?)"));
}

int StateSwapper::slot_of_locked(size_t t) const {
  for (size_t k = 0; k < slots_.size(); k++) {
    const Slot& s = slots_[k];
    if (s.tile == t && (s.state == State::reading || s.state == State::ready || s.state == State::held)) return (int)k;
  }
  return -1;
}

bool StateSwapper::prefetch_locked(size_t t) {
  for (size_t k = 0; k < slots_.size(); k++) {
    if (slots_[k].state != State::free) continue;
    slots_[k].tile = t;
    slots_[k].state = State::reading;
    jobs_.push_back({k, false});
    if (o_.record_events) issued_.push_back({false, t});
    cv_.notify_all();
    return true;
  }
  return false;
}

void StateSwapper::begin_update() {
  std::unique_lock<std::mutex> lk(mu_);
  throw_if_failed_locked();
  MT_ASSERT(!in_update_, "begin_update twice");
  in_update_ = true;
  ahead_wanted_ = false;
  next_tile_ = 0;
  while (next_tile_ < tiles_ && slot_of_locked(tile_at(next_tile_)) >= 0) next_tile_++;  // read ahead after the last update
  while (next_tile_ < tiles_ && prefetch_locked(tile_at(next_tile_))) next_tile_++;
}

std::vector<float*> StateSwapper::acquire(size_t t) {
  std::unique_lock<std::mutex> lk(mu_);
  throw_if_failed_locked();
  MT_ASSERT(in_update_ && t < tiles_, "acquire(", t, ") of ", tiles_, " tiles outside an update");
  if (slot_of_locked(t) < 0) {
    // Not read ahead yet (the disk is behind): read it as soon as a slot is free, unless the I/O thread's
    // read-ahead takes it first.
    counters_.demand_reads++;
    wait_locked(lk, "waiting for a free swap buffer", [&] {
      if (slot_of_locked(t) >= 0) return true;
      if (!prefetch_locked(t)) return false;
      next_tile_ = std::max(next_tile_, place_of(t) + 1);
      return true;
    });
  }
  const int k = slot_of_locked(t);
  wait_locked(lk, "reading a tile of optimizer state", [&] { return slots_[k].state == State::ready; });
  slots_[k].state = State::held;
  std::vector<float*> out(B_);
  for (size_t j = 0; j < B_; j++) out[j] = slots_[k].buf + j * T_;
  return out;
}

void StateSwapper::release(size_t t) {
  std::unique_lock<std::mutex> lk(mu_);
  throw_if_failed_locked();
  const int k = slot_of_locked(t);
  MT_ASSERT(k >= 0 && slots_[k].state == State::held, "release(", t, ") of a tile not acquired");
  slots_[k].state = State::writing;
  jobs_.push_back({(size_t)k, true});
  if (o_.record_events) issued_.push_back({true, t});
  cv_.notify_all();
}

void StateSwapper::drain_locked(std::unique_lock<std::mutex>& lk) {
  wait_locked(lk, "writing optimizer state back", [&] {
    if (running_ > 0 || !jobs_.empty()) return false;
    for (const Slot& s : slots_)
      if (s.state == State::writing || s.state == State::reading) return false;
    return true;
  });
}

void StateSwapper::end_update() {
  std::unique_lock<std::mutex> lk(mu_);
  throw_if_failed_locked();
  for (const Slot& s : slots_) MT_ASSERT(s.state != State::held, "end_update with tile ", s.tile, " still held");
  in_update_ = false;
  drain_locked(lk);
  // The next update's first tiles, read during the next forward and backward (or from read_ahead()).
  if (!later_ || ahead_wanted_) read_ahead_locked();
  ahead_wanted_ = false;
}

void StateSwapper::read_ahead_locked() {
  for (size_t k = 0; k < tiles_; k++) {
    if (slot_of_locked(tile_at(k)) >= 0) continue;
    if (!prefetch_locked(tile_at(k))) break;
  }
}

void StateSwapper::set_read_ahead_later(bool v) {
  std::lock_guard<std::mutex> lk(mu_);
  later_ = v;
}

void StateSwapper::read_ahead() {
  std::lock_guard<std::mutex> lk(mu_);
  throw_if_failed_locked();
  if (in_update_) {
    ahead_wanted_ = true;
    return;
  }
  read_ahead_locked();
}

void StateSwapper::set_descending(bool d) {
  std::unique_lock<std::mutex> lk(mu_);
  throw_if_failed_locked();
  if (d == desc_) return;
  MT_ASSERT(!in_update_, "set_descending during an update");
  // The tiles read ahead for the other order: dropped once read (their contents are in the file).
  drain_locked(lk);
  for (Slot& s : slots_)
    if (s.state == State::ready) s.state = State::free;
  desc_ = d;
}

void StateSwapper::read(size_t j, size_t offset, size_t count, float* out) {
  MT_ASSERT(j < B_ && offset + count <= n_, "read of [", offset, ", ", offset + count, ") of buffer ", j);
  std::unique_lock<std::mutex> lk(mu_);
  throw_if_failed_locked();  // after a failed update (in_update_ still set): its error, not an assertion
  MT_ASSERT(!in_update_, "whole-buffer read during an update");
  drain_locked(lk);
  lk.unlock();
  float* bounce = static_cast<float*>(std::aligned_alloc(kAlign, B_ * T_ * sizeof(float)));
  if (!bounce) throw OutOfMemory(B_ * T_ * sizeof(float));
  std::unique_ptr<float, decltype(&std::free)> hold(bounce, &std::free);
  for (size_t i = offset; i < offset + count;) {
    const size_t t = i / T_, lo = t * T_, hi = std::min(offset + count, lo + T_);
    file_io(false, t * B_ * T_ * sizeof(float), B_ * T_ * sizeof(float), bounce);
    std::memcpy(out + (i - offset), bounce + j * T_ + (i - lo), (hi - i) * sizeof(float));
    i = hi;
  }
}

void StateSwapper::write(size_t j, size_t offset, size_t count, const float* in) {
  MT_ASSERT(j < B_ && offset + count <= n_, "write of [", offset, ", ", offset + count, ") of buffer ", j);
  std::unique_lock<std::mutex> lk(mu_);
  throw_if_failed_locked();
  MT_ASSERT(!in_update_, "whole-buffer write during an update");
  drain_locked(lk);
  for (Slot& s : slots_) s.state = State::free;  // tiles read ahead may be stale now
  lk.unlock();
  float* bounce = static_cast<float*>(std::aligned_alloc(kAlign, B_ * T_ * sizeof(float)));
  if (!bounce) throw OutOfMemory(B_ * T_ * sizeof(float));
  std::unique_ptr<float, decltype(&std::free)> hold(bounce, &std::free);
  const size_t tb = B_ * T_ * sizeof(float);
  for (size_t i = offset; i < offset + count;) {
    const size_t t = i / T_, lo = t * T_, hi = std::min(offset + count, lo + T_);
    file_io(false, t * tb, tb, bounce);
    std::memcpy(bounce + j * T_ + (i - lo), in + (i - offset), (hi - i) * sizeof(float));
    file_io(true, t * tb, tb, bounce);
    i = hi;
  }
}

const char* StateSwapper::engine() const { return ios_.front()->engine(); }

IoCounters StateSwapper::counters() const {
  std::lock_guard<std::mutex> lk(mu_);
  return counters_;
}

std::vector<std::pair<bool, size_t>> StateSwapper::issued() const {
  std::lock_guard<std::mutex> lk(mu_);
  return issued_;
}

std::vector<IoEvent> StateSwapper::take_events() {
  std::lock_guard<std::mutex> lk(mu_);
  return std::exchange(events_, {});
}

}  // namespace mt::offload
