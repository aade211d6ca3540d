#include "comm/shm/shm_comm.h"

#include <signal.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>

#include "comm/copy.h"
#include "comm/shm/cma.h"
#include "comm/deadline.h"
#include "comm/reduce.h"
#include "core/env.h"
#include "core/error.h"

namespace mt::comm::shm {

namespace {
constexpr uint64_t kRegionMagic = 0x6d74677270726567ull;

size_t slot_bytes_from_env() {
  if (auto kb = env_int("MESHTRAIN_SHM_SLOT_KB", 4, 65536)) return static_cast<size_t>(*kb) * 1024;
  return kDefaultSlotBytes;
}

size_t chan_bytes_from_env() {
  if (auto kb = env_int("MESHTRAIN_SHM_CHAN_KB", 4, 65536)) return static_cast<size_t>(*kb) * 1024;
  return kChannelBytes;
}

uint64_t init_region(Job& job, int n, int group_id) {
  size_t slot = slot_bytes_from_env(), chan = chan_bytes_from_env();
  uint64_t off = job.allocate(Layout::bytes_for(n, slot, chan));
  auto* h = static_cast<RegionHeader*>(job.at(off));
  h->magic = kRegionMagic;
  h->size = n;
  h->group_id = group_id;
  h->slot_bytes = slot;
  h->chan_bytes = chan;
  return off;
}

// Elements per piece when a slot is cut into `parts` pieces, rounded down to whole cache lines.
size_t piece_elems(size_t slot_bytes, int parts, size_t e) {
  size_t per = slot_bytes / static_cast<size_t>(parts);
  per = per / 64 * 64;
  if (per < 64) per = 64;  // MT_ASSERT in the caller: slots always hold at least 64 bytes per rank
  return per / e;
}

size_t clamp_len(size_t total, size_t start, size_t len) { return start >= total ? 0 : std::min(len, total - start); }
size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }
}  // namespace

// One running collective: its arguments, deadline and whether its descriptor was checked yet.
struct ShmCommunicator::Ctx {
  const CollArgs& a;
  Clock::time_point until;
  bool checked = false;
  size_t e;
};

uint64_t ShmCommunicator::create_region(Job& job, int n) { return init_region(job, n, 0); }

ShmCommunicator::ShmCommunicator(Job* job, uint64_t region, int rank, std::vector<int> world_ranks, std::string name)
    : Communicator(rank, static_cast<int>(world_ranks.size()), std::move(name)), job_(job),
      world_ranks_(std::move(world_ranks)), spin_(spin_policy_for(job->nranks())), spin_now_us_(spin_.spin_us) {
  L_.base = static_cast<char*>(job->at(region));
  const RegionHeader& h = L_.header();
  MT_ASSERT(h.magic == kRegionMagic && h.size == size(), "bad group region: size ", h.size, " vs ", size());
  L_.n = size();
  L_.slot_bytes = h.slot_bytes;
  L_.chan_bytes = h.chan_bytes;
  MT_ASSERT(L_.slot_bytes / size() >= 64, "slot of ", L_.slot_bytes, " bytes too small for ", size(), " ranks");
  cma_ = env_flag("MESHTRAIN_SHM_CMA").value_or(cma_);
  cma_min_ = cma_gather_min_bytes(job->block().bind_width > 0);
  // Bound ranks (each on CPUs of its own) spin in the single-copy waits as in the others, unbound ones yield at once
  // (see cma_spin_ in shm_comm.h).
  cma_spin_ = job->block().bind_width > 0 ? SpinPolicy{spin_.spin_us, spin_.yield_us, false}
                                          : SpinPolicy{0, spin_.spin_us + spin_.yield_us};
  // MESHTRAIN_SHM_CMA_SPIN="spin_us,yield_us" overrides the single-copy waits' policy (A/B experiments only).
  if (auto v = env_int_pair("MESHTRAIN_SHM_CMA_SPIN")) cma_spin_ = SpinPolicy{v->first, v->second, false};
  const long slow_kb = env_int("MESHTRAIN_SHM_CMA_SLOW_KB", 0, 1L << 30).value_or(long(cma_min_ / 1024));
  cma_mid_ = std::min(cma_min_, size_t(slow_kb) * 1024);
  env_flag("MESHTRAIN_SHM_STREAM");  // checked here, before any collective; read by each thread's copy_in_policy
  L_.ctrl(rank).world_rank = world_ranks_[rank];
  L_.ctrl(rank).pid = getpid();
  p2p_ = std::make_unique<P2P>(L_, rank, spin_, [this](int peer, const std::string& what, Clock::time_point until,
                                                      const std::function<bool()>& arrived) {
    poll_failure(peer, what, until, timeout(), arrived);
  });
}

ShmCommunicator::~ShmCommunicator() { stop_progress_thread(); }

// ---- waiting ----

void ShmCommunicator::fail_wait(const std::string& what, int peer, const std::string& reason) {
  throw CommError(str(what, " on group '", name(), "' (rank ", rank(), " of ", size(), "): ", reason));
}

