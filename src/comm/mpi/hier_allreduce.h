// HierAllReduce: the two-level all-reduce the MPI backend can use when a communicator's ranks sit on several hosts
// with several ranks on each. H hosts, k ranks on each, host h holding the communicator's ranks h k .. h k + k - 1
// (contiguous, as the mesh places tp and then dp ranks); local rank j (0 <= j < k) owns chunk j = shard_of(N, k, j)
// of the N-element vector. The host's ranks share memory through a NodeWindow (node_window.h):
//
//   1. inside each host: every rank copies its input into its slot of the window; local rank j then reads chunk j
//      of its host-mates' inputs in place;
//   2. across hosts, a chain: local rank j of host 0 adds its k pieces in rank order and sends the partial sum to
//      local rank j of host 1, which goes on adding its own k pieces, and so on; the last host ends with chunk j
//      of the result;
//   3. across hosts, the last host sends chunk j of the result to local rank j of every other host, which
//      receives it into its slot of the window;
//   4. inside each host: every rank copies the k result chunks out of the host-mates' slots.
//
//   host 0: a0 a1 --(a0+a1)-->  host 1: ((a0+a1)+a2)+a3 = result --result--> host 0
//
// Element i of the result is ((a_0 + a_1) + a_2) + ... + a_{n-1}: a left fold over the communicator's ranks in
// rank order, in float32, so its bits do not depend on how the ranks are split into hosts (2 x 2, 4 x 1 and 1 x 4
// give the same bits); a ring or tree across hosts could not promise that.
// Cost, S = 4 N bytes: between hosts, step 2 sends S/k per local rank over each of the H - 1 host boundaries and
// step 3 sends S/k per local rank to H - 1 hosts: 2 (H - 1) S in total (2 S on 2 hosts, where a flat ring over
// 2 x 2 ranks sends 3 S). Inside a host: copies of S in and S out per rank, and two barriers. Steps 2 and 3 go in
// segments of 64,000 bytes (one eager TCP message each, no rendezvous round trip), so that the result's segment s
// travels back while the partial sums of the later segments travel forward: both directions of a link carry
// data at once. The chain is still H - 1 hops in sequence (its first segment's latency), so this suits few hosts;
// with one host or one rank per host the flat MPI all-reduce is used instead.
// Float32 sum, avg (the caller divides) and max only; every wait has the caller's deadline.
// Measured (bench/results/multihost/, 2 x 2 ranks, 200 Mbit/s links, shared 2-core machine): about OpenMPI's
// flat all-reduce time at 1-8 MB, not faster: at these sizes OpenMPI's flat all-reduce already sends about S each
// way between the hosts (2 S in total, like this one; its recursive halving pairs neighbours first), so there are
// no bytes to save on 2 x 2. Hence it is the default only where OpenMPI's crosses hosts with more bytes
// (default_for: on 2 x 3, 4.69 S flat against 2.11 S, 1.4-2.0x faster at 1-8 MB) and opt-in elsewhere
// (MESHTRAIN_MPI_HIER=1). The earlier version (all-to-all and all-gather inside a host over TCP, 256 KB rendezvous
// segments, MPI_Ibcast back) took 1.4-1.9x flat's time.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "comm/mpi/node_window.h"
#include "comm/types.h"

namespace mt::comm::mpi {

class HierAllReduce {
 public:
  // `node`: the ranks of `comm` that share this rank's host (any communicator splitting `comm` into contiguous
  // rank ranges of equal size; tests pass made-up splits). Collective over `comm`. Throws CommError when the
  // split does not have that shape.
  HierAllReduce(MPI_Comm comm, MPI_Comm node);
  ~HierAllReduce();
  HierAllReduce(const HierAllReduce&) = delete;
  HierAllReduce& operator=(const HierAllReduce&) = delete;

  // The hosts of `comm` from MPI_Comm_split_type(SHARED): a HierAllReduce when there are >= 2 hosts with the
  // same number >= 2 of ranks each, in contiguous rank ranges; otherwise nullptr. Collective over `comm`. Whether
  // a collective then goes through it is MpiCommunicator's choice (MESHTRAIN_MPI_HIER, mpi_comm.h).
  static std::unique_ptr<HierAllReduce> for_hosts_of(MPI_Comm comm);
  // Whether, on a communicator of `ranks` ranks in hosts of the shape above, this all-reduce is the default
  // (MESHTRAIN_MPI_HIER unset): when `ranks` is not a power of two. The MPI backend calls MPI_Iallreduce, which
  // OpenMPI 4.1 runs with libnbc: a binomial tree (below 64 KB, in place, or under 4 ranks) or recursive halving
  // and doubling. With a power of two of ranks in contiguous hosts both pair ranks inside a host first and cross
  // between hosts about 2 (H - 1) S in all, as this one does (measured 2.09-2.10 S on 2 x 4 ranks and about S each
  // way on 2 x 2, bench/results/multihost/); with any other count the tree's pairs and the halving's fold of
  // the extra ranks cross hosts with whole or half vectors (bench/results/multihost/ for 2 x 3).
  static bool default_for(int ranks) { return ranks >= 4 && (ranks & (ranks - 1)) != 0; }

  // in: N floats (may alias out exactly); out: N floats, the left fold described above. op: sum or max (avg is
  // a sum here). what(): the operation's description for a timeout message.
  void run(const float* in, float* out, size_t n, ReduceOp op, double timeout_s,
           const std::function<std::string()>& what);

  int hosts() const { return hosts_; }
  int per_host() const { return per_host_; }
  int host() const { return host_; }    // this rank's host, 0 .. hosts() - 1
  int local() const { return local_; }  // this rank's place on its host, 0 .. per_host() - 1
  MPI_Comm node() const { return node_; }    // this host's ranks (hier_all_gather uses the same shape)
  MPI_Comm cross() const { return cross_; }  // local rank local() of every host, in host order
  NodeWindow& window() const { return *window_; }  // shared memory among this host's ranks

 private:
  MPI_Comm node_ = MPI_COMM_NULL;   // this host's ranks, in comm rank order
  MPI_Comm cross_ = MPI_COMM_NULL;  // local rank j of every host, in host order
  int hosts_ = 0, per_host_ = 0, host_ = 0, local_ = 0;
  std::unique_ptr<NodeWindow> window_;  // on node_; freed before node_
};

}  // namespace mt::comm::mpi
