#include "nn/activation_store.h"

#include <algorithm>

#include "core/error.h"
#include "offload/shard_file.h"

namespace mt::nn {

ActivationStore::ActivationStore() = default;
ActivationStore::~ActivationStore() = default;

AlignedBuffer ActivationStore::take_free(size_t count) {
  AlignedBuffer buf;
  auto f = free_.find(count);
  if (f != free_.end()) {
    buf = std::move(f->second);
    free_.erase(f);
  } else {
    buf.resize(count);
  }
  return buf;
}

float* ActivationStore::get(int mb, const std::string& name, size_t count) {
  auto key = std::make_pair(mb, name);
  auto it = live_.find(key);
  if (it != live_.end() && it->second.size() == count) return it->second.data();
  if (it == live_.end() && tier_) {
    auto s = spilled_.find(key);
    if (s != spilled_.end() && places_[key].second == count) {  // spilled: back from the file
      Spilled& sp = s->second;
      if (!sp.reading) {
        tier_->wait(sp.ticket);  // its write, if still running
        if (sp.buf.size() == 0) {
          sp.buf = take_free(count);
          sp.ticket = tier_->read_async(sp.off, count, sp.buf.data());
          live_count_ += sp.buf.bytes();
          peak_ = std::max(peak_, live_count_);
        }
      }
      tier_->wait(sp.ticket);
      float* p = sp.buf.data();
      live_[key] = std::move(sp.buf);
      spilled_.erase(s);
      return p;
    }
  }
  if (it != live_.end()) {
    live_count_ -= it->second.bytes();
    if (mb >= 0) key_bytes_[mb] -= it->second.bytes();
  }
  AlignedBuffer buf = take_free(count);
  float* p = buf.data();
  live_count_ += buf.bytes();
  peak_ = std::max(peak_, live_count_);
  // Per micro-batch: the bytes it holds (in memory or spilled to the tier), until release.
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
  for (auto it = spilled_.begin(); it != spilled_.end();) {
    if (it->first.first != mb) {
      ++it;
      continue;
    }
    tier_->wait(it->second.ticket);
    if (it->second.buf.size() != 0) {
      live_count_ -= it->second.buf.bytes();
      free_.emplace(it->second.buf.size(), std::move(it->second.buf));
    }
    it = spilled_.erase(it);
  }
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

void ActivationStore::set_tier(std::unique_ptr<offload::ShardFile> tier) {
  MT_ASSERT(spilled_.empty(), "an activation tier set while buffers are spilled");
  tier_ = std::move(tier);
}

namespace {
bool in_block(const std::pair<int, std::string>& key, int mb, const std::string& prefix) {
  return key.first == mb && key.second.compare(0, prefix.size(), prefix) == 0;
}
}  // namespace

void ActivationStore::reclaim() {
  for (auto& [key, sp] : spilled_) {
    if (sp.reading || sp.buf.size() == 0 || !tier_->done(sp.ticket)) continue;
    live_count_ -= sp.buf.bytes();
    free_.emplace(sp.buf.size(), std::move(sp.buf));
    sp.buf = AlignedBuffer();
  }
}

void ActivationStore::spill(int mb, const std::string& prefix) {
  if (!tier_) return;
  // The writes queued at the last spill (a block's forward ago) finish first: what is held stays bounded (the
  // block being computed, the one just spilled, its successor) however far the disk lags.
  for (auto& [key, sp] : spilled_)
    if (!sp.reading && sp.buf.size() != 0) tier_->wait(sp.ticket);
  reclaim();
  for (auto it = live_.begin(); it != live_.end();) {
    if (!in_block(it->first, mb, prefix)) {
      ++it;
      continue;
    }
    const size_t count = it->second.size();
    auto& place = places_[it->first];
    if (place.second != count) {  // a new place (64-byte aligned) at the end of the file
      place = {file_end_, count};
      file_end_ += (count + 15) / 16 * 16;
      tier_->reserve(file_end_);
    }
    Spilled& sp = spilled_[it->first];
    sp.buf = std::move(it->second);  // counted live until written
    sp.off = place.first;
    sp.reading = false;
    sp.ticket = tier_->write_async(sp.off, count, sp.buf.data());
    it = live_.erase(it);
  }
}

void ActivationStore::fetch(int mb, const std::string& prefix) {
  if (!tier_) return;
  reclaim();
  for (auto& [key, sp] : spilled_) {
    if (!in_block(key, mb, prefix) || sp.reading) continue;
    sp.reading = true;
    if (sp.buf.size() != 0) continue;  // still being written: its buffer still holds the data
    const size_t count = places_[key].second;
    sp.buf = take_free(count);
    live_count_ += sp.buf.bytes();
    peak_ = std::max(peak_, live_count_);
    sp.ticket = tier_->read_async(sp.off, count, sp.buf.data());
  }
}

void ActivationStore::drop(int mb, const std::string& prefix) {
  if (!tier_) return;
  for (auto it = live_.begin(); it != live_.end();) {
    if (!in_block(it->first, mb, prefix)) {
      ++it;
      continue;
    }
    live_count_ -= it->second.bytes();
    free_.emplace(it->second.size(), std::move(it->second));
    it = live_.erase(it);
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