void ShmCommunicator::poll_failure(int peer, const std::string& what, Clock::time_point until, double timeout_s,
                                   const std::function<bool()>& arrived) {
  job_->note_wait(world_ranks_[rank()], world_ranks_[peer]);
  const std::string peer_s = str("rank ", peer, " (world rank ", world_ranks_[peer], ")");
  // The supervisor records a failure before it marks the failed worker as exited, so read the exit mark
  // first: if the peer is marked, a failure it caused is visible to the check after it.
  int st = 0;
  const bool peer_ended = job_->exited(world_ranks_[peer], &st);
  int failed = -1;
  std::string why;
  if (job_->failed(&failed, &why)) {
    if (failed == world_ranks_[rank()]) fail_wait(what, peer, "stopped by an earlier failure of this rank");
    fail_wait(what, peer, str("aborted while waiting for ", peer_s, ": world rank ", failed, " failed: ", why));
  }
  if (peer_ended && arrived && arrived()) return;  // it did its part before ending; the caller sees it next
  if (peer_ended) {
    fail_wait(what, peer, str(peer_s, " has already ended (",
                              WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "its body returned" : "it failed",
                              ") without taking part in this operation"));
  }
  if (Clock::now() > until) {
    throw CommTimeoutError(str(what, " on group '", name(), "' (rank ", rank(), " of ", size(), "): timed out after ",
                               timeout_s, " s waiting for ", peer_s,
                               "; that rank is stalled, dead, or not calling this operation (--comm-timeout)"),
                           world_ranks_[peer]);
  }
}

void ShmCommunicator::wait_step(Ctx& c, int peer, uint32_t step) {
  Signal& s = L_.ctrl(peer).arrive;
  if (reached(s.value.load(std::memory_order_acquire), step)) return;
  auto poll = [&] {
    // A peer may arrive and then end between signal_wait's check and this poll: poll_failure reads its exit
    // mark first, then asks whether it arrived, before blaming it.
    poll_failure(peer, describe(c.a), c.until, c.a.timeout_s,
                 [&] { return reached(s.value.load(std::memory_order_seq_cst), step); });
  };
  if (cma_waits_ || !spin_.adaptive) {
    signal_wait(s, step, cma_waits_ ? cma_spin_ : spin_, poll);
    return;
  }
  const auto t0 = Clock::now();
  signal_wait(s, step, SpinPolicy{spin_now_us_, spin_.yield_us}, poll);
  const double waited_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  spin_now_us_ = next_spin_us(spin_now_us_, spin_.spin_us, waited_us);
}

void ShmCommunicator::arrive() {
  ++step_;
  signal_store(L_.ctrl(rank()).arrive, step_);
}

void ShmCommunicator::await_peers(Ctx& c) {
  for (int p = 0; p < size(); ++p) {
    if (p != rank()) wait_step(c, p, step_);
  }
  if (!c.checked) check_descriptors(c);
}

void ShmCommunicator::sync(Ctx& c) {
  arrive();
  await_peers(c);
}

int ShmCommunicator::acquire_buf(Ctx& c) {
  int b = next_buf_;
  next_buf_ = (next_buf_ + 1) % kNumBuf;
  for (int p = 0; p < size(); ++p) {
    if (p != rank()) wait_step(c, p, release_[b]);
  }
  return b;
}

char* ShmCommunicator::claim_slot(int b, size_t footprint) {
  const size_t f = (footprint + 4095) / 4096 * 4096;
  size_t at = 0;
  if (2 * f <= L_.slot_bytes) {
    at = cursor_[b];
    if (at + f > L_.slot_bytes) at = 0;
    cursor_[b] = at + f;
  }
  L_.ctrl(rank()).slot_off[b] = at;
  return L_.slot(rank(), b) + at;
}

// Readers of buffer b's current contents are done once they arrive at the next step.
void ShmCommunicator::release_buf(int b) { release_[b] = step_ + 1; }

void ShmCommunicator::check_descriptors(Ctx& c) {
  c.checked = true;
  const CollArgs& a = c.a;
  const OpDesc& mine = L_.ctrl(rank()).desc[a.seq & 1];
  for (int p = 0; p < size(); ++p) {
    const OpDesc& d = L_.ctrl(p).desc[a.seq & 1];
    bool same = d.seq == mine.seq && d.kind == mine.kind && d.dtype == mine.dtype && d.count == mine.count &&
                d.op == mine.op && d.root == mine.root;
    if (same) continue;
    CollArgs theirs;
    theirs.kind = static_cast<OpKind>(d.kind);
    theirs.count = d.count;
    theirs.dtype = static_cast<DType>(d.dtype);
    theirs.op = static_cast<ReduceOp>(d.op);
    theirs.root = d.root;
    theirs.seq = d.seq;
    throw CommError(str("mismatched collectives on group '", name(), "': rank ", rank(), " called ", describe(a),
                        " but rank ", p, " (world rank ", world_ranks_[p], ") called ", describe(theirs),
                        "; every rank of a group must issue the same collectives in the same order"));
  }
}

// ---- dispatch ----

