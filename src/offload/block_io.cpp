#include "offload/block_io.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <tuple>

#include "core/error.h"
#include "offload/state_swapper.h"

#ifdef MESHTRAIN_HAVE_URING
#include <liburing.h>
#endif

namespace mt::offload {

struct BlockIo::Ring {
#ifdef MESHTRAIN_HAVE_URING
  io_uring ring{};
#endif
};

bool BlockIo::uring_built() {
#ifdef MESHTRAIN_HAVE_URING
  return true;
#else
  return false;
#endif
}

BlockIo::BlockIo(int fd, const Options& o) : fd_(fd), o_(o) {
  MT_ASSERT(o.block >= kAlign && o.block % kAlign == 0 && o.depth >= 1, "BlockIo block ", o.block, " depth ", o.depth);
#ifdef MESHTRAIN_HAVE_URING
  if (o.uring && o.depth > 1) {
    auto r = std::make_unique<Ring>();
    // A kernel without io_uring, or a sandbox that forbids it (seccomp, io_uring_disabled): psync instead.
    if (io_uring_queue_init((unsigned)o.depth, &r->ring, 0) == 0) ring_ = std::move(r);
  }
#endif
}

BlockIo::~BlockIo() {
#ifdef MESHTRAIN_HAVE_URING
  if (ring_) io_uring_queue_exit(&ring_->ring);
#endif
  std::free(stage_);
}

char* BlockIo::staging(int slot) {
  if (!stage_) {
    // depth blocks, then two kAlign edge blocks for a write's read-modify-write.
    const size_t b = (size_t)depth() * o_.block + 2 * kAlign;
    stage_ = static_cast<char*>(std::aligned_alloc(kAlign, b));
    if (!stage_) throw OutOfMemory(b);
    std::memset(stage_, 0, b);  // resident from now on, as the memory plan counts it (train/offload.h)
    staging_bytes_.store(b, std::memory_order_relaxed);
  }
  return stage_ + (slot < 0 ? (size_t)depth() * o_.block + (size_t)(-1 - slot) * kAlign : (size_t)slot * o_.block);
}

void BlockIo::fail(const Req& r, int err) {
  if (!error_.empty()) return;
  if (err == 0)
    error_ = str("offload: the file of ", o_.what, " ended at byte ", r.off + r.done, " of ", r.off + r.len,
                 " (truncated by someone else?)");
  else
    error_ = str("offload: ", r.write ? "writing" : "reading", " ", o_.what, " failed at byte ", r.off + r.done, ": ",
                 std::strerror(err), err == ENOSPC ? " (the disk is full)" : "");
}

void BlockIo::sync_io(Req& r) {
  while (r.done < r.len) {
    const ssize_t n = r.write ? ::pwrite(fd_, r.buf + r.done, r.len - r.done, (off_t)(r.off + r.done))
                              : ::pread(fd_, r.buf + r.done, r.len - r.done, (off_t)(r.off + r.done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fail(r, n < 0 ? errno : 0);
      return;
    }
    r.done += (size_t)n;
  }
}

void BlockIo::submit(int slot) {
  Req& r = reqs_[(size_t)slot];
#ifdef MESHTRAIN_HAVE_URING
  if (ring_) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
    MT_ASSERT(sqe, "io_uring: no free submission entry with ", depth(), " in flight");
    if (r.write)
      io_uring_prep_write(sqe, fd_, r.buf + r.done, (unsigned)(r.len - r.done), (uint64_t)(r.off + r.done));
    else
      io_uring_prep_read(sqe, fd_, r.buf + r.done, (unsigned)(r.len - r.done), (uint64_t)(r.off + r.done));
    io_uring_sqe_set_data64(sqe, (uint64_t)slot);
    int rc;
    do rc = io_uring_submit(&ring_->ring);
    while (rc == -EINTR);
    MT_ASSERT(rc >= 1, "io_uring_submit: ", std::strerror(-rc));
    return;
  }
#endif
  sync_io(r);
  finished_.push_back(slot);
}

int BlockIo::complete() {
#ifdef MESHTRAIN_HAVE_URING
  if (ring_) {
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&ring_->ring, &cqe);
      if (rc == -EINTR) continue;
      MT_ASSERT(rc == 0 && cqe, "io_uring_wait_cqe: ", std::strerror(-rc));
      const int slot = (int)io_uring_cqe_get_data64(cqe);
      const int res = cqe->res;
      io_uring_cqe_seen(&ring_->ring, cqe);
      Req& r = reqs_[(size_t)slot];
      if (res == -EINTR || res == -EAGAIN) {
        submit(slot);
        continue;
      }
      if (res <= 0) {
        fail(r, -res);
        return slot;
      }
      r.done += (size_t)res;
      if (r.done < r.len && error_.empty()) {  // a short transfer: the rest again
        submit(slot);
        continue;
      }
      return slot;
    }
  }
#endif
  const int slot = finished_.front();
  finished_.erase(finished_.begin());
  return slot;
}

