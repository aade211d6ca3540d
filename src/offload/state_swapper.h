// The optimizer state's disk tier (--offload optimizer --offload-dir DIR): a rank's flat state buffers (its
// ZeRO shard of AdamW's m and v, SGD's momentum) live in one file under DIR and pass through a few swap
// buffers ("slots") in memory, tile by tile, while the update runs (optim/tiled_optimizer.h drives it).
//
// Names: B flat buffers of n floats; T floats per buffer per tile (tile_bytes / 4); tile t covers elements
// [t T, min(n, (t+1) T)); S slots of B T floats each.
//
// File: tile-major, tile t at byte t B T 4: its B slices of T floats one after another, so a tile is one
// aligned read and one aligned write of B T 4 bytes. The file is sized (fallocate: a full disk is refused
// here, at start) to tiles() B T 4 bytes and has no name in DIR (O_TMPFILE; where the filesystem lacks it, a
// name removed right after creation), so nothing is left in DIR when the run ends, fails or is killed. Reads
// and writes bypass the page cache (O_DIRECT) where the filesystem allows it (not tmpfs). Each I/O thread moves
// a tile through its own offload::BlockIo (block_io.h): in blocks of 1 MiB (or the tile, when smaller), all of
// a tile's blocks in flight at once through io_uring (up to 8), else one pread/pwrite at a time.
//
// Two I/O threads (Options::io_threads) take reads and writes in the order they were queued, so a read ahead
// and a write behind can be in flight at once (queue depth 2; distinct tiles: a tile is read again only after
// its write finished). The slots' life cycle:
//
//   free --(queued read of tile t)--> reading --(read done)--> ready --acquire(t)--> held
//   held --release(t)--> writing --(write done)--> free, and at once reading the next tile of the update
//
// so with S = 4 the I/O threads write tile k-1 back and read tiles k+1 .. k+2 ahead while the caller updates
// tile k (when the disk keeps up; drawn with one thread):
//
//   caller:  |  update 0  |  update 1  |  update 2  |  ...
//   I/O:  R0 R1 R2 R3 | W0 R4   | W1 R5   | W2 R6 ...
//
// After end_update() (every write done) the first S tiles of the next update are read at once, so they arrive
// during the next forward and backward. The caller may touch a slice from acquire(t) until release(t) and
// nothing else; read() and write() (whole ranges, synchronous) wait for the I/O thread first and drop the
// prefetched tiles after a write(). An I/O error (a full disk, a failing device) is kept and thrown by the
// next call on the caller's side as an OffloadError naming DIR; the file is then never read again.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "optim/state_store.h"

namespace mt::offload {

class BlockIo;

// A failure of the offload tier's I/O (a full disk, an I/O error, a deadline passed).
class OffloadError : public Error {
 public:
  using Error::Error;
};

// What the tier moved: bytes, and seconds the I/O thread spent in reads and writes.
struct IoCounters {
  uint64_t bytes_read = 0, bytes_written = 0;
  double read_s = 0, write_s = 0;  // summed over the I/O threads (overlapping jobs count twice)
  double busy_s = 0;               // wall time with at least one job running
  uint64_t demand_reads = 0;  // tiles the update asked for before the read-ahead had queued them
};

// One read or write on an I/O thread, for the trace's I/O track (steady-clock microseconds).
struct IoEvent {
  bool write = false;
  size_t tile = 0;
  double t0_us = 0, t1_us = 0;
};

class StateSwapper final : public optim::StateTier {
 public:
  struct Options {
    std::string dir;                        // --offload-dir
    size_t buffers = 0;                     // B
    size_t n = 0;                           // elements of each buffer
    size_t tile_bytes = size_t(1) << 20;    // per buffer per tile; a multiple of 4096
    int slots = 4;                          // S >= 2
    double timeout_s = 600;                 // deadline of every wait for the I/O thread
    bool record_events = false;             // keep IoEvents for the trace
    int io_threads = 2;                     // I/O threads: reads and writes in flight at once
    bool uring = true;                      // each thread's tile in 1 MiB blocks at once through io_uring
  };
  explicit StateSwapper(const Options& o);
  ~StateSwapper() override;  // stops the I/O thread, closes the file (its space goes with it)

  void read(size_t j, size_t offset, size_t count, float* out) override;
  void write(size_t j, size_t offset, size_t count, const float* in) override;
  size_t tile_elems() const override { return T_; }
  size_t tiles() const override { return tiles_; }
  void begin_update() override;
  std::vector<float*> acquire(size_t t) override;
  void release(size_t t) override;
  void end_update() override;
  void set_descending(bool d) override;
  void set_read_ahead_later(bool v) override;
  void read_ahead() override;
  size_t resident_bytes() const override { return slots_.size() * B_ * T_ * sizeof(float); }

  IoCounters counters() const;
  std::vector<IoEvent> take_events();
  // With record_events: every read and write in the order it was queued, (write?, tile).
  std::vector<std::pair<bool, size_t>> issued() const;
  bool direct_io() const { return direct_; }
  int io_threads() const { return (int)io_.size(); }
  const char* engine() const;  // "io_uring" or "psync": how the I/O threads move a tile
  size_t file_bytes() const { return tiles_ * B_ * T_ * sizeof(float); }

 private:
  enum class State { free, reading, ready, held, writing };
  struct Slot {
    float* buf = nullptr;  // B T floats, 4096-aligned
    size_t tile = 0;
    State state = State::free;
  };
  struct Job {
    size_t slot;
    bool write;
  };
  void io_loop(BlockIo& io);
  void run_job(BlockIo& io, size_t slot, bool write, std::unique_lock<std::mutex>& lk);
  // Under mu_: queues a read of tile t into a free slot; false when none is free.
  bool prefetch_locked(size_t t);
  // Under mu_: waits until pred() or an error or the deadline; throws the error.
  template <class Pred>
  void wait_locked(std::unique_lock<std::mutex>& lk, const char* what, Pred pred);
  void throw_if_failed_locked() const;
  void drain_locked(std::unique_lock<std::mutex>& lk);  // no job queued or running, nothing held
  int slot_of_locked(size_t t) const;
  // Whole-file I/O outside the slots (read()/write()): tile by tile through a bounce buffer.
  void file_io(bool write, size_t off_bytes, size_t bytes, void* buf);

  Options o_;
  size_t B_, n_, T_, tiles_;
  int fd_ = -1;
  bool direct_ = false;
  std::vector<Slot> slots_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  int running_ = 0;  // jobs the I/O threads are running
  double busy_since_us_ = 0;
  bool in_update_ = false;
  size_t next_tile_ = 0;  // the update's next tile (its place in the order) that no slot holds yet
  bool desc_ = false;     // set_descending: tiles in the order tiles_ - 1, ..., 0
  bool later_ = false;         // set_read_ahead_later
  bool ahead_wanted_ = false;  // read_ahead() came during an update: end_update reads ahead
  void read_ahead_locked();    // the next update's first tiles, into the free slots
  size_t tile_at(size_t k) const { return desc_ ? tiles_ - 1 - k : k; }  // the k-th tile of the order
  size_t place_of(size_t t) const { return desc_ ? tiles_ - 1 - t : t; }  // and back
  std::string error_;
  bool stop_ = false;
  IoCounters counters_;
  std::vector<IoEvent> events_;
  std::vector<std::pair<bool, size_t>> issued_;
  std::vector<std::unique_ptr<BlockIo>> ios_;  // one per I/O thread
  std::unique_ptr<BlockIo> caller_io_;         // read() and write(), on the caller's thread
  std::vector<std::thread> io_;
};

}  // namespace mt::offload