void ShmCommunicator::run_collective(const CollArgs& a) {
  auto until = deadline_after<Clock>(a.timeout_s);
  Ctx c{a, until, false, dtype_size(a.dtype)};
  OpDesc& d = L_.ctrl(rank()).desc[a.seq & 1];
  d.seq = a.seq;
  d.kind = static_cast<uint8_t>(a.kind);
  d.dtype = static_cast<uint8_t>(a.dtype);
  bool reducing = a.kind == OpKind::all_reduce || a.kind == OpKind::reduce || a.kind == OpKind::reduce_scatter;
  d.op = reducing ? static_cast<uint8_t>(a.op) : 0;
  d.count = a.kind == OpKind::all_to_all_v ? 0 : a.count;
  d.root = (a.kind == OpKind::broadcast || a.kind == OpKind::reduce) ? a.root : 0;
  switch (a.kind) {
    case OpKind::all_reduce:
    case OpKind::reduce: {
      Algo algo = a.algo;
      if (algo == Algo::automatic) algo = a.count * c.e <= kDirectMaxBytes || size() == 1 ? Algo::direct : Algo::rs_ag;
      if (algo == Algo::direct) {
        all_reduce_direct(c);
      } else {
        all_reduce_rs_ag(c);
      }
      break;
    }
    case OpKind::reduce_scatter: reduce_scatter(c); break;
    case OpKind::all_gather: all_gather(c); break;
    case OpKind::broadcast: broadcast(c); break;
    case OpKind::all_to_all: all_to_all(c); break;
    case OpKind::all_to_all_v: all_to_all_v(c); break;
    case OpKind::barrier: barrier(c); break;
    default: MT_ASSERT(false, "not a collective: ", op_kind_name(a.kind));
  }
}

// ---- algorithms ----

void ShmCommunicator::barrier(Ctx& c) { sync(c); }

void ShmCommunicator::all_reduce_direct(Ctx& c) {
  const CollArgs& a = c.a;
  const int n = size(), r = rank();
  const bool writes = a.kind == OpKind::all_reduce || r == a.root;
  const size_t C = L_.slot_bytes / c.e;
  const size_t T = std::max<size_t>(1, ceil_div(a.count, C));
  std::vector<const void*> srcs(n);
  for (size_t t = 0; t < T; ++t) {
    const size_t off = t * C, k = clamp_len(a.count, off, C);
    int b = acquire_buf(c);
    char* mine = claim_slot(b, k * c.e);
    if (k) copy_in(mine, static_cast<const char*>(a.send) + off * c.e, k * c.e);
    sync(c);
    if (writes && k) {
      for (int p = 0; p < n; ++p) srcs[p] = peer_slot(p, b);
      // My own part from send (in my cache), not from my slot (which streaming stores left in DRAM); the
      // same values in the same order, so every rank still gets the same bits.
      srcs[r] = static_cast<const char*>(a.send) + off * c.e;
      reduce_into(static_cast<char*>(a.recv) + off * c.e, srcs.data(), n, k, a.dtype, a.op, n);
    }
    release_buf(b);
  }
}

// Chunk t holds, for every rank q, elements [t*c, (t+1)*c) of q's shard; rank r reduces piece r.
void ShmCommunicator::all_reduce_rs_ag(Ctx& c) {
  const CollArgs& a = c.a;
  const int n = size(), r = rank();
  const bool all = a.kind == OpKind::all_reduce;
  const bool stream = a.count * c.e >= kStreamMinBytes;
  const size_t pc = piece_elems(L_.slot_bytes, n, c.e);
  const size_t T = std::max<size_t>(1, ceil_div(shard_of(a.count, n, 0).count, pc));
  // One chunk: pieces packed to the largest shard, so the slot rotates (claim_slot).
  const size_t pb = T == 1 ? (shard_of(a.count, n, 0).count * c.e + 63) / 64 * 64 : pc * c.e;
  const char* send = static_cast<const char*>(a.send);
  char* recv = static_cast<char*>(a.recv);
  std::vector<const void*> srcs(n);
  for (size_t t = 0; t < T; ++t) {
    int b = acquire_buf(c);
    char* mine = claim_slot(b, size_t(n) * pb);
    // Piece r of my slot is read by nobody but me: I reduce my own part straight from send.
    for (int q = 0; q < n; ++q) {
      Shard s = shard_of(a.count, n, q);
      size_t k = clamp_len(s.count, t * pc, pc);
      if (k && q != r) copy_in(mine + q * pb, send + (s.offset + t * pc) * c.e, k * c.e);
    }
    sync(c);
    Shard s = shard_of(a.count, n, r);
    size_t k = clamp_len(s.count, t * pc, pc);
    if (k) {
      for (int p = 0; p < n; ++p) srcs[p] = peer_slot(p, b) + r * pb;
      srcs[r] = send + (s.offset + t * pc) * c.e;
      if (all || r == a.root) {
        // Reduced straight into my output (it stays in my cache); the peers get a copy in my slot.
        char* out = recv + (s.offset + t * pc) * c.e;
        reduce_into(out, srcs.data(), n, k, a.dtype, a.op, n);
        if (all) copy_in(mine + r * pb, out, k * c.e);
      } else {
        reduce_into(mine + r * pb, srcs.data(), n, k, a.dtype, a.op, n, copy_in_policy().streaming());
      }
    }
    sync(c);
    if (all || r == a.root) {
      for (int q = 0; q < n; ++q) {
        Shard sq = shard_of(a.count, n, q);
        size_t kq = clamp_len(sq.count, t * pc, pc);
        if (kq && q != r) copy_bytes(recv + (sq.offset + t * pc) * c.e, peer_slot(q, b) + q * pb, kq * c.e, stream);
      }
    }
    release_buf(b);
  }
  if (stream) stream_fence();
}

