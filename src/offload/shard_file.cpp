#include "offload/shard_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/env.h"
#include "trace/chrome_trace.h"

namespace mt::offload {

namespace {
size_t rounded(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
}  // namespace

ShardFile::ShardFile(const Options& o) : o_(o), n_(o.n) {
  MT_ASSERT(o.io_block >= kAlign && o.io_block % kAlign == 0 && o.io_depth >= 1, "shard file I/O block ", o.io_block,
            " depth ", o.io_depth);
  bool direct = false;
  fd_ = open_unnamed(o.dir, direct);
  // MESHTRAIN_OFFLOAD_DIRECT=0: through the page cache even where O_DIRECT is taken (benchmarks comparing both).
  const bool want_direct = o.direct && env_int("MESHTRAIN_OFFLOAD_DIRECT", 0, 1).value_or(1) == 1;
  if (direct && !want_direct) {  // asked for the page cache (tests, benchmarks)
    const int fl = ::fcntl(fd_, F_GETFL);
    if (fl < 0 || ::fcntl(fd_, F_SETFL, fl & ~O_DIRECT) != 0) {
      const int e = errno;
      ::close(fd_);
      throw InputError(str("--offload-dir ", o.dir, ": cannot turn off direct I/O: ", std::strerror(e)));
    }
    direct = false;
  }
  // Rounded up to the direct I/O alignment: a range's last block is always inside the file.
  const off_t size = (off_t)rounded(file_bytes());
  int rc = size == 0 ? 0 : ::posix_fallocate(fd_, 0, size);
  if (rc == EOPNOTSUPP || rc == EINVAL) rc = ::ftruncate(fd_, size) == 0 ? 0 : errno;
  if (rc != 0) {
    ::close(fd_);
    throw InputError(str("--offload-dir ", o.dir, ": no room for this rank's offloaded ", o.kind, " (", size,
                         " bytes, ", (size + (1 << 20) - 1) >> 20, " MiB): ", std::strerror(rc),
                         "; free space there or choose another --offload-dir"));
  }
  BlockIo::Options bo;
  bo.block = o.io_block;
  bo.depth = o.io_depth;
  bo.direct = direct;
  bo.uring = o.uring;
  bo.what = str(o.kind, " in --offload-dir ", o.dir);
  io_ = std::make_unique<BlockIo>(fd_, bo);
  thread_ = std::thread([this] { io_loop(); });
}

ShardFile::~ShardFile() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  io_.reset();
  ::close(fd_);
}

void ShardFile::io_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
    if (stop_) return;
    Job j = std::move(jobs_.front());
    jobs_.pop_front();
    if (error_.empty()) {
      lk.unlock();
      const double t0 = trace::ChromeTrace::now_us();
      std::string err;
      try {
        io_->transfer_any(j.write, j.off * sizeof(float), j.count * sizeof(float),
                          j.copy.empty() ? j.buf : j.copy.data());
      } catch (const std::exception& e) {  // OffloadError, or a staging buffer not allocated
        err = e.what();
      }
      const double t1 = trace::ChromeTrace::now_us();
      lk.lock();
      if (!err.empty()) {
        error_ = err;
      } else {
        (j.write ? counters_.bytes_written : counters_.bytes_read) += j.count * sizeof(float);
        (j.write ? counters_.write_s : counters_.read_s) += (t1 - t0) * 1e-6;
        counters_.busy_s += (t1 - t0) * 1e-6;
        if (o_.record_events) events_.push_back({j.write, j.off, t0, t1});
      }
    }
    done_ = j.ticket;
    cv_.notify_all();
  }
}

ShardFile::Ticket ShardFile::queue(Job j) {
  std::lock_guard<std::mutex> lk(mu_);
  MT_ASSERT(j.off + j.count <= n_, o_.kind, " file I/O of [", j.off, ", ", j.off + j.count, ") of ", n_);
  if (!error_.empty()) throw OffloadError(error_);
  j.ticket = ++issued_;
  const Ticket t = j.ticket;
  jobs_.push_back(std::move(j));
  cv_.notify_all();
  return t;
}

ShardFile::Ticket ShardFile::read_async(size_t off, size_t count, float* out) {
  return queue({0, false, off, count, out, {}, {}});
}

ShardFile::Ticket ShardFile::write_async(size_t off, size_t count, const float* in) {
  return queue({0, true, off, count, const_cast<float*>(in), {}, {}});
}

ShardFile::Ticket ShardFile::write_copy(size_t off, size_t count, const float* in) {
  return write_owned(off, std::vector<float>(in, in + count));
}

ShardFile::Ticket ShardFile::write_owned(size_t off, size_t count, AlignedBuffer data, size_t pad) {
  MT_ASSERT(pad + count <= data.size(), "write_owned of ", count, " floats at ", pad, " of ", data.size());
  Job j{0, true, off, count, data.data() + pad, {}, {}};
  j.owned = std::move(data);  // the pointer stays: a move keeps the allocation
  return queue(std::move(j));
}

ShardFile::Ticket ShardFile::write_owned(size_t off, std::vector<float> data) {
  const size_t count = data.size();
  if (count == 0) return write_async(off, 0, nullptr);
  return queue({0, true, off, count, nullptr, std::move(data), {}});
}

template <class Pred>
void ShardFile::wait_locked(std::unique_lock<std::mutex>& lk, const char* what, Pred pred) {
  const double limit_s = std::isfinite(o_.timeout_s) ? std::min(o_.timeout_s, 604800.0) : 604800.0;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(limit_s));
  const bool ok = cv_.wait_until(lk, deadline, [&] { return !error_.empty() || pred(); });
  if (!error_.empty()) throw OffloadError(error_);
  if (!ok)
    throw OffloadError(str("offload: ", what, " ", o_.kind, " did not finish within ", o_.timeout_s,
                           " s (--offload-dir ", o_.dir, "; is the disk stalled?)"));
}

void ShardFile::wait(Ticket t) {
  std::unique_lock<std::mutex> lk(mu_);
  wait_locked(lk, "reading or writing", [&] { return done_ >= t; });
}

bool ShardFile::done(Ticket t) const {
  std::lock_guard<std::mutex> lk(mu_);
  if (!error_.empty()) throw OffloadError(error_);
  return done_ >= t;
}

void ShardFile::reserve(size_t n) {
  std::lock_guard<std::mutex> lk(mu_);
  if (n <= n_) return;
  const size_t have = rounded(n_ * sizeof(float)), want = rounded(n * sizeof(float));
  int rc = want == have ? 0 : ::posix_fallocate(fd_, (off_t)have, (off_t)(want - have));
  if (rc == EOPNOTSUPP || rc == EINVAL) rc = ::ftruncate(fd_, (off_t)want) == 0 ? 0 : errno;
  if (rc != 0)
    throw OffloadError(str("offload: no room in --offload-dir ", o_.dir, " for this rank's ", o_.kind, " (", n * sizeof(float),
                           " bytes): ", std::strerror(rc), "; free space there or choose another --offload-dir"));
  n_ = n;
}

void ShardFile::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  const Ticket t = issued_;
  wait_locked(lk, "writing back", [&] { return done_ >= t; });
}

IoCounters ShardFile::counters() const {
  std::lock_guard<std::mutex> lk(mu_);
  return counters_;
}

std::vector<IoEvent> ShardFile::take_events() {
  std::lock_guard<std::mutex> lk(mu_);
  return std::exchange(events_, {});
}

}  // namespace mt::offload
