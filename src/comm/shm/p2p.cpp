#include "comm/shm/p2p.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "comm/copy.h"
#include "comm/deadline.h"
#include "comm/shm/cma.h"
#include "core/env.h"
#include "core/error.h"

namespace mt::comm::shm {

namespace {
struct WireHeader {
  uint64_t bytes;
  int32_t tag;
  uint32_t magic;
};
constexpr uint32_t kWireMagic = 0x7032706d;  // the payload follows in the ring
constexpr uint32_t kCmaMagic = 0x70326d63;   // a CmaDesc follows: the receiver reads the payload from the sender
static_assert(sizeof(WireHeader) == 16);
// Written with its header in one publication. `status` is the receiver's answer to a channel's probe (p2p.h): 0, or 1
// if it could not read the sender's buffer and expects the payload inline behind the descriptor.
struct CmaDesc {
  uint64_t addr;  // the send buffer, in the sender's address space
  int32_t pid;    // the sender's process
  uint32_t status;
};
static_assert(sizeof(CmaDesc) == 16);
constexpr size_t kCmaRecord = sizeof(WireHeader) + sizeof(CmaDesc);

void ring_write(char* ring, size_t cap, uint64_t pos, const void* src, size_t len) {
  size_t at = pos % cap, first = std::min(len, cap - at);
  copy_in(ring + at, src, first);
  if (len > first) copy_in(ring, static_cast<const char*>(src) + first, len - first);
}
// The doorbell of a piece before the last of a send: the first wakes a receiver asleep in its wait (the wake-up,
// ~0.1 ms on a loaded VM, then overlaps the copy of the rest); the others only count, for a receiver already awake
// (a FUTEX_WAKE per piece would cost the sender a system call each while the woken receiver is still on its way).
// The last piece's doorbell is a full signal_bump, so a receiver that fell asleep between pieces is woken by it.
void ring_piece(Signal& bell, bool wake) {
  if (wake) return signal_bump(bell);
  stream_fence();
  bell.value.fetch_add(1, std::memory_order_seq_cst);
}
void ring_read(const char* ring, size_t cap, uint64_t pos, void* dst, size_t len) {
  size_t at = pos % cap, first = std::min(len, cap - at);
  copy_bytes(dst, ring + at, first, false);
  if (len > first) copy_bytes(static_cast<char*>(dst) + first, ring, len - first, false);
}
// The receiver's write of a probe's status into the descriptor (ordered before the tail's release store).
void ring_poke(char* ring, size_t cap, uint64_t pos, const void* src, size_t len) {
  size_t at = pos % cap, first = std::min(len, cap - at);
  std::memcpy(ring + at, src, first);
  if (len > first) std::memcpy(ring, static_cast<const char*>(src) + first, len - first);
}
}  // namespace

struct P2P::Op : detail::RequestState {
  P2P* eng = nullptr;
  bool is_send = false;
  char* buf = nullptr;  // const for sends
  size_t bytes = 0, done = 0;
  bool header_sent = false;
  int peer = 0, tag = 0;
  double timeout_s = 300;
  bool finished = false;  // guarded by eng->mu_
  std::string error;