void ShmCommunicator::reduce_scatter(Ctx& c) {
  const CollArgs& a = c.a;
  const int n = size(), r = rank();
  const size_t pc = piece_elems(L_.slot_bytes, n, c.e);
  const size_t T = std::max<size_t>(1, ceil_div(shard_of(a.count, n, 0).count, pc));
  const size_t pb = T == 1 ? (shard_of(a.count, n, 0).count * c.e + 63) / 64 * 64 : pc * c.e;  // as rs_ag
  const char* send = static_cast<const char*>(a.send);
  std::vector<const void*> srcs(n);
  const Shard mine_s = shard_of(a.count, n, r);
  for (size_t t = 0; t < T; ++t) {
    int b = acquire_buf(c);
    char* mine = claim_slot(b, size_t(n) * pb);
    for (int q = 0; q < n; ++q) {
      Shard s = shard_of(a.count, n, q);
      size_t k = clamp_len(s.count, t * pc, pc);
      if (k && q != r) copy_in(mine + q * pb, send + (s.offset + t * pc) * c.e, k * c.e);
    }
    sync(c);
    size_t k = clamp_len(mine_s.count, t * pc, pc);
    if (k) {
      for (int p = 0; p < n; ++p) srcs[p] = peer_slot(p, b) + r * pb;
      srcs[r] = send + (mine_s.offset + t * pc) * c.e;
      reduce_into(static_cast<char*>(a.recv) + t * pc * c.e, srcs.data(), n, k, a.dtype, a.op, n);
    }
    release_buf(b);
  }
}

void ShmCommunicator::all_gather(Ctx& c) {
  const CollArgs& a = c.a;
  const int n = size(), r = rank();
  if (cma_ && n > 1 && a.count * c.e >= cma_min_) {
    if (all_gather_cma(c, false)) return;
  }
  // The middle sizes (opt-in, see cma_mid_) ask every rank first: the flags ride with the first chunk.
  const bool ask = cma_ && n > 1 && a.count * c.e >= cma_mid_ && a.count * c.e < cma_min_;
  const bool wants = ask && copy_in_policy().streaming();
  const size_t C = L_.slot_bytes / c.e;
  const size_t T = std::max<size_t>(1, ceil_div(shard_of(a.count, n, 0).count, C));
  const Shard own = shard_of(a.count, n, r);
  const char* send = static_cast<const char*>(a.send);
  char* recv = static_cast<char*>(a.recv);
  const bool in_place = a.send == recv + own.offset * c.e;
  const bool stream = a.count * c.e >= kStreamMinBytes;
  for (size_t t = 0; t < T; ++t) {
    int b = acquire_buf(c);
    size_t k = clamp_len(own.count, t * C, C);
    char* mine = claim_slot(b, k * c.e);
    if (ask && t == 0) publish_cma(c, wants);
    if (k && !(wants && t == 0)) copy_in(mine, send + t * C * c.e, k * c.e);
    arrive();
    // My own shard goes straight from send to recv while the peers are still writing their slots.
    if (k && !in_place) copy_bytes(recv + (own.offset + t * C) * c.e, send + t * C * c.e, k * c.e, stream);
    await_peers(c);
    if (ask && t == 0 && any_wants_cma(c)) {
      release_buf(b);
      if (!all_gather_cma(c, true)) all_gather(c);  // a failed copy turns single copy off on every rank
      if (stream) stream_fence();
      return;
    }
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      Shard s = shard_of(a.count, n, q);
      size_t kq = clamp_len(s.count, t * C, C);
      if (kq) copy_bytes(recv + (s.offset + t * C) * c.e, peer_slot(q, b), kq * c.e, stream);
    }
    release_buf(b);
  }
  if (stream) stream_fence();
}

// Broadcast is the one asymmetric collective (the root copies in, the others copy out), so its chunks are
// what lets the two sides work at once: with T chunks of C bytes the time is about (S + C) / copy rate + T
// steps, least at C = sqrt(S * rate * step) ~ sqrt(S * kPipeBytes) (rate ~20 GB/s, step ~0.5-1 us), cut
// to [kPipeMinBytes, slot]. Up to kPipeMinBytes one chunk: the message is latency-bound.
size_t ShmCommunicator::broadcast_chunk_elems(size_t count, size_t e) const {
  constexpr double kPipeBytes = 16 * 1024;
  constexpr size_t kPipeMinBytes = 32 * 1024;
  const size_t S = count * e;
  if (S <= kPipeMinBytes) return std::max<size_t>(1, L_.slot_bytes / e);
  size_t c = static_cast<size_t>(std::sqrt(double(S) * kPipeBytes));
  c = std::min(std::max((c + 4095) / 4096 * 4096, kPipeMinBytes / 2), L_.slot_bytes);
  return std::max<size_t>(1, c / e);
}

