// The decentralized exchanges (--sync gossip, --sync decentralized-lowprec): no gradient all-reduce; each rank
// steps its own replica on its own share's mean gradient (--gossip-mix grads|both: mixed with its graph
// neighbours' first), then mixes its MODEL with them (params|both; parallel/data/gossip.h). The models are what
// pull the replicas together: with gradients alone (grads) nothing contracts x_i - x_j, and they drift apart.
//
//   method                   reduce(s)                               update(s)
//   gossip                   own share's mean gradient (x dp)         optimizer on x_t, then x <- sum_j W_rj x_j
//                                                                     (adapt then combine: with W = J / n, the
//                                                                     complete graph, SGD is exact data
//                                                                     parallelism up to float32 rounding)
//   decentralized-lowprec    the same                                 optimizer, then BAGUA's compressed
//                                                                     difference exchange (LowPrecisionGossip)
//
// --gossip-mix (--sync gossip only; not given: both) chooses what is mixed, with step s's W and the same messages:
//   params   (above) the model after the optimizer step
//   grads    the gradient before the clip norm and the optimizer: g_r <- sum_j W_rj g_j; no model mixing, so
//            nothing contracts x_i - x_j (they drift apart except on the complete graph); measured, not advised
//   both     the gradient before the step and the model after it: each rank's optimizer (AdamW's moments) sees
//            a mean over several shares' gradients, and the models still contract; twice the bytes
// At 2 ranks (W = J/2) grads and both give every rank exact DP's reduced gradient, so any optimizer, AdamW too,
// takes exact DP's steps (tests/parity/test_gossip.py: equal bit for bit there).
//
// The only other per-step collective is the one-float loss sum for the metrics row (as for Local SGD); the
// clip norm is each rank's own (no communication). Consensus distance, every --consensus-every K steps (0: off):
//   Xi = sqrt( (1/n) sum_r |x_r - xbar|^2 ),  xbar = (1/n) sum_r x_r   over the data-parallel group,
// measured on the models after step s's mixing: one all-reduce of the model (2 (n-1)/n 4N bytes per rank) and
// one of a double, plus two passes over N floats; its bytes are kept out of the run's comm_bytes. The
// row of such a step has consensus_distance; the summary's "decentralized" section has the last and largest.
// After the last step the replicas are averaged (one all-reduce), so the final evaluation and --save hold xbar;
// evaluations before it score each rank's replica on that rank's part of the validation batches.
#pragma once

#include <memory>

#include "train/grad_sync.h"

namespace mt::train {

std::unique_ptr<GradSync> make_gossip_sync(const SyncOptions& o, const parallel::Mesh& mesh,
                                           parallel::DataParallel& store, nn::ParamRegistry& params,
                                           trace::ChromeTrace* tracer);

// Xi over the group for this rank's x (count floats); collective. sent: bytes the measurement sent.
double consensus_distance(comm::Communicator* group, const float* x, size_t count, uint64_t* sent = nullptr);

}  // namespace mt::train