  bool test() override { return eng->test(*this); }
  void wait() override { eng->wait(*this); }
  std::string what() const {
    return str(is_send ? "send" : "recv", "(", is_send ? "to" : "from", " rank ", peer, ", tag ", tag, ", ", bytes,
               " bytes)");
  }
};

P2P::P2P(Layout layout, int rank, SpinPolicy spin, Poll poll)
    : L_(layout), me_(rank), spin_(spin), poll_(std::move(poll)), sendq_(layout.n), posted_(layout.n),
      unexpected_(layout.n), incoming_(layout.n), announced_(layout.n, 0), pid_(getpid()), cma_(layout.n, Cma::unknown),
      acks_(layout.n), cma_read_(layout.n, 0) {
  // Off unless asked for (p2p.h: on this work's host it measured slower on the pipeline's critical path).
  if (auto kb = env_int("MESHTRAIN_SHM_P2P_CMA_KB", 0, 1L << 30)) cma_min_ = size_t(*kb) * 1024;
  if (env_flag("MESHTRAIN_SHM_CMA") == false) cma_min_ = 0;
}

void P2P::set_single_copy_min(size_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  cma_min_ = bytes;
}

Request P2P::isend(const void* buf, size_t bytes, int peer, int tag, double timeout_s) {
  auto op = std::make_shared<Op>();
  op->eng = this;
  op->is_send = true;
  op->buf = const_cast<char*>(static_cast<const char*>(buf));
  op->bytes = bytes;
  op->peer = peer;
  op->tag = tag;
  op->timeout_s = timeout_s;
  std::lock_guard<std::mutex> l(mu_);
  sendq_[peer].push_back(op);
  // This channel only: what has arrived from others is read by their own calls or while this rank waits (see wait),
  // not on the way out of a send, where it would delay the rank's next computation.
  progress_send(peer);
  start_thread_if_pending();
  return Request(op);
}

Request P2P::irecv(void* buf, size_t bytes, int peer, int tag, double timeout_s) {
  auto op = std::make_shared<Op>();
  op->eng = this;
  op->buf = static_cast<char*>(buf);
  op->bytes = bytes;
  op->peer = peer;
  op->tag = tag;
  op->timeout_s = timeout_s;
  std::lock_guard<std::mutex> l(mu_);
  auto& uq = unexpected_[peer];
  for (auto it = uq.begin(); it != uq.end(); ++it) {
    if ((*it)->tag != tag) continue;
    if ((*it)->data.size() != bytes) {
      op->error = str("recv from rank ", peer, " with tag ", tag, " expects ", bytes, " bytes but the message has ",
                      (*it)->data.size(), " (mismatched send/recv)");
    } else if (!(*it)->error.empty()) {
      op->error = (*it)->error;
    } else if (bytes) {
      std::memcpy(op->buf, (*it)->data.data(), bytes);
    }
    uq.erase(it);
    op->finished = true;
    return Request(op);
  }
  posted_[peer].push_back(op);
  progress_recv(peer);  // this channel only, as in isend
  start_thread_if_pending();
  return Request(op);
}

P2P::~P2P() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_.store(true);
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

// The progress thread is for bytes that cannot move without it: a send that did not fit the ring, a message
// half read, a posted receive larger than the ring (its sender can finish only while it is drained). A posted
// receive whose message fits the ring does not wake it: the message waits in the ring (or arrives there) and the
// rank's own next call (test, wait, or an isend or irecv on that channel) reads it. Waking a thread for every
// message that fits the ring cost the pipeline ranks their core on a loaded 2-core host: the wake-up, and the
// rank's main thread then blocking on mu_ behind it, took 5-60 ms in about half of the executor's sends and
// posts at load 20-28 (`meshtrain train --pp 2 --trace`, category "executor";
// bench/results/pipeline/zero_bubble_perf_2026-11-27.md).
bool P2P::needs_thread() const {
  for (int p = 0; p < L_.n; ++p) {
    if (!sendq_[p].empty() || incoming_[p].active) return true;
    for (const auto& op : posted_[p])
      if (op->bytes + sizeof(WireHeader) > L_.chan_bytes) return true;
  }
  return false;
}

void P2P::start_thread_if_pending() {
  if (!needs_thread()) return;
  if (!thread_.joinable()) thread_ = std::thread([this] { progress_loop(); });
  cv_.notify_all();
}

namespace {
struct StopProgress {};
}  // namespace

void P2P::progress_loop() {
  Signal& bell = L_.ctrl(me_).doorbell;
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return stop_.load() || needs_thread(); });
    if (stop_.load()) return;
    uint32_t seen = bell.value.load(std::memory_order_acquire);
    progress();
    if (!needs_thread()) continue;
    l.unlock();
    try {
      signal_wait(bell, seen + 1, SpinPolicy{0, 0}, [&] {
        if (stop_.load()) throw StopProgress{};
      });
    } catch (const StopProgress&) {
      return;
    }
    l.lock();
  }
}

void P2P::progress() {
  for (int p = 0; p < L_.n; ++p) {
    if (!sendq_[p].empty() || !acks_[p].empty()) progress_send(p);
    progress_recv(p);
  }
}

// The receiver consumes a single-copy descriptor after its copy: a tail past it completes the send. The channel's
// probe (the first) comes back with the receiver's status; refused, the send goes back to the front of the queue with
// its header already out, and its payload follows inline right behind the descriptor (nothing was written after it).
// Returns the tail read: the caller writes only below it + cap, where every descriptor has been looked at here.
uint64_t P2P::reap_acks(int peer) {
  const uint64_t tail = L_.chan(me_, peer).tail.load(std::memory_order_acquire);
  auto& q = acks_[peer];
  while (!q.empty() && q.front().end <= tail) {
    Acked a = std::move(q.front());
    q.pop_front();
    if (cma_[peer] == Cma::probing) {
      uint32_t status = 0;
      ring_read(L_.ring(me_, peer), L_.chan_bytes, a.end - sizeof(CmaDesc) + offsetof(CmaDesc, status), &status,
                sizeof status);
      if (status != 0) {
        cma_[peer] = Cma::off;
        sendq_[peer].push_front(std::move(a.op));
        continue;
      }
      cma_[peer] = Cma::on;
    }
    a.op->finished = true;
  }
  return tail;
}