// Two steps: every rank publishes its buffer's address and arrives; then the message is cut in two at a page
// boundary near S(n-1)/n: each other rank reads the head from the root with process_vm_readv while the root
// writes the tail, S/n, into each of them with process_vm_writev, so all cores copy at once (the kernel pins
// the remote pages and copies: ~11-13 GB/s for one copy on this work's EPYC host, against ~9 GB/s for the
// staged pipeline, whose copy-out reads lines the root has just written). Each rank notes whether its copies
// worked and arrives at the second step, after which every buffer may be reused. Everyone reads every rank's
// note after that step, so all of them agree on falling back to the staged path.
bool ShmCommunicator::broadcast_cma(Ctx& c) {
  CmaWaits yielding(this);
  const CollArgs& a = c.a;
  const int n = size(), r = rank();
  const size_t bytes = a.count * c.e;
  const size_t tail = bytes / size_t(n) / 4096 * 4096, head = bytes - tail;
  char* buf = static_cast<char*>(a.recv);
  RankCtrl& me = L_.ctrl(r);
  me.cma_failed = 0;
  me.cma_addr = reinterpret_cast<uint64_t>(buf);
  sync(c);
  bool ok = true;
  if (r == a.root) {
    for (int p = 0; p < n && tail; ++p) {
      if (p != r) ok = ok && cma_copy(L_.ctrl(p).pid, buf + head, L_.ctrl(p).cma_addr + head, tail, true);
    }
  } else {
    ok = read_peer(L_.ctrl(a.root).pid, buf, L_.ctrl(a.root).cma_addr, head);
  }
  me.cma_failed = ok ? 0 : 1;
  sync(c);
  for (int p = 0; p < n; ++p) {
    if (L_.ctrl(p).cma_failed) cma_ = false;
  }
  return cma_;
}

// The middle sizes' question, asked before the first step of the staged path: this rank's flag (single copy
// wanted, or vetoed because this rank runs in place) and its send buffer's address, by the collective's seq
// parity (a peer may be one collective ahead and write its next flag while this one is read). After that step,
// any_wants_cma gives every rank the same answer: some rank wants it and none vetoed.
void ShmCommunicator::publish_cma(Ctx& c, bool wants, bool veto) {
  RankCtrl& me = L_.ctrl(rank());
  me.cma_addr = reinterpret_cast<uint64_t>(c.a.send);
  me.cma_want[c.a.seq & 1] = veto ? 2 : wants ? 1 : 0;
}

bool ShmCommunicator::any_wants_cma(Ctx& c) const {
  bool any = false;
  for (int p = 0; p < size(); ++p) {
    const uint32_t w = L_.ctrl(p).cma_want[c.a.seq & 1];
    if (w == 2) return false;
    any = any || w == 1;
  }
  return any;
}

// Single copy for all_gather: every rank publishes where its shard is (the send buffer, also in place) and
// arrives; then each reads every peer's shard straight into its output with process_vm_readv and copies its
// own; the second step keeps every shard valid until all have read it. Per rank: S/n own + (n-1)S/n through
// the kernel, against S/n in + S/n own + (n-1)S/n out through the slots. Same agreement on falling back as
// broadcast_cma.
bool ShmCommunicator::all_gather_cma(Ctx& c, bool published) {
  CmaWaits yielding(this);
  const CollArgs& a = c.a;
  const int n = size(), r = rank();
  const Shard own = shard_of(a.count, n, r);
  char* recv = static_cast<char*>(a.recv);
  RankCtrl& me = L_.ctrl(r);
  if (!published) {
    me.cma_addr = reinterpret_cast<uint64_t>(a.send);
    sync(c);
  }
  bool ok = true;
  for (int i = 1; i < n && ok; ++i) {
    const int q = (r + i) % n;  // start at the next rank: the ranks' reads spread over the peers
    const Shard s = shard_of(a.count, n, q);
    if (s.count) ok = read_peer(L_.ctrl(q).pid, recv + s.offset * c.e, L_.ctrl(q).cma_addr, s.count * c.e);
  }
  if (ok && a.send != recv + own.offset * c.e && own.count) {
    copy_in_pieces(recv + own.offset * c.e, a.send, own.count * c.e);
  }
  me.cma_failed = ok ? 0 : 1;
  sync(c);
  for (int p = 0; p < n; ++p) {
    if (L_.ctrl(p).cma_failed) cma_ = false;
  }
  return cma_;
}

// Single copy for all_to_all out of place: rank r reads block r of every peer's send buffer into block q of
// its output. (In place a peer overwrites its send buffer while the others read it: staged path.)
bool ShmCommunicator::all_to_all_cma(Ctx& c, bool published) {
  CmaWaits yielding(this);
  const CollArgs& a = c.a;
  const int n = size(), r = rank();
  const size_t block = a.count * c.e;
  char* recv = static_cast<char*>(a.recv);
  const char* send = static_cast<const char*>(a.send);
  RankCtrl& me = L_.ctrl(r);
  if (!published) {
    me.cma_addr = reinterpret_cast<uint64_t>(send);
    sync(c);
  }
  bool ok = true;
  for (int i = 1; i < n && ok; ++i) {
    const int q = (r + i) % n;
    ok = read_peer(L_.ctrl(q).pid, recv + q * block, L_.ctrl(q).cma_addr + r * block, block);
  }
  if (ok) copy_in_pieces(recv + r * block, send + r * block, block);
  me.cma_failed = ok ? 0 : 1;
  sync(c);
  for (int p = 0; p < n; ++p) {
    if (L_.ctrl(p).cma_failed) cma_ = false;
  }
  return cma_;
}

void ShmCommunicator::broadcast(Ctx& c) {
  const CollArgs& a = c.a;
  const int r = rank();
  if (cma_ && size() > 1 && a.count * c.e >= kCmaBroadcastMinBytes && broadcast_cma(c)) return;
  const size_t C = broadcast_chunk_elems(a.count, c.e);
  const size_t T = std::max<size_t>(1, ceil_div(a.count, C));
  char* buf = static_cast<char*>(a.recv);
  const bool stream = a.count * c.e >= kStreamMinBytes && r != a.root;
  for (size_t t = 0; t < T; ++t) {
    int b = acquire_buf(c);
    size_t k = clamp_len(a.count, t * C, C);
    if (r == a.root) {
      char* mine = claim_slot(b, k * c.e);
      if (k) copy_in(mine, buf + t * C * c.e, k * c.e);
    }
    sync(c);
    if (r != a.root && k) copy_bytes(buf + t * C * c.e, peer_slot(a.root, b), k * c.e, stream);
    release_buf(b);
  }
  if (stream) stream_fence();
}

