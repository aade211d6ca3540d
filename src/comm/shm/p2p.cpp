#include "comm/shm/p2p.h"

#include <algorithm>
#include <cstring>

#include "comm/copy.h"
#include "comm/deadline.h"
#include "core/error.h"

namespace mt::comm::shm {

namespace {
struct WireHeader {
  uint64_t bytes;
  int32_t tag;
  uint32_t magic;
};
constexpr uint32_t kWireMagic = 0x7032706d;
static_assert(sizeof(WireHeader) == 16);

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
      unexpected_(layout.n), incoming_(layout.n), announced_(layout.n, 0) {}

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
    if (!sendq_[p].empty()) progress_send(p);
    progress_recv(p);
  }
}

void P2P::progress_send(int peer) {
  ChannelCtrl& ch = L_.chan(me_, peer);
  char* ring = L_.ring(me_, peer);
  const size_t cap = L_.chan_bytes;
  bool wrote = false;
  while (!sendq_[peer].empty()) {
    Op& op = *sendq_[peer].front();
    uint64_t head = ch.head.load(std::memory_order_relaxed);
    size_t space = cap - (head - ch.tail.load(std::memory_order_acquire));
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
  bool ended = false;  // a message ended in this call
  for (;;) {
    uint64_t tail = ch.tail.load(std::memory_order_relaxed);
    size_t avail = ch.head.load(std::memory_order_acquire) - tail;
    if (!in.active) {
      if (avail < sizeof(WireHeader)) break;
      WireHeader h;
      ring_read(ring, cap, tail, &h, sizeof h);
      MT_ASSERT(h.magic == kWireMagic, "corrupt p2p stream from rank ", src);
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

void P2P::finish_unexpected(int src, std::shared_ptr<Unexpected> u) {
  // A recv posted while this message was arriving unclaimed gets it now.
  auto& pq = posted_[src];
  for (auto it = pq.begin(); it != pq.end(); ++it) {
    Op& op = **it;
    if (op.tag != u->tag) continue;
    if (op.bytes != u->data.size()) {
      op.error = str("recv from rank ", src, " with tag ", u->tag, " expects ", op.bytes, " bytes but the message has ",
                     u->data.size(), " (mismatched send/recv)");
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
