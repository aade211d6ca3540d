#include "optim/state_store.h"

#include <cstring>

#include "core/error.h"

namespace mt::optim {

size_t StateStore::declare_flat(const std::string& name, size_t n) {
  buffers_.push_back({name, {(int64_t)n}, true, AlignedBuffer(), n, nullptr});
  return buffers_.size() - 1;
}

size_t StateStore::declare(const std::string& name, std::vector<int64_t> shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= (size_t)d;
  buffers_.push_back({name, std::move(shape), false, AlignedBuffer(), n, nullptr});
  return buffers_.size() - 1;
}

float* StateStore::data(size_t k) {
  Buffer& b = buffers_[k];
  if (tier_ && b.flat) {
    MT_ASSERT(b.window, "offloaded optimizer state \"", b.name, "\" reached outside a tile of the tiled update");
    return b.window;
  }
  if (b.data.size() != b.n) b.data.resize(b.n);  // first use: allocated and zeroed now
  return b.data.data();
}

size_t StateStore::bytes() const {
  size_t b = 0;
  for (const Buffer& x : buffers_)
    if (!(tier_ && x.flat)) b += x.n * sizeof(float);  // declared: allocated at the first data()
  return b + (tier_ ? tier_->resident_bytes() : 0);
}

size_t StateStore::offloaded_bytes() const {
  size_t b = 0;
  if (tier_ && !tier_->in_memory())
    for (const Buffer& x : buffers_)
      if (x.flat) b += x.n * sizeof(float);
  return b;
}

std::vector<size_t> StateStore::flat() const {
  std::vector<size_t> out;
  for (size_t k = 0; k < buffers_.size(); k++)
    if (buffers_[k].flat) out.push_back(k);
  return out;
}

std::vector<size_t> StateStore::factored() const {
  std::vector<size_t> out;
  for (size_t k = 0; k < buffers_.size(); k++)
    if (!buffers_[k].flat) out.push_back(k);
  return out;
}

void StateStore::visit(size_t k, bool modify, const std::function<void(float*, size_t)>& fn) {
  Buffer& b = buffers_[k];
  if (!tier_ || !b.flat) {
    fn(data(k), b.n);
    return;
  }
  size_t j = 0;
  for (size_t i = 0; i < k; i++) j += buffers_[i].flat ? 1 : 0;
  AlignedBuffer copy(b.n);
  tier_->read(j, 0, b.n, copy.data());
  fn(copy.data(), b.n);
  if (modify) tier_->write(j, 0, b.n, copy.data());
}

void StateStore::attach(std::unique_ptr<StateTier> tier) {
  MT_ASSERT(!tier_, "a state store takes one tier");
  for (const Buffer& b : buffers_)
    MT_ASSERT(!b.flat || b.data.size() == 0, "state buffer \"", b.name, "\" was used before its tier was attached");
  tier_ = std::move(tier);
}

}  // namespace mt::optim