size_t cma_gather_min_bytes(bool bound) {
  const size_t fallback = bound ? kCmaGatherMinBytesBound : kCmaGatherMinBytes;
  return size_t(env_int("MESHTRAIN_SHM_CMA_GATHER_KB", 0, 1L << 30).value_or(long(fallback / 1024))) * 1024;
}

// A slot cut into n-1 pieces, one per other rank: piece_index(me, q) holds my block for rank q.
int ShmCommunicator::piece_index(int owner, int q) { return q < owner ? q : q - 1; }

void ShmCommunicator::all_to_all(Ctx& c) {
  const CollArgs& a = c.a;
  const int n = size(), r = rank();
  const size_t pc = piece_elems(L_.slot_bytes, std::max(n - 1, 1), c.e);
  const size_t K = a.count;
  const size_t T = std::max<size_t>(1, ceil_div(K, pc));
  const size_t pb = T == 1 ? (K * c.e + 63) / 64 * 64 : pc * c.e;  // one chunk: packed, the slot rotates
  const char* send = static_cast<const char*>(a.send);
  char* recv = static_cast<char*>(a.recv);
  const bool in_place = a.send == a.recv;
  if (cma_ && n > 1 && !in_place && K * n * c.e >= cma_min_ && all_to_all_cma(c, false)) return;
  const bool stream = K * n * c.e >= kStreamMinBytes;
  // The middle sizes (opt-in, see cma_mid_) ask every rank first. A rank in place vetoes; a rank that wants single
  // copy still writes its first chunk, so that a veto finds the staged data there.
  const bool ask = cma_ && n > 1 && K * n * c.e >= cma_mid_ && K * n * c.e < cma_min_;
  const bool wants = ask && !in_place && copy_in_policy().streaming();
  for (size_t t = 0; t < T; ++t) {
    int b = acquire_buf(c);
    size_t k = clamp_len(K, t * pc, pc);
    char* mine = claim_slot(b, size_t(std::max(n - 1, 1)) * pb);
    if (ask && t == 0) publish_cma(c, wants, in_place);
    for (int q = 0; q < n && k; ++q) {
      if (q != r) copy_in(mine + piece_index(r, q) * pb, send + (q * K + t * pc) * c.e, k * c.e);
    }
    arrive();
    // My own block goes straight from send to recv (in place it is already there) while peers catch up.
    if (k && !in_place) copy_bytes(recv + (r * K + t * pc) * c.e, send + (r * K + t * pc) * c.e, k * c.e, stream);
    await_peers(c);
    if (ask && t == 0 && any_wants_cma(c)) {
      release_buf(b);
      if (!all_to_all_cma(c, true)) all_to_all(c);  // a failed copy turns single copy off on every rank
      if (stream) stream_fence();
      return;
    }
    for (int p = 0; p < n && k; ++p) {
      if (p != r) copy_bytes(recv + (p * K + t * pc) * c.e, peer_slot(p, b) + piece_index(p, r) * pb, k * c.e, stream);
    }
    release_buf(b);
  }
  if (stream) stream_fence();
}

