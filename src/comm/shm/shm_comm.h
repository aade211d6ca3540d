// ShmCommunicator: the shared-memory backend, for ranks that are processes forked by the launcher on one
// host. Collectives move data through per-rank staging slots in a region of the job arena (see layout.h):
// a rank copies (part of) its input into its own slot, arrives at a step, and peers read the slot directly
// after they see the step; nothing is copied twice. Steps are a per-rank counter every rank of the group
// advances in the same order, so "all ranks reached step s" is n loads of n counters.
//
// Algorithms and costs (n ranks, S bytes, B = slot bytes; "steps" are synchronisations, each about one
// cache-line round trip between cores when the peers are running; copies are per rank):
//   all_reduce / reduce, direct   per chunk of B: copy S in, reduce n inputs. steps ceil(S/B);
//                                 per rank: writes 2S, reads (n+1)S.                   (latency-optimal)
//   all_reduce / reduce, rs_ag    per chunk of B: copy S in; reduce my 1/n piece from n slots; copy n-1
//                                 pieces out. steps 2*ceil(S/B); per rank writes ~2S + S/n, reads ~3S.
//                                 Chunks stay in cache, so DRAM sees ~ read S + write S, like a memcpy
//                                 (outputs >= kStreamMinBytes are written with streaming stores).
//   reduce_scatter                1 step per chunk: copy S in, reduce my piece (reads S from slots).
//   all_gather                    1 step per chunk of B of my shard: copy my shard in (S/n), arrive, copy it
//                                 send -> recv while the peers arrive (skipped in place), then copy the n-1
//                                 other shards out. steps ceil(S/(nB)); copies S + S/n (in place: S).
//   broadcast (staged, see below)  1 step per chunk: root copies in, the others copy out; the two slots
//                                 pipeline it, so the time is about one copy of S + C plus the steps.
//                                 Chunks C ~ sqrt(S * 16 KB) in [16 KB, B] (see broadcast_chunk_elems);
//                                 messages up to 32 KB in one step. copies: S on every rank.
//   all_to_all                    the slot is cut into n-1 pieces, one per other rank. 1 step per chunk:
//                                 copy n-1 blocks in, arrive, my own block send -> recv (skipped in
//                                 place), copy n-1 blocks out. steps ceil((S/n) / (B/(n-1))); copies
//                                 S + (n-1)S/n (in place: 2(n-1)S/n).
//   all_to_all_v                  as all_to_all, each pair with its own length; every rank's count row
//                                 rides at the head of its slot in the first chunk and is checked by all
//                                 after that step (no extra step; slots too small for the row and a cache
//                                 line per peer exchange it in a step of its own first). When some
//                                 rank's send buffer reaches the single-copy threshold, all of them go
//                                 single copy after that first step (all_to_all_v_cma: 2 steps per call).
// Algo::automatic picks direct for messages up to kDirectMaxBytes, rs_ag above. all_gather and all_to_all out of
// place of kCmaGatherMinBytes and more go by single copy (below), and all_to_all_v when any rank sends that much.
//
// Single copy (process_vm_readv/writev, "CMA", which OpenMPI's vader uses above 4 KB) is used for all_gather,
// all_to_all out of place and all_to_all_v (never in place) from kCmaGatherMinBytes (each rank reads its peers'
// shards or blocks straight from their send buffers: 2 steps per call, one copy per byte; all_gather_cma,
// all_to_all_cma, all_to_all_v_cma after its first step), and for broadcasts
// of kCmaBroadcastMinBytes and more: the others read the head of the root's buffer while the root writes the
// tail into theirs (broadcast_cma). A CMA copy pins the remote pages and copies in the kernel: on the AMD EPYC
// KVM host of this work, 1 thread, 11-13 GB/s from 64 KB to 8 MB and 6.8 GB/s at 32 MB, against 40-55 and
// 13 GB/s for memcpy. That beats the staged broadcast (~9 GB/s: its copy-out reads lines the root has just
// written), but not the symmetric collectives, where every rank copies in and out at once through slots that
// stay in cache (all_gather 1-4 MB: ~30 GB/s algbw staged). Where the kernel refuses CMA (ptrace rules,
// seccomp) every rank falls back to staging after the first failed broadcast; MESHTRAIN_SHM_CMA=0 turns it off.
//
// Slot offsets rotate (claim_slot): one-chunk uses of a slot start where the last use ended, so a writer does
// not overwrite lines that a peer has just read (and still holds in its L2).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/copy.h"
#include "comm/shm/job.h"
#include "comm/shm/layout.h"
#include "comm/shm/p2p.h"

