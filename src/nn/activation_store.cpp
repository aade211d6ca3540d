#include "nn/activation_store.h"

#include <algorithm>

namespace mt::nn {

float* ActivationStore::get(int mb, const std::string& name, size_t count) {
  auto key = std::make_pair(mb, name);
  auto it = live_.find(key);
  if (it != live_.end() && it->second.size() == count) return it->second.data();
  if (it != live_.end()) {
    live_count_ -= it->second.bytes();
    if (mb >= 0) key_bytes_[mb] -= it->second.bytes();
  }
  AlignedBuffer buf;
  auto f = free_.find(count);
  if (f != free_.end()) {
    buf = std::move(f->second);
    free_.erase(f);
  } else {
    buf.resize(count);
  }
  float* p = buf.data();
  live_count_ += buf.bytes();
  peak_ = std::max(peak_, live_count_);
  if (mb >= 0) {
    size_t& kb = key_bytes_[mb];
    kb += buf.bytes();
    peak_key_bytes_ = std::max(peak_key_bytes_, kb);
    peak_keys_ = std::max(peak_keys_, (int)key_bytes_.size());
  }
  live_[key] = std::move(buf);
  return p;
}

void ActivationStore::release(int mb) {
  key_bytes_.erase(mb);
  for (auto it = objects_.begin(); it != objects_.end();) it = it->first.first == mb ? objects_.erase(it) : std::next(it);
  for (auto it = live_.begin(); it != live_.end();) {
    if (it->first.first == mb) {
      size_t n = it->second.size();
      live_count_ -= it->second.bytes();
      free_.emplace(n, std::move(it->second));
      it = live_.erase(it);
    } else {
      ++it;
    }
  }
}

size_t ActivationStore::live_bytes() const {
  size_t b = 0;
  for (auto& [k, v] : live_) b += v.bytes();
  return b;
}

size_t ActivationStore::total_bytes() const {
  size_t b = live_bytes();
  for (auto& [k, v] : free_) b += v.bytes();
  return b;
}

}  // namespace mt::nn
