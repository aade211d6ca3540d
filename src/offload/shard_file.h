// A rank's flat shard of float32 parameters or gradients kept in a file under --offload-dir instead of memory
// (--offload params, --offload grads; parallel/data/zero_stage.cpp's stage 3 and its tiled update use it).
//
// The file holds n floats in the shard's own order (element i at byte 4 i), so a bucket's slice and an update
// tile's range are each one contiguous read or write. It has no name in DIR (O_TMPFILE, else a name removed
// at once: offload::open_unnamed), is reserved whole at start (posix_fallocate: a disk without room is refused
// then, naming DIR and the bytes; its size is rounded up to 4096 bytes). Reads and writes bypass the page
// cache (O_DIRECT) where the filesystem takes it (not tmpfs: there through the cache) and run through a
// BlockIo (offload/block_io.h): blocks of Options::io_block bytes, io_depth of them in flight (io_uring),
// ranges not 4096-aligned through its aligned staging blocks (an edge block a write covers in part is read
// first). block_io.h tells which engine and mode was used (engine(), direct_io()).
//
// One I/O thread runs the queued reads and writes in the order they were queued, so a read queued after a
// write of the same range returns what was written. Each queued job has a ticket; wait(ticket) returns once
// that job (and every earlier one) is done, with --comm-timeout's deadline. A write either copies its data
// (write_copy: the caller's buffer is free at once) or borrows it until its ticket is waited for. An I/O
// error is kept and thrown by the next call as an OffloadError naming DIR and the kind; nothing is read or
// written after it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "offload/block_io.h"
#include "offload/state_swapper.h"
#include "tensor/buffer.h"

namespace mt::offload {

// Floats to skip at the start of a 64-byte aligned buffer `base` so that element `off` of a shard file placed
// there is congruent with its file offset (block_io.h: the address modulo 4096 equals the byte offset modulo
// 4096), so its whole 4096-byte blocks move without staging. Under kCongruentSlack; equal to off modulo 16, so
// the element keeps its place modulo 64 bytes as in a 64-byte aligned shard.
constexpr size_t kCongruentSlack = kAlign / sizeof(float);
inline size_t congruent_pad(const float* base, size_t off) {
  return (size_t)((off * sizeof(float) - (uintptr_t)base) % kAlign) / sizeof(float);
}

// Opens an unnamed file in dir (O_TMPFILE, with O_DIRECT where the filesystem takes it and direct is asked
// for; else a named file removed at once). Throws InputError naming dir when it is missing, not a directory
// or not writable.
int open_unnamed(const std::string& dir, bool& direct);

class ShardFile {
 public:
  struct Options {
    std::string dir;            // --offload-dir
    std::string kind;           // "parameters" or "gradients", for messages and the trace
    size_t n = 0;               // floats (0: grown by reserve())
    double timeout_s = 600;     // deadline of every wait
    bool record_events = false; // keep IoEvents for the trace
    size_t io_block = size_t(1) << 20;  // bytes per I/O (a multiple of 4096; DeepSpeed's aio block: 1 MiB)
    int io_depth = 8;                   // I/Os in flight (DeepSpeed's aio queue depth: 8)
    bool direct = true;                 // O_DIRECT where the filesystem takes it
    bool uring = true;                  // io_uring where available (false: one pread/pwrite at a time)
  };
  using Ticket = uint64_t;

  explicit ShardFile(const Options& o);
  ~ShardFile();  // finishes nothing queued: the file goes with it
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;

  // Queue a read of [off, off + count) into out (kept alive and untouched until wait()).
  Ticket read_async(size_t off, size_t count, float* out);
  // Queue a write of in[0, count) at off; `in` is borrowed until wait() of the ticket.
  Ticket write_async(size_t off, size_t count, const float* in);
  // Queue a write of a copy of in[0, count), or of data itself: nothing to keep alive.
  Ticket write_copy(size_t off, size_t count, const float* in);
  Ticket write_owned(size_t off, std::vector<float> data);
  // data's [pad, pad + count) (placed by congruent_pad: no staging); data is freed once written.
  Ticket write_owned(size_t off, size_t count, AlignedBuffer data, size_t pad);
  void wait(Ticket t);
  void read(size_t off, size_t count, float* out) { wait(read_async(off, count, out)); }
  void write(size_t off, size_t count, const float* in) { wait(write_async(off, count, in)); }
  void drain();  // every queued job done
  bool done(Ticket t) const;  // without waiting; throws the I/O error if one happened
  // Grows the file to at least n floats, reserving the space now (posix_fallocate): a full disk is an
  // OffloadError naming DIR here, on the caller's side.
  void reserve(size_t n);

  size_t size() const { return n_; }
  size_t file_bytes() const { return n_ * sizeof(float); }
  const std::string& kind() const { return o_.kind; }
  IoCounters counters() const;
  std::vector<IoEvent> take_events();  // tile: the job's first element
  bool direct_io() const { return io_->direct(); }
  const char* engine() const { return io_->engine(); }  // "io_uring" or "psync"
  int io_depth() const { return io_->depth(); }
  size_t io_block() const { return io_->block(); }
  // The I/O engine's staging blocks (block_io.h): what they take once used (0 without direct I/O), and what is
  // held now (0 until the first unaligned direct transfer; resident from then on).
  size_t staging_bytes() const { return io_->staging_need(); }
  size_t staging_held() const { return io_->staging_bytes(); }
  uint64_t staged_bytes() const { return io_->staged_bytes(); }  // bytes copied through staging so far

 private:
  struct Job {
    Ticket ticket;
    bool write;
    size_t off, count;
    float* buf;
    std::vector<float> copy;  // write_copy's data
    AlignedBuffer owned;      // or write_owned's, from owned.data() + buf offset
  };
  Ticket queue(Job j);
  void io_loop();
  template <class Pred>
  void wait_locked(std::unique_lock<std::mutex>& lk, const char* what, Pred pred);

  Options o_;
  size_t n_;
  int fd_ = -1;
  std::unique_ptr<BlockIo> io_;  // used by the I/O thread only (and the constructor)
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  Ticket issued_ = 0, done_ = 0;
  std::string error_;
  bool stop_ = false;
  IoCounters counters_;
  std::vector<IoEvent> events_;
  std::thread thread_;
};

}  // namespace mt::offload