namespace mt::comm::shm {

constexpr size_t kDirectMaxBytes = 32 * 1024;
// Broadcasts of at least this many bytes use the single-copy (CMA) path when the kernel allows it.
constexpr size_t kCmaBroadcastMinBytes = 64 * 1024;
// all_gather and all_to_all out of place of at least this many bytes (the whole output) use the single-copy path
// (all_gather_cma, all_to_all_cma): from here the staged path's copies go to DRAM anyway (kStreamMinBytes), where
// it makes three passes per byte to CMA's two, and it synchronises once per slot chunk instead of twice per
// call. Measured on the loaded 2-core host of this work (load average 24-34, 2 ranks, back to back, 32-256 MB):
// all_gather 46-399 ms against 88-722 ms staged, 0.99-1.38x OpenMPI against 0.55-0.70x; all_to_all 1.00-1.38x
// against 0.55-0.89x. Below 16 MB, not measured reliably (noise); the idle-host figures of the staged path (8 MB
// faster cached than streamed, see kStreamMinBytes) argue for keeping it there. MESHTRAIN_SHM_CMA_GATHER_KB
// overrides (tests set 0 to run every size through it); MESHTRAIN_SHM_CMA=0 turns every CMA path off.
constexpr size_t kCmaGatherMinBytes = kStreamMinBytes;
// The same threshold when the job's ranks are bound to CPUs of their own (shm/bind.h; the default when ranks x
// threads fit the allowed CPUs). Unbound, a single-copy call was fast only while the scheduler kept the two ranks on
// different cores; bound, 5 back-to-back pairs on the loaded host put single copy from 32 KB at 1.01-1.13x OpenMPI
// (minimums) at 32-128 KB and at 0.56-0.95 of the copy bound (medians) to 8 MB, against 0.27-0.99 for the staged
// path unbound (bench/results/comm/bind_cma32_ab_loaded_2026-11-27_0452.txt).
constexpr size_t kCmaGatherMinBytesBound = 32 * 1024;
// MESHTRAIN_SHM_CMA_GATHER_KB's value, else kCmaGatherMinBytesBound when the job's ranks are bound, else
// kCmaGatherMinBytes.
size_t cma_gather_min_bytes(bool bound);
// Opt-in (MESHTRAIN_SHM_CMA_SLOW_KB=K): from K KB up to the single-copy threshold, all_gather, all_to_all (out of
// place) and all_to_all_v go single copy when some rank's stores into shared memory are streaming (the host's slow
// regime, see CopyInPolicy in comm/copy.h), where the staged path puts every byte through DRAM twice. The ranks
// ask each other in the first step of the staged path (RankCtrl::cma_want), so all take the same path. Off by
// default: on this work's loaded KVM host (load 8-24 on 2 cores) it won one A/B at 1-8 MB (3 pairs) and lost the
// next two (3 and 4 pairs): process_vm_readv calls then cost a floor of ~600 us at 32 KB-2 MB, cause not found.
constexpr size_t kDefaultSlotBytes = 512 * 1024;  // MESHTRAIN_SHM_SLOT_KB overrides (tuning)
// One directed point-to-point channel. A message crosses in one write only if its 16-byte header and payload fit
// the ring whole: then the send ends in the sender's own call and the receiver's own call reads it, with no
// progress thread on either side (p2p.h). 2 MB + 4 KB holds two 1 MB pipeline activations with their headers;
// a 1 MB ring (the earlier size) missed a 1 MB activation by its header, so every such message woke the
// progress threads of both ranks. MESHTRAIN_SHM_CHAN_KB overrides (tuning, A/B in one build).
constexpr size_t kChannelBytes = 2 * 1024 * 1024 + 4096;

class ShmCommunicator : public Communicator {
 public:
  // Attaches to the group region at `region` in the job arena (all members pass the same offset; the
  // region is zeroed, fresh from the arena). world_ranks[i] is the world rank of group rank i.
  ShmCommunicator(Job* job, uint64_t region, int rank, std::vector<int> world_ranks, std::string name);
  ~ShmCommunicator() override;
  // Allocates and initialises the world region of a job (called by the launcher before forking).
  static uint64_t create_region(Job& job, int n);

  const char* backend() const override { return "shm"; }
  int world_of(int g) const override { return world_ranks_[g]; }

 protected:
  void run_collective(const CollArgs& a) override;
  std::unique_ptr<Communicator> run_split(int colour, int key, const std::string& name, uint64_t seq,
                                          double timeout_s) override;
  Request start_send(const void* buf, size_t bytes, int peer, int tag) override;
  Request start_recv(void* buf, size_t bytes, int peer, int tag) override;

