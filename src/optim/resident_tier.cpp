#include "optim/resident_tier.h"

#include <cstring>

#include "core/error.h"

namespace mt::optim {

ResidentTier::ResidentTier(size_t buffers, size_t n, size_t tile_elems) : n_(n), T_(tile_elems) {
  MT_ASSERT(T_ > 0, "a resident tier with empty tiles");
  bufs_.resize(buffers);
}

std::vector<AlignedBuffer>& ResidentTier::bufs() {
  for (AlignedBuffer& b : bufs_) b.resize(n_);  // zeroed once, at the first use (as a store's own buffers)
  return bufs_;
}

void ResidentTier::read(size_t j, size_t offset, size_t count, float* out) {
  MT_ASSERT(j < bufs_.size() && offset + count <= n_, "resident tier read out of range");
  std::memcpy(out, bufs()[j].data() + offset, sizeof(float) * count);
}

void ResidentTier::write(size_t j, size_t offset, size_t count, const float* in) {
  MT_ASSERT(j < bufs_.size() && offset + count <= n_, "resident tier write out of range");
  std::memcpy(bufs()[j].data() + offset, in, sizeof(float) * count);
}

std::vector<float*> ResidentTier::acquire(size_t t) {
  MT_ASSERT(t < tiles(), "resident tier tile ", t, " of ", tiles());
  std::vector<float*> w;
  for (AlignedBuffer& b : bufs()) w.push_back(b.data() + t * T_);
  return w;
}

}  // namespace mt::optim