// The counts travel with the first chunk: every rank writes its row (send counts, recv counts, send offsets,
// a flag word and its send buffer's address) at the head of its slot, so checking the matrix costs no extra
// step. Slots too small for the row and one cache line per peer (tiny test slots, many ranks) exchange the
// rows in a step of their own first.
// Single copy: a rank whose whole send buffer (all its counts) holds cma_gather_min_bytes or more raises
// kWantsCma in its row and writes no blocks into its slot; after the first step every rank sees every row,
// and if any rank raised it, all of them read their blocks straight from the peers' send buffers
// (all_to_all_v_cma). With even counts this is all_to_all's rule (its send buffer against the same threshold).
void ShmCommunicator::all_to_all_v(Ctx& c) {
  const CollArgs& a = c.a;
  const int n = size(), r = rank();
  const size_t W = 3 * size_t(n) + 2;  // row words: send counts, recv counts, send offsets, flags, address
  const size_t row_bytes = W * sizeof(uint64_t);
  const size_t meta = (row_bytes + 63) / 64 * 64;
  // With ordinary slots and a row that fits in kSlotPad (up to 12 ranks) the row rides in the pad after the
  // slot, so the blocks start at the slot's head and a block of a full slot still goes in one chunk (2 ranks,
  // 1 MB: 60 -> 35 us, as all_to_all). Small slots (tests) keep it at the head.
  const bool pad_row = row_bytes <= kSlotPad && L_.slot_bytes >= 64 * 1024;
  const bool inline_counts = pad_row || L_.slot_bytes >= meta + size_t(std::max(n - 1, 1)) * 64;
  auto row_at = [&](int p, int b) { return pad_row ? L_.slot(p, b) + L_.slot_bytes : peer_slot(p, b); };
  std::vector<uint64_t> row(W), M(W * size_t(n));
  std::vector<size_t> soff(n), roff(n);
  size_t stot = 0, rtot = 0;
  for (int j = 0; j < n; ++j) {
    soff[j] = a.send_offsets ? a.send_offsets[j] : stot;
    roff[j] = a.recv_offsets ? a.recv_offsets[j] : rtot;
    stot += a.send_counts[j];
    rtot += a.recv_counts[j];
  }
  const bool wants_cma =
      cma_ && n > 1 && (stot * c.e >= cma_min_ || (stot * c.e >= cma_mid_ && copy_in_policy().streaming()));
  for (int j = 0; j < n; ++j) {
    row[j] = a.send_counts[j];
    row[n + j] = a.recv_counts[j];
    row[2 * n + j] = soff[j];
  }
  row[3 * n] = (wants_cma ? kWantsCma : 0) | (cma_ ? 0 : kNoCma);
  // A rank that will read by single copy also yields at once in the first step (see cma_spin_): spinning there cost
  // a whole spin per call (2 ranks, 32 KB - 1 MB: 311-401 us against 12-100 us for all_to_all).
  std::optional<CmaWaits> yielding;
  if (wants_cma) yielding.emplace(this);
  row[3 * n + 1] = reinterpret_cast<uint64_t>(a.send);
  const size_t head = inline_counts && !pad_row ? meta : 0;
  if (!inline_counts) exchange(c, row.data(), row_bytes, M.data());
  const size_t pc = piece_elems(L_.slot_bytes - head, std::max(n - 1, 1), c.e);
  // My piece stride: packed to my largest block when all of it fits in one chunk (then the slot rotates,
  // see claim_slot), else the full piece. Published per buffer in RankCtrl::slot_stride for the readers.
  size_t most_sent = 0;
  for (int q = 0; q < n; ++q) {
    if (q != r) most_sent = std::max(most_sent, a.send_counts[q]);
  }
  const size_t pb = most_sent <= pc ? (most_sent * c.e + 63) / 64 * 64 : pc * c.e;
  const char* send = static_cast<const char*>(a.send);
  char* recv = static_cast<char*>(a.recv);
  // Every rank checks the whole matrix, so all of them throw together on a mismatch, and all of them take the
  // same path (single copy or staged) from the same flags.
  struct Plan {
    uint64_t most, total;
    bool cma;
  };
  auto check = [&] {
    auto sends = [&](int p, int q) { return M[size_t(p) * W + q]; };
    auto expects = [&](int q, int p) { return M[size_t(q) * W + n + p]; };
    Plan plan{0, 0, false};
    bool off = false;
    for (int p = 0; p < n; ++p) {
      for (int q = 0; q < n; ++q) {
        if (sends(p, q) != expects(q, p)) {
          throw CommError(str("mismatched ", describe(a), " on group '", name(), "': rank ", p, " sends ", sends(p, q),
                              " elements to rank ", q, " but rank ", q, " expects ", expects(q, p), " from rank ", p));
        }
        if (p != q) plan.most = std::max(plan.most, sends(p, q));
        plan.total += sends(p, q);
      }
      const uint64_t flags = M[size_t(p) * W + 3 * n];
      plan.cma = plan.cma || (flags & kWantsCma);
      off = off || (flags & kNoCma);
    }
    // cma_ changes on every rank of a group together (a failed copy is seen by all), so no rank that wrote no
    // blocks can meet one that cannot read them.
    MT_ASSERT(!(plan.cma && off), "all_to_all_v on group '", name(), "': ranks disagree on single copy");
    return plan;
  };
  size_t T = 1;  // known after the counts are: every rank computes the same number from the same matrix
  bool stream = false;
  // My own block, straight from send to recv (before the matrix is checked only as much as both sides hold:
  // a mismatch throws right after, and the receive buffer is undefined after an error).
  // Streaming is only a store hint, so this rank decides it for its own block from what it receives (as
  // all_to_all streams its own block of a large message; 256 MB with cached stores ran at 0.95x OpenMPI).
  const bool own_stream = rtot * c.e >= kStreamMinBytes;
  auto copy_own = [&] {
    size_t k = std::min(a.send_counts[r], a.recv_counts[r]);
    if (k && own_stream) copy_bytes(recv + roff[r] * c.e, send + soff[r] * c.e, k * c.e, true);
    if (k && !own_stream) copy_in_pieces(recv + roff[r] * c.e, send + soff[r] * c.e, k * c.e);
  };
  // After a failed single copy cma_ is off on every rank, and the call runs again staged.
  auto single_copy = [&] {
    if (!all_to_all_v_cma(c, M.data(), W, roff.data())) all_to_all_v(c);
    if (own_stream) stream_fence();
  };
  if (!inline_counts) {
    const Plan plan = check();
    copy_own();
    if (plan.cma) return single_copy();
    T = ceil_div(plan.most, pc);
    stream = plan.total * c.e >= kStreamMinBytes * size_t(n);
  }
  for (size_t t = 0; t < T; ++t) {
    int b = acquire_buf(c);
    char* mine = claim_slot(b, head + size_t(std::max(n - 1, 1)) * pb);
    L_.ctrl(r).slot_stride[b] = pb;
    if (inline_counts && t == 0) std::memcpy(row_at(r, b), row.data(), row_bytes);
    for (int q = 0; q < n && !(t == 0 && wants_cma); ++q) {
      size_t k = clamp_len(a.send_counts[q], t * pc, pc);
      if (k && q != r) copy_in(mine + head + piece_index(r, q) * pb, send + (soff[q] + t * pc) * c.e, k * c.e);
    }
    arrive();
    if (inline_counts && t == 0) copy_own();
    await_peers(c);
    if (inline_counts && t == 0) {
      for (int p = 0; p < n; ++p) std::memcpy(&M[size_t(p) * W], row_at(p, b), row_bytes);
      const Plan plan = check();
      if (plan.cma) {
        release_buf(b);
        return single_copy();
      }
      T = std::max<size_t>(1, ceil_div(plan.most, pc));
      stream = plan.total * c.e >= kStreamMinBytes * size_t(n);
    }
    for (int p = 0; p < n; ++p) {
      size_t k = clamp_len(a.recv_counts[p], t * pc, pc);
      if (k && p != r) {
        const char* from = peer_slot(p, b) + head + piece_index(p, r) * L_.ctrl(p).slot_stride[b];
        copy_bytes(recv + (roff[p] + t * pc) * c.e, from, k * c.e, stream);
      }
    }
    release_buf(b);
  }
  if (stream || own_stream) stream_fence();
}

