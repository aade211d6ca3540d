#include "optim/state_store.h"

namespace mt::optim {

size_t StateStore::declare_flat(const std::string& name, size_t n) {
  buffers_.push_back({name, {(int64_t)n}, true, AlignedBuffer(n)});
  return buffers_.size() - 1;
}

size_t StateStore::declare(const std::string& name, std::vector<int64_t> shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= (size_t)d;
  buffers_.push_back({name, std::move(shape), false, AlignedBuffer(n)});
  return buffers_.size() - 1;
}

size_t StateStore::bytes() const {
  size_t b = 0;
  for (const Buffer& x : buffers_) b += x.data.bytes();
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

}  // namespace mt::optim
