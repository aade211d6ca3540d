// The shared-memory job: one segment the launcher creates before forking, holding the job block (world
// size, worker pids, the failure record the supervisor writes) and an arena from which every communicator
// of the job (the world and all its splits) takes its region with a bump allocator.
//
// The segment is named /meshtrain-<launcher pid>-<job id>, and unlinked as soon as it is mapped: the
// workers inherit the mapping through fork, so the name is never needed again and nothing of the job is
// visible in /dev/shm while it runs or after it ends, however it ends (even if the launcher is SIGKILLed).
// The arena is sparse (MAP_NORESERVE): only pages that communicators touch take memory. Regions are never
// freed; splits happen a few times per job.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/shm/signal.h"

namespace mt::comm::shm {

constexpr int kMaxRanks = 256;
constexpr size_t kErrorChars = 2048;  // one error message (a few lines); the block is sparse, pages touched on use

struct JobBlock {
  uint64_t magic;
  int32_t nranks;
  int32_t launcher_pid;
  uint64_t arena_bytes;
  std::atomic<uint64_t> next_free;    // bump allocator: offset of the first free arena byte
  std::atomic<uint32_t> next_group;   // group ids for splits; the world is group 0
  std::atomic<int32_t> failure_claim;  // 0 until someone records a failure; the first claimant writes it
  std::atomic<int32_t> failed_rank;    // -1 while healthy; the world rank that failed first
  char failure[kErrorChars];          // why it failed (written before failed_rank is set)
  std::atomic<int32_t> waited_rank;    // a timeout: the world rank the failed rank waited for; else -1
  int32_t pids[kMaxRanks];
  std::atomic<int32_t> exit_status[kMaxRanks];  // 0 while running; 1 + waitpid status once reaped
  char rank_error[kMaxRanks][kErrorChars];  // each worker's own last words, written before it exits
  // What each rank is blocked on, for naming the stalled rank of a chain of waits: the world rank it waits for
  // and when it last polled (steady-clock ns). Written only from the slow path of a wait (after the spin, every
  // few ms while asleep), never on a fast path.
  std::atomic<int32_t> waiting_for[kMaxRanks];
  std::atomic<int64_t> wait_polled_ns[kMaxRanks];
  // CPUs each rank binds to, 0: none (shm/bind.h). Set by the launcher before it forks; the ranks bind and pick
  // the single-copy threshold from it, so all of them agree.
  int32_t bind_width;
};

class Job {
 public:
  // Creates, maps and unlinks the segment; `arena_bytes` is virtual (sparse).
  Job(int nranks, size_t arena_bytes);
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  JobBlock& block() { return *block_; }
  int nranks() const { return block_->nranks; }
  // Returns the offset of `bytes` fresh zeroed bytes (64-byte aligned); throws mt::CommError when full.
  uint64_t allocate(size_t bytes);
  void* at(uint64_t offset) { return base_ + offset; }

  // The failure record, first failure wins: a worker that throws records itself, the supervisor records a
  // worker that died; waiting workers poll failed() and turn it into an error.
  // waited_rank: for a timeout, the world rank that did not answer (the headline names it).
  void fail(int world_rank, const std::string& why, int waited_rank = -1);
  bool failed(int* world_rank, std::string* why);
  int waited_rank() const { return block_->waited_rank.load(std::memory_order_acquire); }
  void set_rank_error(int world_rank, const std::string& msg);
  std::string rank_error(int world_rank);
  // The supervisor marks each worker it reaps, so that a rank waiting for one that already ended (its body
  // returned early, or it died) fails at once instead of at its deadline. Returns false while running.
  void set_exited(int world_rank, int wait_status);
  bool exited(int world_rank, int* wait_status);

  // A waiting rank notes whom it waits for each time it polls (see JobBlock::waiting_for).
  void note_wait(int world_rank, int waiting_for);
  // From `first` (the rank a timed-out rank waited for), follows the ranks that are themselves still waiting
  // (polled within the last second) to the end of the chain: the rank nobody heard from. Returns the chain,
  // first element `first`, last element the stalled rank; a cycle stops at its first repeat.
  std::vector<int> wait_chain(int first);

  const std::string& name() const { return name_; }

 private:
  std::string name_;
  char* base_ = nullptr;
  size_t bytes_ = 0;
  JobBlock* block_ = nullptr;
};

// The name prefix of every segment this process creates ("/meshtrain-<pid>-"), and a sweep that unlinks any
// left over (only possible if the process died between shm_open and shm_unlink). Returns how many it removed.
std::string segment_prefix(pid_t pid);
int sweep_segments(pid_t pid);
// Lists /dev/shm entries that belong to launcher `pid` (tests use it to prove nothing is left behind).
int count_segments(pid_t pid);

}  // namespace mt::comm::shm