// Single copy for all_to_all_v, after the rows are known (M: n rows of W words, as all_to_all_v writes them):
// rank r reads rank q's block for r from q's send buffer (q's address plus q's offset for r) into its
// receive buffer; its own block is already copied. The step after the reads keeps every send buffer valid
// until all have read. Same agreement on falling back as broadcast_cma.
bool ShmCommunicator::all_to_all_v_cma(Ctx& c, const uint64_t* M, size_t W, const size_t* roff) {
  CmaWaits yielding(this);
  const CollArgs& a = c.a;
  const int n = size(), r = rank();
  char* recv = static_cast<char*>(a.recv);
  bool ok = true;
  for (int i = 1; i < n && ok; ++i) {
    const int q = (r + i) % n;  // start at the next rank: the ranks' reads spread over the peers
    const uint64_t* row = M + size_t(q) * W;
    const size_t k = a.recv_counts[q];
    if (k) ok = read_peer(L_.ctrl(q).pid, recv + roff[q] * c.e, row[3 * n + 1] + row[2 * n + r] * c.e, k * c.e);
  }
  RankCtrl& me = L_.ctrl(r);
  me.cma_failed = ok ? 0 : 1;
  sync(c);
  for (int p = 0; p < n; ++p) {
    if (L_.ctrl(p).cma_failed) cma_ = false;
  }
  return cma_;
}

void ShmCommunicator::exchange(Ctx& c, const void* mine, size_t bytes, void* all) {
  MT_ASSERT(bytes <= L_.slot_bytes, "exchange of ", bytes, " bytes exceeds a slot");
  int b = acquire_buf(c);
  copy_in(L_.slot(rank(), b), mine, bytes);
  sync(c);
  for (int p = 0; p < size(); ++p) std::memcpy(static_cast<char*>(all) + p * bytes, L_.slot(p, b), bytes);
  release_buf(b);
}

// ---- split ----

std::unique_ptr<Communicator> ShmCommunicator::run_split(int colour, int key, const std::string& name, uint64_t seq,
                                                         double timeout_s) {
  CollArgs a;
  a.kind = OpKind::split;
  a.seq = seq;
  a.timeout_s = timeout_s;
  auto until = deadline_after<Clock>(timeout_s);
  Ctx c{a, until, false, 1};
  OpDesc& d = L_.ctrl(rank()).desc[seq & 1];
  d = OpDesc{};
  d.seq = seq;
  d.kind = static_cast<uint8_t>(OpKind::split);
  const int n = size();
  // Step 1: everyone learns every (colour, key).
  int64_t mine[2] = {colour, key};
  std::vector<int64_t> all(2 * n);
  exchange(c, mine, sizeof mine, all.data());
  std::vector<int> members;  // parent ranks in the new group, in new-rank order
  if (colour >= 0) {
    for (int p = 0; p < n; ++p) {
      if (all[2 * p] == colour) members.push_back(p);
    }
    std::stable_sort(members.begin(), members.end(), [&](int x, int y) { return all[2 * x + 1] < all[2 * y + 1]; });
  }
  // Step 2: each group's leader (new rank 0) allocates its region; everyone learns the offsets.
  uint64_t region = 0;
  if (!members.empty() && members[0] == rank()) {
    uint32_t gid = job_->block().next_group.fetch_add(1);
    region = init_region(*job_, static_cast<int>(members.size()), static_cast<int>(gid));
  }
  std::vector<uint64_t> regions(n);
  exchange(c, &region, sizeof region, regions.data());
  if (members.empty()) return nullptr;
  std::vector<int> world;
  int new_rank = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    world.push_back(world_ranks_[members[i]]);
    if (members[i] == rank()) new_rank = static_cast<int>(i);
  }
  std::string nm = name.empty() ? str(this->name(), ".", colour) : name;
  return std::make_unique<ShmCommunicator>(job_, regions[members[0]], new_rank, std::move(world), nm);
}

// ---- point to point ----

Request ShmCommunicator::start_send(const void* buf, size_t bytes, int peer, int tag) {
  return p2p_->isend(buf, bytes, peer, tag, timeout());
}
Request ShmCommunicator::start_recv(void* buf, size_t bytes, int peer, int tag) {
  return p2p_->irecv(buf, bytes, peer, tag, timeout());
}

}  // namespace mt::comm::shm