void P2P::progress_send(int peer) {
  ChannelCtrl& ch = L_.chan(me_, peer);
  char* ring = L_.ring(me_, peer);
  const size_t cap = L_.chan_bytes;
  const uint64_t tail = reap_acks(peer);
  bool wrote = false;
  // While the channel's probe is out nothing is written behind it (its payload may have to follow it inline).
  while (!sendq_[peer].empty() && cma_[peer] != Cma::probing) {
    Op& op = *sendq_[peer].front();
    uint64_t head = ch.head.load(std::memory_order_relaxed);
    size_t space = cap - (head - tail);
    if (!op.header_sent && cma_min_ && op.bytes >= cma_min_ && cma_[peer] != Cma::off) {
      if (space < kCmaRecord) break;
      const WireHeader h{op.bytes, op.tag, kCmaMagic};
      const CmaDesc d{reinterpret_cast<uint64_t>(op.buf), pid_, 0};
      ring_write(ring, cap, head, &h, sizeof h);
      ring_write(ring, cap, head + sizeof h, &d, sizeof d);
      head += kCmaRecord;
      stream_fence();
      ch.head.store(head, std::memory_order_release);
      op.header_sent = true;
      acks_[peer].push_back({std::move(sendq_[peer].front()), head});
      sendq_[peer].pop_front();
      if (cma_[peer] == Cma::unknown) cma_[peer] = Cma::probing;
      wrote = true;
      continue;
    }
    if (!op.header_sent) {
      if (space < sizeof(WireHeader)) break;
      WireHeader h{op.bytes, op.tag, kWireMagic};
      ring_write(ring, cap, head, &h, sizeof h);
      head += sizeof h;
      space -= sizeof h;
      op.header_sent = true;
    }
    // Published piece by piece: the header with the first piece, then every kPublishBytes, each with a doorbell,
    // so that a receiver already waiting wakes while the rest is still being written and copies out behind the
    // writer (the last piece's copy-out is all that is left after this call).
    size_t k = std::min(space, op.bytes - op.done);
    bool first = op.done == 0;
    do {
      const size_t piece = std::min(k, kPublishBytes);
      if (piece) ring_write(ring, cap, head, op.buf + op.done, piece);
      head += piece;
      op.done += piece;
      k -= piece;
      stream_fence();  // ring_write streams (copy_in); order it before the head the reader acquires
      ch.head.store(head, std::memory_order_release);
      if (k) ring_piece(L_.ctrl(peer).doorbell, first);  // the last piece's doorbell rings below, once per call
      first = false;
    } while (k);
    wrote = true;
    if (op.done < op.bytes) break;
    op.finished = true;
    sendq_[peer].pop_front();
  }
  if (wrote) signal_bump(L_.ctrl(peer).doorbell);
}

void P2P::progress_recv(int src) {
  ChannelCtrl& ch = L_.chan(src, me_);
  const char* ring = L_.ring(src, me_);
  const size_t cap = L_.chan_bytes;
  Incoming& in = incoming_[src];
  bool ended = false;  // a message ended in this call, or a single-copy descriptor was consumed (the sender's ack)
  for (;;) {
    uint64_t tail = ch.tail.load(std::memory_order_relaxed);
    size_t avail = ch.head.load(std::memory_order_acquire) - tail;
    if (!in.active) {
      if (avail < sizeof(WireHeader)) break;
      WireHeader h;
      ring_read(ring, cap, tail, &h, sizeof h);
      MT_ASSERT(h.magic == kWireMagic || h.magic == kCmaMagic, "corrupt p2p stream from rank ", src);
      if (h.magic == kCmaMagic && avail < kCmaRecord) break;  // published whole: not reached
      tail += sizeof h;
      avail -= sizeof h;
      in = Incoming{};
      in.active = true;
      in.tag = h.tag;
      in.bytes = h.bytes;
      auto& pq = posted_[src];
      for (auto it = pq.begin(); it != pq.end(); ++it) {
        if ((*it)->tag == h.tag) {
          in.recv = *it;
          pq.erase(it);
          break;
        }
      }
      if (in.recv && in.recv->bytes != h.bytes) {
        in.recv->error = str("recv from rank ", src, " with tag ", h.tag, " expects ", in.recv->bytes,
                             " bytes but the message has ", h.bytes, " (mismatched send/recv)");
      }
      if (!in.recv || !in.recv->error.empty()) {
        in.unexp = std::make_shared<Unexpected>();
        in.unexp->tag = h.tag;
        in.unexp->data.resize(h.bytes);
      }
      if (h.magic == kCmaMagic) {
        read_single_copy(src, tail);
        tail += sizeof(CmaDesc);
        avail -= sizeof(CmaDesc);
        ended = true;
      }
    }
    size_t k = std::min(avail, in.bytes - in.done);
    if (k) {
      char* dst = in.unexp ? in.unexp->data.data() : in.recv->buf;
      ring_read(ring, cap, tail, dst + in.done, k);
      tail += k;
      in.done += k;
    }
    ch.tail.store(tail, std::memory_order_release);
    if (in.done < in.bytes) break;
    ended = true;
    if (in.recv) in.recv->finished = true;
    if (in.unexp && !(in.recv && !in.recv->error.empty())) finish_unexpected(src, in.unexp);
    in = Incoming{};
  }
  // The sender learns of freed room at the end of each message, or after a quarter ring read within one: not on
  // every piece of a message read as it is published (each doorbell may wake a sleeping sender for nothing). A
  // sender waits for room only with the ring full, and the next call here reads all of it (a quarter ring at
  // least), so a waiting sender is always rung.
  const uint64_t tail = ch.tail.load(std::memory_order_relaxed);
  if (ended || tail - announced_[src] >= cap / 4) {
    announced_[src] = tail;
    signal_bump(L_.ctrl(src).doorbell);
  }
}

