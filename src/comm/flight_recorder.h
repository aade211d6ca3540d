// The flight recorder: each rank keeps its last kFlightEntries communication operations (collectives,
// splits and point-to-point messages, on every group) in a fixed ring, so that when a job fails the launcher
// can say where every rank was (flight_verdict.h), not only which rank timed out first.
//
// Where the ring lives. Under the shm launcher the rings are in the job's shared segment, one per rank,
// allocated before the fork: the supervisor reads them directly, also those of ranks that were SIGKILLed or
// are SIGSTOPped (nothing has to be written at failure time, so a dead rank's last operations are there too).
// A process that attaches no ring (one process, MPI, tests of the communicator alone) records nothing: every
// call below is then one load and a branch.
//
// Cost per operation (measured in `meshtrain bench comm`, see docs/faults.md): one relaxed fetch_add to claim
// a slot, a handful of relaxed stores and two or three reads of CLOCK_MONOTONIC; no allocation, no lock. A
// slot is reused after kFlightEntries later operations; an entry's `id` (1 + this rank's operation index) says
// whether a handle still owns its slot, so a late "done" never marks a newer entry.
//
// Reading while the rank runs. The supervisor reads rings of ranks that may still be writing (they are
// blocked in a wait, or the failure is being noticed). Fields are atomics, so a read is never undefined, but
// an entry being rewritten at that moment can mix two operations; the reader takes an entry only if its id is
// the same before and after copying it (a seqlock with the id as the sequence).
//
// Fault injection (tests): attach() also takes a FaultPoint ("before this rank's K-th operation, SIGKILL /
// SIGSTOP itself"), parsed from MESHTRAIN_FAULT=RANK:K:KIND by the launcher (see parse_fault).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/types.h"

namespace mt::comm::flight {

constexpr int kFlightEntries = 256;  // N, the operations each rank remembers
constexpr int kGroupChars = 24;      // a group's name, truncated
constexpr int kHostChars = 64;

// A message is `started` when posted and `waiting` while a caller blocks on it (wait()); a collective is
// `queued` until its turn, then `started` (blocking or on the progress thread).
enum class State : uint32_t { empty = 0, queued = 1, started = 2, done = 3, failed = 4, waiting = 5 };
const char* state_name(State s);

struct Entry {
  std::atomic<uint64_t> id;     // 0: never used; else 1 + this rank's operation index (the seqlock)
  std::atomic<uint32_t> state;  // State
  std::atomic<uint32_t> kind;   // OpKind
  std::atomic<uint64_t> seq;    // collective: its #seq on the group; message: the n-th to/from that peer there
  std::atomic<uint64_t> bytes;  // collective: S (the full buffer); message: its bytes
  std::atomic<int32_t> peer;    // message: the peer's world rank; collective: -1 (root: see `root`)
  std::atomic<int32_t> root;    // broadcast / reduce root (group rank), else -1
  std::atomic<int64_t> t_queued_ns, t_started_ns, t_done_ns;  // CLOCK_MONOTONIC (one clock per host), 0 = not yet
  std::atomic<uint64_t> group[kGroupChars / 8];  // the group's name, 8 bytes a word, written before `id`
};

// Rank-local ring plus what the launcher needs to name the rank.
struct Ring {
  uint64_t magic;
  int32_t world_rank;
  int32_t pid;
  char host[kHostChars];
  std::atomic<uint64_t> next;  // operations recorded so far (the next id - 1)
  std::atomic<int32_t> lost;   // 1: an injected "lose" fault: this rank's place cannot be restarted
  Entry e[kFlightEntries];
};

// A plain copy of one entry, for the verdict and for files.
struct Op {
  uint64_t id = 0;
  State state = State::empty;
  OpKind kind = OpKind::barrier;
  uint64_t seq = 0, bytes = 0;
  int peer = -1, root = -1;
  int64_t t_queued_ns = 0, t_started_ns = 0, t_done_ns = 0;
  std::string group;
};

// Handle of a recorded operation (null when no ring is attached).
struct Slot {
  Entry* e = nullptr;
  uint64_t id = 0;
};

// What an injected fault does, and where: before this rank's `at`-th operation (1-based; collectives,
// splits and messages on every group count) the rank SIGKILLs (kill), SIGSTOPs (stop) itself, or marks its
// place lost and SIGKILLs itself (lose: --min-nproc's "a rank that cannot be restarted").
enum class FaultKind { none, kill, stop, lose };
struct FaultPoint {
  int rank = -1;
  uint64_t at = 0;
  FaultKind kind = FaultKind::none;
};
// Parses "RANK:K:KIND" (KIND kill | stop | lose; RANK >= 0, K >= 1); "" is no fault. Throws InputError naming
// `what` (the variable) and the value otherwise.
FaultPoint parse_fault(const std::string& spec, const char* what = "MESHTRAIN_FAULT");

// Initialises a ring in place (in shared memory: call before fork).
void init_ring(Ring* ring, int world_rank);
// This process records into `ring` from now on (nullptr: stops recording); `fault` applies when its rank is
// the ring's world rank.
void attach(Ring* ring, FaultPoint fault = {});
Ring* attached();

// Records a new operation in state `s` (queued or started), stamping the time of that state. Fires an
// injected fault first when this is the fault's operation.
Slot record(const std::string& group, OpKind kind, uint64_t seq, uint64_t bytes, int peer, int root, State s);
// Moves an operation to started, done or failed (stamping the time); no-op when the slot has been reused.
void mark(Slot slot, State s);

// The ring's entries that are complete, oldest first (at most kFlightEntries).
std::vector<Op> snapshot(const Ring& ring);
// "all_reduce #412 on group dp", "send #17 to rank 2 on group pp".
std::string describe_op(const Op& op);

}  // namespace mt::comm::flight
