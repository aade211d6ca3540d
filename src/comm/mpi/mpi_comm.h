// MpiCommunicator: the MPI backend, for processes started by mpirun (across hosts). Every operation maps to
// MPI's own non-blocking collective (MPI_Iallreduce, MPI_Ireduce_scatter, MPI_Iallgatherv, MPI_Ibcast,
// MPI_Ireduce, MPI_Ialltoall(v), MPI_Isend/Irecv), so MPI's tuned algorithm selection applies, and is then
// completed by polling MPI_Test against the deadline (MPI has no timed wait): a stalled peer becomes a
// CommError instead of a hang.
//
// Before each collective the ranks exchange a 32-byte descriptor (kind, count, dtype, op, root, #seq) so a
// mismatched call is reported on every rank rather than corrupting data: one extra small collective, paid
// for clarity. bf16 is reduced by widening to float32, reducing float32 in MPI and rounding once (float32
// accumulation, twice the bytes on the wire); bf16 data that is only moved travels as 16-bit words.
// Counts above INT_MAX elements are rejected (MPI's int counts).
// On a group spread over several hosts with several ranks on each (MPI_Comm_split_type SHARED, equal contiguous
// rank ranges per host), all-gather goes through hier_all_gather (across hosts once per shard, then inside each
// host through shared memory; the minimum bytes between hosts, measured faster than OpenMPI's own at 2-8 MB on
// bandwidth-limited links) and all-reduce through HierAllReduce (a left fold in rank order whatever the host split)
// where OpenMPI's own crosses hosts with more bytes (group sizes that are not a power of two,
// HierAllReduce::default_for; MESHTRAIN_MPI_HIER=1 takes it everywhere). MESHTRAIN_MPI_HIER=0 keeps
// every collective on OpenMPI's algorithms (hier_allreduce.h, hier_allgather.h).
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/launch.h"
#include "comm/mpi/hier_allreduce.h"

namespace mt::comm::mpi {

class MpiCommunicator : public Communicator {
 public:
  // Duplicates `comm` (the communicator owns the duplicate and frees it).
  MpiCommunicator(MPI_Comm comm, std::string name);
  ~MpiCommunicator() override;
  const char* backend() const override { return "mpi"; }
  MPI_Comm handle() const { return comm_; }
  // null: all-reduce is MPI's own
  const HierAllReduce* hierarchical() const { return hier_all_reduce_ ? hosts_.get() : nullptr; }
  bool hierarchical_all_gather() const { return hier_all_gather_; }

 protected:
  void run_collective(const CollArgs& a) override;
  std::unique_ptr<Communicator> run_split(int colour, int key, const std::string& name, uint64_t seq,
                                          double timeout_s) override;
  Request start_send(const void* buf, size_t bytes, int peer, int tag) override;
  Request start_recv(void* buf, size_t bytes, int peer, int tag) override;

 private:
  void check_descriptor(const CollArgs& a);
  void run_collective_body(const CollArgs& a);
  // After a collective's own MPI wait timed out (MPI does not say for whom): which peers also reached that point
  // (answered a probe on the descriptor context within kProbeSeconds). Returns the world ranks that did not, in
  // group order (the first is the rank this one waited for).
  std::vector<int> probe_peers(double timeout_s);
  void run_reducing(const CollArgs& a);
  int world_rank_of(int group_rank) const;  // -1 when not in MPI_COMM_WORLD's group
  int world_of(int g) const override { return world_rank_of(g); }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm desc_comm_ = MPI_COMM_NULL;  // the descriptor exchange's own context (never matches user messages)
  std::vector<int> world_of_;            // group rank -> world rank
  std::unique_ptr<HierAllReduce> hosts_;  // set when the group spans >= 2 hosts with >= 2 ranks on each
  bool hier_all_reduce_ = false, hier_all_gather_ = false;
};

// Initialises MPI if needed (MPI_THREAD_MULTIPLE; finalised at exit) and runs body with the world.
LaunchResult run_body(const LaunchOptions& o, const std::function<void(Communicator&)>& body);
// Waits for an MPI request until timeout_s has passed, then throws CommError with `what` (shared by the
// benchmark); CommTimeoutError naming waited_world when the peer waited for is known.
// Throws CommError "WHAT failed: <MPI's message>" unless rc is MPI_SUCCESS.
void check_mpi(int rc, const char* what);

void wait_request(MPI_Request* req, double timeout_s, const std::function<std::string()>& what,
                  MPI_Status* status = nullptr, int waited_world = -1);
// The same for n requests (completed ones become MPI_REQUEST_NULL); on timeout waited_world() names the world
// rank waited for, or -1.
void wait_requests(int n, MPI_Request* reqs, double timeout_s, const std::function<std::string()>& what,
                   const std::function<int()>& waited_world, MPI_Status* statuses);

}  // namespace mt::comm::mpi
