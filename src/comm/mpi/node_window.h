// NodeWindow: shared memory among the ranks of one host for the hierarchical collectives, from MPI itself
// (MPI_Win_allocate_shared on the host's communicator, OpenMPI's osc/sm), so the steps inside a host are copies
// through memory rather than messages over the TCP loopback (the hosts of scripts/hosts.sh run OpenMPI with
// `btl tcp,self`: without this, a 4 MB all-gather inside a host took 30-170 ms on the shared 2-core machine).
//
// Each of the host's k ranks owns one slot of `slot_bytes()` bytes; every rank can read and write every slot.
// Use per collective: begin(), write your slot, sync(), read the others' slots (more write/sync/read rounds may
// follow on other parts of the slots). Slots are double-buffered: begin() switches every slot to its other half,
// so a rank may write its slot in call c + 1 while a slower host-mate still reads it from call c; a write in
// call c + 2 is safe because the writer has passed call c + 1's sync, which the reader reaches only after its
// reads of call c. Hence every call must sync() at least once.
// sync() is MPI_Win_sync, a barrier on the host's communicator under the caller's deadline, MPI_Win_sync (the
// memory-model recipe for a passive-target epoch held for the window's whole life by MPI_Win_lock_all).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <string>

namespace mt::comm::mpi {

class NodeWindow {
 public:
  explicit NodeWindow(MPI_Comm node);
  ~NodeWindow();
  NodeWindow(const NodeWindow&) = delete;
  NodeWindow& operator=(const NodeWindow&) = delete;

  // Makes every slot hold at least `bytes` (collective over the host's ranks, which must pass the same value;
  // grows by reallocating, never shrinks), then switches to the other half (see above).
  // Growing waits for every host-mate first (a barrier under the caller's deadline; MPI_Win_free has none).
  void begin(size_t bytes, double timeout_s, const std::function<std::string()>& what);
  char* slot(int local_rank) const;
  size_t slot_bytes() const { return slot_bytes_; }
  void sync(double timeout_s, const std::function<std::string()>& what);

 private:
  void release();
  MPI_Comm node_;
  int k_ = 0;
  MPI_Win win_ = MPI_WIN_NULL;
  char* base0_ = nullptr;  // slot 0; slots are contiguous (MPI_Win_allocate_shared's default layout)
  size_t slot_bytes_ = 0;  // one half
  int half_ = 0;
};

}  // namespace mt::comm::mpi
