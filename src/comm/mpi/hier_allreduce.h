// HierAllReduce: the two-level all-reduce the MPI backend uses when a communicator's ranks sit on several hosts
// with several ranks on each. H hosts, k ranks on each, host h holding the communicator's ranks h k .. h k + k - 1
// (contiguous, as the mesh places tp and then dp ranks); local rank j (0 <= j < k) owns chunk j = shard_of(N, k, j)
// of the N-element vector:
//
//   1. inside each host, all-to-all: local rank j receives chunk j of the inputs of its host's k ranks;
//   2. across hosts, a chain: local rank j of host 0 adds its k pieces in rank order and sends the partial sum to
//      local rank j of host 1, which goes on adding its own k pieces, and so on; the last host ends with chunk j
//      of the result;
//   3. across hosts, the last host broadcasts chunk j to local rank j of every other host;
//   4. inside each host, all-gather of the k chunks.
//
//   host 0: a0 a1 --(a0+a1)-->  host 1: ((a0+a1)+a2)+a3 = result --broadcast--> host 0
//
// Element i of the result is ((a_0 + a_1) + a_2) + ... + a_{n-1}: a left fold over the communicator's ranks in
// rank order, in float32, so its bits do not depend on how the ranks are split into hosts (2 x 2, 4 x 1 and 1 x 4
// give the same bits); a ring or tree across hosts could not promise that.
// Cost, S = 4 N bytes: between hosts, step 2 sends S/k per local rank over each of the H - 1 host boundaries and
// step 3 broadcasts S/k per local rank to H - 1 hosts: 2 (H - 1) S in total, what a ring over the H hosts sends,
// and the minimum for S bytes uncompressed (2 S on 2 hosts, where a flat ring over 2 x 2 ranks sends 3 S and
// recursive doubling 4 S). Inside a host each rank sends (k - 1)/k S twice. Steps 2 and 3 go in segments of 256 KB
// per chunk, so that the broadcast of segment s back along the chain overlaps the partial sums of segment s + 1
// going forward: both directions of a link carry data at once. The chain is still H - 1 hops in sequence (its
// first segment's latency), so this suits few hosts; with one host or one rank per host the flat MPI all-reduce
// is used instead.
// Float32 sum, avg (the caller divides) and max only; every wait has the caller's deadline.
// Measured (bench/hier_allreduce_hosts.sh, 2 x 2 ranks, 200 Mbit/s links): the bytes between hosts drop from 3 S
// to 2 S, but the time is 1.4-1.9x OpenMPI's flat all-reduce at 1-8 MB (best of 3 rounds each): the chain's
// segments and the broadcast do not keep both directions of the link busy as OpenMPI's algorithms do (each
// 256 KB segment is a rendezvous message over TCP). Hence it is opt-in (MESHTRAIN_MPI_HIER=1) until it is faster.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

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

  // With MESHTRAIN_MPI_HIER=1, the hosts of `comm` from MPI_Comm_split_type(SHARED): a HierAllReduce when there
  // are >= 2 hosts with the same number >= 2 of ranks each, in contiguous rank ranges; otherwise nullptr.
  // Unset or 0: nullptr (off by default: on 2 x 2 ranks over 200 Mbit/s links it took 1.4-1.9x the time of
  // OpenMPI's flat MPI_Iallreduce at 1-8 MB, bench/results/multihost/). Collective over `comm`.
  static std::unique_ptr<HierAllReduce> for_hosts_of(MPI_Comm comm);

  // in: N floats (may alias out exactly); out: N floats, the left fold described above. op: sum or max (avg is
  // a sum here). what(): the operation's description for a timeout message.
  void run(const float* in, float* out, size_t n, ReduceOp op, double timeout_s,
           const std::function<std::string()>& what);

  int hosts() const { return hosts_; }
  int per_host() const { return per_host_; }

 private:
  MPI_Comm node_ = MPI_COMM_NULL;   // this host's ranks, in comm rank order
  MPI_Comm cross_ = MPI_COMM_NULL;  // local rank j of every host, in host order
  int hosts_ = 0, per_host_ = 0, host_ = 0, local_ = 0;
};

}  // namespace mt::comm::mpi