template <class Ready, class After>
void BlockIo::pipeline(size_t n, Ready ready, After after) {
  const int d = depth();
  reqs_.assign((size_t)d, Req{});
  finished_.clear();
  error_.clear();
  std::vector<size_t> index((size_t)d);
  size_t next = 0;
  int in_flight = 0;
  auto start = [&](int s) {
    index[(size_t)s] = next;
    reqs_[(size_t)s] = Req{};
    ready(next++, s, reqs_[(size_t)s]);
    in_flight++;
    submit(s);
  };
  for (int s = 0; s < d && next < n && error_.empty(); s++) start(s);
  while (in_flight > 0) {
    const int s = complete();
    in_flight--;
    if (!error_.empty()) continue;  // no more submissions: wait for the rest, then throw
    after(index[(size_t)s], s);
    if (next < n) start(s);
  }
  if (!error_.empty()) throw OffloadError(error_);
}

void BlockIo::transfer(bool write, size_t off, size_t bytes, void* buf) {
  if (bytes == 0) return;
  char* p = static_cast<char*>(buf);
  if (o_.direct)
    MT_ASSERT(off % kAlign == 0 && bytes % kAlign == 0 && (uintptr_t)p % kAlign == 0, "direct I/O of ", bytes,
              " bytes at ", off, " is not ", kAlign, "-aligned");
  const size_t n = (bytes + o_.block - 1) / o_.block;
  pipeline(
      n,
      [&](size_t i, int, Req& r) {
        r.write = write;
        r.off = off + i * o_.block;
        r.len = std::min(o_.block, bytes - i * o_.block);
        r.buf = p + i * o_.block;
      },
      [](size_t, int) {});
}

void BlockIo::transfer_any(bool write, size_t off, size_t bytes, void* buf) {
  if (bytes == 0) return;
  char* p = static_cast<char*>(buf);
  if (!o_.direct) {
    transfer(write, off, bytes, buf);
    return;
  }
  if (off % kAlign == 0 && bytes % kAlign == 0 && (uintptr_t)p % kAlign == 0) {
    transfer(write, off, bytes, buf);  // the caller's memory itself
    return;
  }
  // The buffer lies at the file's place modulo kAlign: its whole aligned blocks are the caller's memory itself,
  // only the partly covered edge blocks go through staging (each within one block: no block moved twice).
  const size_t i0 = (off + kAlign - 1) / kAlign * kAlign, i1 = (off + bytes) / kAlign * kAlign;
  if (((uintptr_t)p - off) % kAlign == 0 && i0 < i1) {
    if (off < i0) staged(write, off, i0 - off, p);
    transfer(write, i0, i1 - i0, p + (i0 - off));
    if (i1 < off + bytes) staged(write, i1, off + bytes - i1, p + (i1 - off));
    return;
  }
  staged(write, off, bytes, p);
}

void BlockIo::staged(bool write, size_t off, size_t bytes, char* p) {
  const size_t a0 = off / kAlign * kAlign, a1 = (off + bytes + kAlign - 1) / kAlign * kAlign;
  staged_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  const size_t head = a0, tail = a1 - kAlign;  // the edge blocks a write may cover only in part
  const bool rmw_head = write && off != a0, rmw_tail = write && off + bytes != a1 && !(rmw_head && tail == head);
  if (rmw_head || rmw_tail) {
    // Read the partly covered edge blocks first: the write puts back what it does not replace.
    for (auto [on, at, slot] : {std::tuple{rmw_head, head, -1}, std::tuple{rmw_tail, tail, -2}}) {
      if (!on) continue;
      Req r{false, at, kAlign, 0, staging(slot)};
      error_.clear();
      sync_io(r);
      if (!error_.empty()) throw OffloadError(error_);
    }
  }
  const size_t n = (a1 - a0 + o_.block - 1) / o_.block;
  // The part of block i (file bytes [s, e)) that is the caller's: [max(s, off), min(e, off + bytes)).
  pipeline(
      n,
      [&](size_t i, int slot, Req& r) {
        r.write = write;
        r.off = a0 + i * o_.block;
        r.len = std::min(o_.block, a1 - r.off);
        r.buf = staging(slot);
        if (!write) return;
        const size_t s = r.off, e = r.off + r.len;
        if (rmw_head && head >= s && head < e) std::memcpy(r.buf + (head - s), staging(-1), kAlign);
        if (rmw_tail && tail >= s && tail < e) std::memcpy(r.buf + (tail - s), staging(-2), kAlign);
        const size_t lo = std::max(s, off), hi = std::min(e, off + bytes);
        std::memcpy(r.buf + (lo - s), p + (lo - off), hi - lo);
      },
      [&](size_t i, int slot) {
        if (write) return;
        const size_t s = a0 + i * o_.block, e = std::min(a1, s + o_.block);
        const size_t lo = std::max(s, off), hi = std::min(e, off + bytes);
        std::memcpy(p + (lo - off), staging(slot) + (lo - s), hi - lo);
      });
}

}  // namespace mt::offload
