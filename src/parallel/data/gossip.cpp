#include "parallel/data/gossip.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace mt::parallel {

namespace {

constexpr int kTag = 0x2727;  // gossip messages on the data-parallel group (p2p order is per sender and tag)

int hops(int n) {  // tau = ceil(log2 n)
  int t = 0;
  while ((1 << t) < n) t++;
  return t;
}

}  // namespace

MixRow mixing_row(GossipGraph g, int n, int r, int64_t s) {
  MT_ASSERT(n >= 1 && r >= 0 && r < n && s >= 0, "mixing_row(n=", n, ", r=", r, ", s=", s, ")");
  MixRow row;
  if (n == 1) return row;
  if (g == GossipGraph::ring) {
    if (n == 2) {
      row.self = 0.5f;
      row.from = row.to = {1 - r};
      row.weight = {0.5f};
    } else {
      row.self = 1.0f / 3.0f;
      const int left = (r + n - 1) % n, right = (r + 1) % n;
      row.from = row.to = {left, right};
      row.weight = {1.0f / 3.0f, 1.0f / 3.0f};
    }
    return row;
  }
  const int d = 1 << (int)(s % hops(n));
  row.self = 0.5f;
  row.from = {(r - d + n) % n};
  row.weight = {0.5f};
  row.to = {(r + d) % n};
  return row;
}

std::vector<double> mixing_matrix(GossipGraph g, int n, int64_t s) {
  std::vector<double> W((size_t)n * n, 0.0);
  for (int r = 0; r < n; r++) {
    const MixRow row = mixing_row(g, n, r, s);
    W[(size_t)r * n + r] += row.self;
    for (size_t k = 0; k < row.from.size(); k++) W[(size_t)r * n + row.from[k]] += row.weight[k];
  }
  return W;
}

GossipMixer::GossipMixer(comm::Communicator* group, GossipGraph g, size_t count)
    : group_(group), graph_(g), count_(count) {}

void GossipMixer::mix(float* x, int64_t s) {
  const int n = group_ ? group_->size() : 1;
  if (n == 1) return;
  const MixRow row = mixing_row(graph_, n, group_->rank(), s);
  send_.assign(x, x + count_);
  inbox_.resize(row.from.size());
  std::vector<comm::Request> reqs;
  for (size_t k = 0; k < row.from.size(); k++) {
    inbox_[k].resize(count_);
    reqs.push_back(group_->irecv(inbox_[k].data(), count_, comm::DType::f32, row.from[k], kTag));
  }
  for (int peer : row.to) reqs.push_back(group_->isend(send_.data(), count_, comm::DType::f32, peer, kTag));
  comm::wait_all(reqs);
  // x = self x + sum_k w_k x_k, left to right (n = 2: 0.5 a + 0.5 b on both ranks, the same bits).
  for (size_t i = 0; i < count_; i++) {
    float v = row.self * send_[i];
    for (size_t k = 0; k < inbox_.size(); k++) v += row.weight[k] * inbox_[k][i];
    x[i] = v;
  }
}

size_t LowPrecisionGossip::payload_bytes(size_t n) { return 8 * ((n + kBlock - 1) / kBlock) + n; }

void LowPrecisionGossip::encode(const float* z, size_t n, uint8_t* out) {
  const size_t blocks = (n + kBlock - 1) / kBlock;
  uint8_t* codes = out + 8 * blocks;
  for (size_t b = 0; b < blocks; b++) {
    const size_t i0 = b * kBlock, i1 = std::min(n, i0 + kBlock);
    float lo = z[i0], hi = z[i0];
    for (size_t i = i0; i < i1; i++) {
      lo = std::min(lo, z[i]);
      hi = std::max(hi, z[i]);
    }
    std::memcpy(out + 8 * b, &lo, 4);
    std::memcpy(out + 8 * b + 4, &hi, 4);
    const float inv = hi > lo ? 255.0f / (hi - lo) : 0.0f;
    for (size_t i = i0; i < i1; i++) {
      const float c = std::nearbyint((z[i] - lo) * inv);
      codes[i] = c >= 0.0f ? (c <= 255.0f ? (uint8_t)c : (uint8_t)255) : (uint8_t)0;  // NaN: 0 (the loss shows it)
    }
  }
}

void LowPrecisionGossip::decode_add(const uint8_t* q, size_t n, float* y) {
  const size_t blocks = (n + kBlock - 1) / kBlock;
  const uint8_t* codes = q + 8 * blocks;
  for (size_t b = 0; b < blocks; b++) {
    float lo, hi;
    std::memcpy(&lo, q + 8 * b, 4);
    std::memcpy(&hi, q + 8 * b + 4, 4);
    const float step = (hi - lo) / 255.0f;
    const size_t i0 = b * kBlock, i1 = std::min(n, i0 + kBlock);
    for (size_t i = i0; i < i1; i++) y[i] += lo + (float)codes[i] * step;
  }
}

LowPrecisionGossip::LowPrecisionGossip(comm::Communicator* group, size_t count) : group_(group), count_(count) {
  const int n = group_ ? group_->size() : 1;
  row_ = mixing_row(GossipGraph::ring, n, n == 1 ? 0 : group_->rank(), 0);
}

void LowPrecisionGossip::begin(const float* x) {
  x_.assign(x, x + count_);
  xhat_.assign(row_.from.size(), x_);  // every replica starts from the same weights
  z_.resize(count_);
  q_.resize(payload_bytes(count_));
  inbox_.assign(row_.from.size(), std::vector<uint8_t>(q_.size()));
}

void LowPrecisionGossip::exchange(float* x, int64_t s) {
  if (row_.from.empty()) return;  // one rank: the update stands
  MT_ASSERT(x_.size() == count_, "LowPrecisionGossip::exchange before begin");
  // z = (y - x_t) + sum_j w_j (xhat_j - x_t)
  for (size_t i = 0; i < count_; i++) {
    const float xt = x_[i];
    float v = x[i] - xt;
    for (size_t k = 0; k < xhat_.size(); k++) v += row_.weight[k] * (xhat_[k][i] - xt);
    z_[i] = v;
  }
  encode(z_.data(), count_, q_.data());
  std::vector<comm::Request> reqs;
  for (size_t k = 0; k < row_.from.size(); k++)
    reqs.push_back(group_->irecv(inbox_[k].data(), inbox_[k].size(), comm::DType::u8, row_.from[k], kTag));
  for (int peer : row_.to) reqs.push_back(group_->isend(q_.data(), q_.size(), comm::DType::u8, peer, kTag));
  // x_{t+1} = x_t + D(q): the same additions the neighbours make on their copies of x_t.
  decode_add(q_.data(), count_, x_.data());
  comm::wait_all(reqs);
  for (size_t k = 0; k < row_.from.size(); k++) decode_add(inbox_[k].data(), count_, xhat_[k].data());
  std::memcpy(x, x_.data(), count_ * sizeof(float));
  (void)s;
}

}  // namespace mt::parallel
