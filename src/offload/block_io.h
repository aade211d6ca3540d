// The offload files' I/O engine: a byte range of a file moved in blocks (1 MiB by default, DeepSpeed's aio
// block size) with up to `depth` of them in flight at once (8 by default, DeepSpeed's queue depth), through
// io_uring (liburing) where the build has it and the kernel grants a ring, else one pread/pwrite at a time
// ("psync"). One BlockIo belongs to one thread: it is not shared.
//
// Direct I/O (O_DIRECT) needs the file offset, the length and the memory address aligned (kAlign = 4096
// bytes covers every logical block size and DMA alignment Linux uses). transfer() is for aligned ranges and
// buffers and moves the caller's memory itself; transfer_any() takes any byte range and any buffer. When the
// buffer lies at the range's place modulo kAlign ((buf - off) % kAlign == 0: "congruent", what
// offload::congruent_pad arranges), its whole aligned blocks move the caller's memory itself and only the
// partly covered edge blocks (at most two, each under kAlign bytes of the caller's) are staged; otherwise the
// whole range goes through `depth` staging blocks of its own (aligned): a read copies each block out as it arrives, a write
// fills a block before submitting it, so the copies overlap the other blocks in flight; a write whose range
// starts or ends inside a 4096-byte block first reads that block (read-modify-write). The file must extend
// to the range's ends rounded up to kAlign (the callers size their files so). Without direct I/O (a
// filesystem that refuses O_DIRECT, such as tmpfs) transfer_any() reads and writes the caller's memory
// directly, any alignment.
//
// Errors (an I/O error, a full disk, a file shorter than the range) wait for every block still in flight and
// then throw OffloadError naming `what` (the kind and the directory), the byte and the system's message.
#pragma once

#include <cstddef>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mt::offload {

constexpr size_t kAlign = 4096;
constexpr size_t kBlock = size_t(1) << 20;  // DeepSpeed's aio block size

class BlockIo {
 public:
  struct Options {
    size_t block = size_t(1) << 20;  // bytes per submitted I/O (a multiple of kAlign)
    int depth = 8;                   // I/Os in flight at once
    bool direct = false;             // the file was opened with O_DIRECT
    bool uring = true;               // use io_uring when available (false: psync, for tests and benchmarks)
    std::string what;                // "parameters in --offload-dir DIR", for messages
  };
  BlockIo(int fd, const Options& o);
  ~BlockIo();
  BlockIo(const BlockIo&) = delete;
  BlockIo& operator=(const BlockIo&) = delete;

  // [off, off + bytes) of the file from or into buf; with direct I/O off, bytes and buf must be kAlign-aligned.
  void transfer(bool write, size_t off, size_t bytes, void* buf);
  // Any range and buffer (see above).
  void transfer_any(bool write, size_t off, size_t bytes, void* buf);

  static bool uring_built();  // the build has liburing
  const char* engine() const { return ring_ ? "io_uring" : "psync"; }
  bool direct() const { return o_.direct; }
  int depth() const { return ring_ ? o_.depth : 1; }
  size_t block() const { return o_.block; }
  // Memory held for transfer_any's staging: 0 until its first use, then staging_need() (allocated and written
  // through at once, so all of it is resident from then on). Safe to read from another thread.
  size_t staging_bytes() const { return staging_bytes_.load(std::memory_order_relaxed); }
  // What the staging takes once used: depth() blocks and two kAlign edge blocks with direct I/O; 0 without
  // (transfer_any then moves the caller's memory).
  size_t staging_need() const { return o_.direct ? (size_t)depth() * o_.block + 2 * kAlign : 0; }
  // The caller's bytes transfer_any has copied through the staging blocks so far (safe from another thread).
  uint64_t staged_bytes() const { return staged_bytes_.load(std::memory_order_relaxed); }

 private:
  struct Req {
    bool write = false;
    size_t off = 0, len = 0, done = 0;
    char* buf = nullptr;
  };
  // Runs blocks 0..n-1: ready(i, slot) fills slot's request (and may copy into staging), after(i, slot) runs
  // once it is complete. At most depth() in flight; a slot is reused only after its after().
  template <class Ready, class After>
  void pipeline(size_t n, Ready ready, After after);
  void submit(int slot);
  int complete();  // the slot of a finished request (resubmits short transfers); throws only via error_
  void staged(bool write, size_t off, size_t bytes, char* p);  // transfer_any through the staging blocks
  void sync_io(Req& r);
  void fail(const Req& r, int err);  // keeps the first failure in error_
  char* staging(int slot);

  int fd_;
  Options o_;
  struct Ring;
  std::unique_ptr<Ring> ring_;
  std::vector<Req> reqs_;
  std::vector<int> finished_;  // psync: slots done, in order
  char* stage_ = nullptr;
  std::atomic<size_t> staging_bytes_{0};
  std::atomic<uint64_t> staged_bytes_{0};
  std::string error_;  // the first failure of a pipeline (thrown once every block in flight is back)
};

}  // namespace mt::offload