 private:
  struct Ctx;
  // A step: arrive() publishes this rank's next step; await_peers() waits until every peer reached it (and
  // checks the collective's descriptors the first time). sync() is both; work placed between the two
  // overlaps the peers' arrival.
  void arrive();
  void await_peers(Ctx& c);
  void sync(Ctx& c);
  static int piece_index(int owner, int q);
  size_t broadcast_chunk_elems(size_t count, size_t e) const;
  void wait_step(Ctx& c, int peer, uint32_t step);
  int acquire_buf(Ctx& c);
  void release_buf(int b);
  // The writer's side of slot b for a use of `footprint` bytes: uses that fill at most half the slot start
  // where the previous use of b ended (wrapping), and the offset is published in RankCtrl::slot_off for
  // readers. Why: a line a peer has just read sits in that peer's L2, and overwriting it costs a
  // cross-core invalidation per line; measured on this work's EPYC host, all_gather 128 KB went from 10.1 to
  // 5.7 us with the rotation. peer_slot(p, b) is where rank p's data is (p may be this rank).
  char* claim_slot(int b, size_t footprint);
  char* peer_slot(int p, int b) const { return L_.slot(p, b) + L_.ctrl(p).slot_off[b]; }
  void check_descriptors(Ctx& c);
  [[noreturn]] void fail_wait(const std::string& what, int peer, const std::string& reason);
  // Throws CommError when the wait on `peer` must end: a recorded failure, the deadline, or the peer has
  // ended. The peer's exit mark is read first and `arrived` (may be empty) asked after it, so a peer that
  // arrived (or sent) and then ended between the caller's check and this poll is not blamed.
  void poll_failure(int peer, const std::string& what, Clock::time_point until, double timeout_s,
                    const std::function<bool()>& arrived = {});

  void all_reduce_direct(Ctx& c);
  void all_reduce_rs_ag(Ctx& c);
  void reduce_scatter(Ctx& c);
  void all_gather(Ctx& c);
  void broadcast(Ctx& c);
  // Single copy: peers read the root's buffer with process_vm_readv. Returns false (on every rank alike)
  // when some rank could not, and the staged broadcast must run instead.
  bool broadcast_cma(Ctx& c);
  // published: this rank's address is out and the step after it passed (publish_cma on the staged path).
  bool all_gather_cma(Ctx& c, bool published);
  bool all_to_all_cma(Ctx& c, bool published);
  void publish_cma(Ctx& c, bool wants, bool veto = false);
  bool any_wants_cma(Ctx& c) const;
  bool all_to_all_v_cma(Ctx& c, const uint64_t* M, size_t W, const size_t* roff);
  // all_to_all_v's row flags: this rank's send buffer reaches the single-copy threshold; single copy is off here.
  static constexpr uint64_t kWantsCma = 1, kNoCma = 2;
  void all_to_all(Ctx& c);
  void all_to_all_v(Ctx& c);
  void barrier(Ctx& c);
  // One-step exchange of `bytes` per rank through the slots (split uses it): all[p*bytes..] = rank p's.
  void exchange(Ctx& c, const void* mine, size_t bytes, void* all);

  Job* job_;
  Layout L_;
  std::vector<int> world_ranks_;
  SpinPolicy spin_;
  int spin_now_us_ = 0;  // the collectives' adaptive spin (next_spin_us in signal.h), starts at spin_.spin_us
  uint32_t step_ = 0;
  int next_buf_ = 0;
  uint32_t release_[kNumBuf] = {};
  size_t cursor_[kNumBuf] = {};
  bool cma_ = true;  // cleared on every rank after a failed single-copy read (or MESHTRAIN_SHM_CMA=0)
  // Unbound, a waiting rank in the single-copy collectives yields its core at once instead of spinning first: a peer's
  // process_vm_readv/writev of this rank's memory made no progress while this rank spun on this work's 2-vCPU KVM
  // host (cause in the kernel not found), so every wait there cost the whole spin (all_gather 32 KB: 612 us with
  // 300 us of spin, 12 us without; 4 MB: 1506 us against 394 us).
  // That was measured with the ranks free to share a core (perhaps the spinning rank held the core its peer needed).
  // Bound to CPUs of their own (shm/bind.h), they spin as in the other waits (300 us, then yield): back to back on the
  // loaded host (load 6-7, 3 rounds each, 32 KB-16 MB), spinning matched yielding at 32 KB-2 MB (ours/bound medians
  // 0.57-0.99 both) and beat it at 8 MB (all-gather, all-to-all, all-to-all-v 0.95/0.99/1.08 of the bound against
  // 0.83/0.81/0.93); presumably a rank that yields on a busy CPU waits out another process's time slice.
  SpinPolicy cma_spin_{0, 2300};
  bool cma_waits_ = false;
  struct CmaWaits {
    ShmCommunicator* self;
    bool before;
    explicit CmaWaits(ShmCommunicator* s) : self(s), before(s->cma_waits_) { self->cma_waits_ = true; }
    ~CmaWaits() { self->cma_waits_ = before; }
  };
  size_t cma_min_ = kCmaGatherMinBytes;  // cma_gather_min_bytes(), read when the communicator is made
  size_t cma_mid_ = kCmaGatherMinBytes;  // MESHTRAIN_SHM_CMA_SLOW_KB, at most cma_min_; = cma_min_: off
  std::unique_ptr<P2P> p2p_;
};

}  // namespace mt::comm::shm
