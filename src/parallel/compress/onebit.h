// 1-bit Adam's compressed momentum exchange (Tang et al. 2021), the communication half of --optimizer
// onebit-adam after its freeze step (optim/onebit_adam.h has the update). Over the N data-parallel ranks, per
// tensor, with C the sign codec (codec.h "sign": 1 bit per element plus the scale mean |x|, so C(x) = mean|x|
// sign(x)), b1 the momentum decay, M the last step's synchronized momentum, g_r rank r's share of the
// gradient (the shares sum to the step's gradient G), e_r rank r's worker error and e_s the server error:
//
//   worker r   m_r = b1 M + (1-b1) N g_r        (its local momentum; the mean over r is b1 M + (1-b1) G)
//              y_r = m_r + e_r;  c_r = C(y_r);  e_r = y_r - c_r
//   exchange   each tensor has a server rank (tensors dealt in registry order to the rank serving the fewest
//              bytes so far); one all_to_all_v moves every c_r to its tensor's server
//   server     z = (1/N) sum_r c_r + e_s (payloads in rank order);  M' = C(z);  e_s = z - M'
//   exchange   a second all_to_all_v moves every server's M' payloads to every rank, which decodes them all
//
// Bytes sent per rank and step, with P = sum over tensors of 4 + ceil(n/8) and P_r the payloads rank r serves:
// (P - P_r) + (N - 1) P_r, about 2 (N-1)/N P when the servers are balanced, against 2 (N-1)/N x 4 bytes per
// element for exact data parallelism's all-reduce: about 32x fewer at any N (at N = 2 exactly P, whatever the
// balance). M' is bit-identical on every rank (one server made it); e_s lives on the tensor's server. The errors are this rank's state, kept
// per rank in checkpoints (train/exchange_state.h: a resume under the same layout continues them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "nn/params.h"

namespace mt::compress {

// Worker side on one tensor: y = x + e; writes C(y) (4 + ceil(n/8) bytes) to payload; e = y - C(y).
void sign_compress_with_error(const float* x, float* e, size_t n, uint8_t* payload);
// Server side on one tensor: z = (1/N) sum of the N decoded payloads (in the given order) + e;
// out = C(z) (decoded, or its payload); e = z - C(z).
void sign_server_payload(const uint8_t* const* payloads, int N, float* e, size_t n, uint8_t* out_payload);
void sign_server_with_error(const uint8_t* const* payloads, int N, float* e, size_t n, float* out);

class OnebitMomentumExchange {
 public:
  // params: finalized, ZeRO 0 (whole tensors); dp: the data-parallel group (null: one rank).
  OnebitMomentumExchange(nn::ParamRegistry& params, comm::Communicator* dp, float beta1);
  // g: this rank's gradient share (flat, params.size()), each element multiplied by g_scale (clipping) as
  // it is read; M: the last synchronized momentum (flat); out: the new synchronized momentum (flat; may be g).
  void exchange(const float* g, float g_scale, const float* M, float* out);
  const std::vector<float>& worker_error(size_t t) const { return ew_[t]; }
  const std::vector<float>& server_error(size_t t) const { return es_[t]; }  // meaningful on owner(t)
  int owner(size_t t) const { return owner_[t]; }
  // The errors for checkpoints: per tensor the worker error, then per tensor the server error.
  std::vector<std::vector<float>*> state_buffers() {
    std::vector<std::vector<float>*> out;
    for (auto& e : ew_) out.push_back(&e);
    for (auto& e : es_) out.push_back(&e);
    return out;
  }

 private:
  nn::ParamRegistry& params_;
  comm::Communicator* dp_;
  float b1_;
  void all_to_all(const std::vector<uint8_t>& send, const std::vector<size_t>& send_counts,
                  std::vector<uint8_t>& recv, const std::vector<size_t>& recv_counts);
  int n_ = 1, r_ = 0;
  std::vector<std::vector<float>> ew_, es_;  // per tensor
  std::vector<size_t> bytes_;                // per tensor: its sign payload
  std::vector<int> owner_;                   // per tensor: its server rank
  std::vector<size_t> owned_;                // per rank: the payload bytes it serves
  std::vector<float> y_;
};

}  // namespace mt::compress