// The payload of the single-copy message whose descriptor is at `pos`, straight from the sender's buffer into the
// posted receive (or the unexpected buffer). A channel's first descriptor that cannot be read is refused (p2p.h): the
// payload then follows inline and `in` stays open for it. A later failure ends the receive with an error.
void P2P::read_single_copy(int src, uint64_t pos) {
  Incoming& in = incoming_[src];
  char* ring = L_.ring(src, me_);
  CmaDesc d;
  ring_read(ring, L_.chan_bytes, pos, &d, sizeof d);
  char* dst = in.unexp ? in.unexp->data.data() : in.recv->buf;
  if (in.bytes == 0 || cma_copy(d.pid, dst, d.addr, in.bytes, false)) {
    cma_read_[src] = 1;
    in.done = in.bytes;
    return;
  }
  const int err = errno;
  if (!cma_read_[src]) {
    const uint32_t refused = 1;
    ring_poke(ring, L_.chan_bytes, pos + offsetof(CmaDesc, status), &refused, sizeof refused);
    return;
  }
  const std::string why = str("single-copy read of a ", in.bytes, "-byte message with tag ", in.tag, " from rank ",
                              src, " (pid ", d.pid, ") failed: ", std::strerror(err),
                              err == ESRCH ? " (that process has ended)" : "");
  if (in.recv && in.recv->error.empty())
    in.recv->error = why;
  else
    in.unexp->error = why;
  in.done = in.bytes;
}

void P2P::finish_unexpected(int src, std::shared_ptr<Unexpected> u) {
  // A recv posted while this message was arriving unclaimed gets it now.
  auto& pq = posted_[src];
  for (auto it = pq.begin(); it != pq.end(); ++it) {
    Op& op = **it;
    if (op.tag != u->tag) continue;
    if (op.bytes != u->data.size()) {
      op.error = str("recv from rank ", src, " with tag ", u->tag, " expects ", op.bytes, " bytes but the message has ",
                     u->data.size(), " (mismatched send/recv)");
    } else if (!u->error.empty()) {
      op.error = u->error;
    } else if (op.bytes) {
      std::memcpy(op.buf, u->data.data(), op.bytes);
    }
    op.finished = true;
    pq.erase(it);
    return;
  }
  unexpected_[src].push_back(std::move(u));
}

bool P2P::test(Op& op) {
  std::lock_guard<std::mutex> l(mu_);
  if (!op.finished) {
    progress();
    start_thread_if_pending();  // a message this call began to read, or a send still waiting for room
  }
  return op.finished;
}

void P2P::wait(Op& op) {
  const auto until = deadline_after<Clock>(op.timeout_s);
  Signal& bell = L_.ctrl(me_).doorbell;
  for (;;) {
    uint32_t seen = bell.value.load(std::memory_order_acquire);
    {
      std::lock_guard<std::mutex> l(mu_);
      // The awaited channel first: a wait whose message is there returns without reading the others'. Only a
      // wait that would block reads what has arrived from others (time the rank would spend idle anyway).
      if (!op.finished) {
        if (op.is_send)
          progress_send(op.peer);
        else
          progress_recv(op.peer);
      }
      if (!op.finished) progress();
      if (op.finished) break;
    }
    // The sender rings the doorbell after writing and may end right after: a doorbell that rang since `seen`
    // means there is something to read, and the loop reads it before anyone is blamed.
    signal_wait(bell, seen + 1, spin_, [&] {
      poll_(op.peer, op.what(), until, [&] { return bell.value.load(std::memory_order_seq_cst) != seen; });
    });
  }
  if (!op.error.empty()) throw CommError(op.error);
}

}  // namespace mt::comm::shm
