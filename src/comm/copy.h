// Bulk copies of the collectives' copy-in and copy-out. From kCopyLoopMinBytes up they run an AVX-512 (or
// AVX2) loop with destination-aligned stores instead of glibc's memcpy: glibc 2.36 copies 2 KB .. L2-size
// messages with `rep movsb`, which on AMD Zen 4 (measured on the EPYC KVM host of this work) drops from
// ~50 GB/s to 1.5-15 GB/s when the source and destination sit at unlucky page offsets relative to each
// other (e.g. malloc'ed buffers at page offset 16 against 64-byte-aligned slots): the shm collectives then
// ran at a flat ~2 GB/s, 1 MB messages 5x slower than 2 MB ones. The loop runs at 35-57 GB/s in cache for
// every offset. Large outputs are written with non-temporal (streaming) stores: the destination is not read
// into the cache first (no read-for-ownership), which cuts DRAM traffic of a copy from 3 passes to 2 when
// the output does not fit in cache anyway. Small outputs stay cached for the caller.
//
// Copies INTO shared memory (collective slots, p2p rings) go through copy_in, which picks ordinary or
// streaming stores at run time. Those lines were last read by the peer, so each sits in the peer core's
// cache and an ordinary store must first take it from there (read-for-ownership). On the EPYC KVM host of
// this work the cost of that comes in three regimes that change every few minutes (the vCPUs' placement on
// the host, apparently; two threads of one process see it as much as two processes). Copy-in + the peer's
// copy-out of 1 MB, ordinary vs streaming stores: fast 21+23 us vs 42+45; medium 73-93+22 vs 37+40; slow
// 445-580+43 vs 38+43 (32 KB: fast 0.6+0.6 vs 1.6+3.0, slow 13.5+2.3 vs 0.8+2.3). Streaming stores skip
// the read-for-ownership but leave the data in DRAM, so the peer reads it from there. OpenMPI's reductions,
// which also copy into shared fragments, slow down the same way. CopyInPolicy times ordinary-store copies
// against the in-cache copy rate of this core and streams while they run far below it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mt::comm {

// Messages at least this large are copied out with streaming stores. 16 MB, not 8: at 8 MB the two ranks'
// buffers and slots (~26 MB for all_gather) still fit the 32 MB L3 of this work's EPYC host, and cached
// copy-out was faster there (2 ranks, all_gather 8 MB 470-489 us against 680-700 us streamed; all_to_all
// 526-558 against 643-681 us; all_reduce 905-1017 against 1070-1082 us).
constexpr size_t kStreamMinBytes = size_t{16} << 20;
// Copies from this size up use the vector loop (below it glibc's memcpy uses vector moves too).
constexpr size_t kCopyLoopMinBytes = 1024;

// dst[0..n) = src[0..n) (no overlap); `stream` selects non-temporal stores. Call stream_fence() before the
// data is handed to another thread or process.
void copy_bytes(void* dst, const void* src, size_t n, bool stream);
// n bytes as memcpy calls of kOwnCopyPieceBytes each: the C library copies pieces of that size with its string
// instruction (rep movsb), which on CPUs with fast strings writes whole lines without reading them first, and never
// takes its non-temporal path. For a rank's own block in the single-copy collectives, where the destination is
// not read before the call ends: 8 MB all-to-all 0.99-1.03x OpenMPI against 0.93-0.98x with copy_bytes (Zen 5).
constexpr size_t kOwnCopyPieceBytes = size_t{128} << 10;
void copy_in_pieces(void* dst, const void* src, size_t n);
void stream_fence();

// Chooses the stores of copies into shared memory from measured rates (bytes per second). While ordinary,
// every copy of at least kMeasureMinBytes is timed, and two in a row below to_stream_rate switch to
// streaming. In either mode every kProbeEvery-th copy of at least kProbeMinBytes starts with a probe: its
// first kProbeBytes (at most) copied with ordinary stores and timed; while streaming, a probe at
// to_ordinary_rate or more switches back. Copies under kProbeMinBytes are never timed (the clock's cost and
// resolution), so they could not find their way back from streaming; they use ordinary stores in both modes
// (2 KB pieces, a 4 KB all-gather or all-to-all: 1.4 us either way in the slow regime, 0.4 against 0.9 us
// streamed in the fast one). Not thread-safe: each thread has its own (copy_in_policy).
class CopyInPolicy {
 public:
  static constexpr size_t kMeasureMinBytes = 16 * 1024;
  static constexpr size_t kProbeMinBytes = 4 * 1024;
  static constexpr size_t kProbeBytes = 16 * 1024;
  static constexpr int kProbeEvery = 64;

  CopyInPolicy(double to_stream_rate, double to_ordinary_rate)
      : to_stream_(to_stream_rate), to_ordinary_(to_ordinary_rate) {}
  // Always one kind of stores, never timed.
  static CopyInPolicy fixed(bool stream);

  struct Plan {
    bool stream = false;     // stores for the bytes after the probe
    size_t timed_bytes = 0;  // leading bytes to copy with ordinary stores, time, and report to observe()
  };
  Plan plan(size_t n);
  void observe(size_t bytes, double seconds);

  bool streaming() const { return stream_; }
  int64_t switches() const { return switches_; }
  // Copies of at least kCopyLoopMinBytes planned with each kind of stores (below that, memcpy either way).
  int64_t streamed_copies() const { return streamed_; }
  int64_t ordinary_copies() const { return ordinary_; }

 private:
  double to_stream_, to_ordinary_;
  bool fixed_ = false;
  bool stream_ = false;
  int slow_in_a_row_ = 0;
  int since_probe_ = 0;
  int64_t switches_ = 0, streamed_ = 0, ordinary_ = 0;
};

// The calling thread's policy (the p2p progress thread has its own): thresholds from this core's in-cache
// copy rate R (measured once, 256 KB private to private, best of several): stream below R/6, back to
// ordinary above R/4. On the EPYC host R ~56 GB/s, so ~9 and ~14 GB/s: the break-even of ordinary stores
// (their copy-in rate r, plus the peer's copy-out from cache) against streaming (plus the peer's copy-out
// from DRAM) is r ~17 GB/s for 1 MB and ~8 GB/s for 32 KB, where DRAM latency weighs more; fast-regime
// copies of 16-32 KB measure 12-36 GB/s, slow ones 2-3. MESHTRAIN_SHM_STREAM=0|1 fixes the mode.
CopyInPolicy& copy_in_policy();

// Copy into memory that another core reads next (slots, rings), with the stores copy_in_policy() picks.
// The signal that publishes the data (shm::signal_store / signal_bump) fences streaming stores.
void copy_in(void* shared_dst, const void* src, size_t n, CopyInPolicy& policy = copy_in_policy());

}  // namespace mt::comm
