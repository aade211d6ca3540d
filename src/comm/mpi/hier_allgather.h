// hier_all_gather: the two-level all-gather the MPI backend uses when a communicator's ranks sit on several hosts
// with several ranks on each (the same host shape as HierAllReduce: H hosts, k ranks on each, host h holding the
// communicator's ranks h k .. h k + k - 1). Rank p = h k + j contributes shard p = shard_of(N, H k, p) of the
// N-element result (the balanced partition every all-gather of the backend uses):
//
//   1. across hosts: local rank j of every host all-gathers the shards (0, j), (1, j), .., (H-1, j) straight into
//      their places in the output (MPI_Iallgatherv on the communicator of local rank j of every host);
//   2. inside each host: local rank j packs its H shards, the host's k ranks all-gather the packs
//      (MPI_Iallgatherv), and each rank unpacks the other k - 1 packs into their places.
//
//   host 0: s0 s1          host 1: s2 s3        step 1: rank 0 <-> rank 2, rank 1 <-> rank 3 (s0 s2 / s1 s3)
//                                               step 2: rank 0 <-> rank 1, rank 2 <-> rank 3 (inside the hosts)
//
// Cost, S = result bytes: between hosts, every shard crosses to the H - 1 other hosts once: (H - 1) S in total,
// the minimum (S on 2 hosts, where a flat ring over 2 x 2 ranks sends 1.5 S and recursive doubling 2 S). Inside a
// host each rank sends (H/n) S and receives (k - 1) H/n S, plus the packing copies (about S per rank). Two
// collectives in sequence, each one message per peer. Only moves bytes: the result is exact for every split.
// Every wait has the caller's deadline.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "comm/mpi/hier_allreduce.h"

namespace mt::comm::mpi {

// send: the shard of this rank (elem bytes per element; may be the shard's place inside recv, as in place);
// recv: n elements. `hosts` gives the host shape (its node and cross communicators). what(): the operation's
// description for a timeout message.
void hier_all_gather(const HierAllReduce& hosts, const void* send, void* recv, size_t n, size_t elem,
                     double timeout_s, const std::function<std::string()>& what);

}  // namespace mt::comm::mpi
