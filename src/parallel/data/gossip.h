// Decentralized averaging over a data-parallel group (gossip): no all-reduce, each rank mixes its model with a
// few peers along the edges of a graph, x_r <- sum_j W[r][j] x_j, by point-to-point messages. What lives here:
// the mixing matrix of each graph (pure), the full-precision mixer, and BAGUA's low-precision decentralized
// exchange (compressed model differences, with exact copies of the neighbours' models). What does not: when
// the mixing happens relative to the optimizer step (train/gossip_sync.h), the consensus measurement.
//
// Legend: n ranks of the group, r this rank, s the step, N floats in the flat buffer, W the n x n mixing matrix.
//
// Graphs (every W here is symmetric or a permutation mix, so doubly stochastic: rows and columns sum to 1):
//   ring  n = 1: W = [1]. n = 2: W[r][r] = W[r][1-r] = 1/2 (the complete graph). n >= 3: W[r][r] =
//         W[r][r-1] = W[r][r+1] = 1/3 (indices mod n). Fixed over steps. Per step a rank sends its N floats to
//         each of its 1 (n = 2) or 2 (n >= 3) neighbours: 4N or 8N bytes.
//   exp   the one-peer time-varying exponential graph: tau = ceil(log2 n) hops 2^0 .. 2^(tau-1), at step s the
//         hop d = 2^(s mod tau); rank r receives from (r - d) mod n and sends to (r + d) mod n, W[r][r] =
//         W[r][r-d] = 1/2. Each W is (I + P) / 2 for a permutation P, so doubly stochastic; d < n never maps a
//         rank to itself. One message of 4N bytes per rank per step, whatever n. (n = 2: the complete graph
//         every step; n a power of two: tau consecutive steps average exactly, W_{tau-1} ... W_0 = J / n.)
//
// Deadlines: every receive and send goes through the communicator and ends within its timeout with an error
// naming the group, the peer and the operation (comm/communicator.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/communicator.h"

namespace mt::parallel {

enum class GossipGraph { ring, exp };

// Rank r's row of W at step s: x_r <- self x_r + sum_k weight[k] x_{from[k]}; r's model goes to each of `to`.
struct MixRow {
  float self = 1;
  std::vector<int> from;
  std::vector<float> weight;
  std::vector<int> to;
};
MixRow mixing_row(GossipGraph g, int n, int r, int64_t s);
// The whole W at step s, row-major n x n, in double (tests and docs; the rows are mixing_row's weights).
std::vector<double> mixing_matrix(GossipGraph g, int n, int64_t s);

// Full-precision gossip: x <- sum_j W[r][j] x_j over the group, in place.
class GossipMixer {
 public:
  GossipMixer(comm::Communicator* group, GossipGraph g, size_t count);
  // x: count floats, this rank's model. Returns once the peers' models have arrived and been mixed in and
  // this rank's own sends are done (x may be changed by the caller after it returns).
  void mix(float* x, int64_t s);

 private:
  comm::Communicator* group_;
  GossipGraph graph_;
  size_t count_;
  std::vector<float> send_;                  // x as it was before mixing (what the peers receive)
  std::vector<std::vector<float>> inbox_;    // one per in-peer
};

// BAGUA's low-precision decentralized SGD (Tang et al. 2018, DCD-PSGD; the ring only: its peers must stay
// fixed, since each rank keeps an exact copy xhat_j of every neighbour's model). With x_t this rank's model
// before step t's update and y = the optimizer's update of x_t on this rank's own gradient:
//   z   = (y - x_t) + sum_{j != r} W[r][j] (xhat_j - x_t)   (= sum_j W[r][j] xhat_j + (y - x_t) - x_t, xhat_r = x_t)
//   q   = Q(z);  x_{t+1} = x_t + D(q);  q goes to both neighbours
//   xhat_j += D(q_j) for each neighbour j, with the q_j it sent
// Q: min-max 8-bit quantization per block of kBlock consecutive elements of the flat buffer: the block's lo =
// min, hi = max (two floats), each element's code round((z - lo) / (hi - lo) * 255) in 0..255, decoded as
// lo + code * ((hi - lo) / 255) (lo exactly when hi == lo); |D(Q(z)) - z| <= (hi - lo) / 510 per element,
// plus float32 rounding. Payload: 8 ceil(N / kBlock) + N bytes per neighbour per step (about 1/4 of 4N).
// No separate error-feedback buffer: every copy of x_r (its own and its neighbours') moves by exactly D(q), so
// the copies are equal bit for bit (the same float additions of the same operands), and the part z - D(q) of a
// step is dropped; what the neighbours' models hold that x_r lacks stays in the next step's xhat_j - x_t term.
class LowPrecisionGossip {
 public:
  static constexpr size_t kBlock = 512;
  LowPrecisionGossip(comm::Communicator* group, size_t count);
  // Before the first step: x (count floats) is this rank's model, and every rank's is the same (one seed).
  void begin(const float* x);
  // After the optimizer has turned x_t into y in place (x: count floats): x <- x_{t+1}. Collective over the
  // ring neighbours.
  void exchange(float* x, int64_t s);
  // Payload bytes for count elements (per neighbour per step).
  static size_t payload_bytes(size_t count);
  // The quantizer alone (tests): out gets payload_bytes(n) bytes; decode_add: y[i] += D(q)[i].
  static void encode(const float* z, size_t n, uint8_t* out);
  static void decode_add(const uint8_t* q, size_t n, float* y);
  // This rank's copy of the model of its neighbour `from[k]` of mixing_row (tests: equal to that rank's x).
  const std::vector<float>& neighbour(size_t k) const { return xhat_[k]; }

 private:
  comm::Communicator* group_;
  size_t count_;
  MixRow row_;
  std::vector<float> x_;                   // x_t, this rank's model before the step
  std::vector<std::vector<float>> xhat_;   // one per neighbour, in row_.from order
  std::vector<float> z_;
  std::vector<uint8_t> q_;                 // own payload
  std::vector<std::vector<uint8_t>> inbox_;
};

}  // namespace mt::parallel
