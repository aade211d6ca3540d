// The shared, insert-only cache of encoded pieces; see bpe_cache.h.
#include "data/bpe_cache.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace mt::data {

PieceCache::PieceCache(size_t slots)
    : slots_(std::make_unique<std::atomic<const Entry*>[]>(slots)), mask_(slots - 1), limit_(slots / 2) {
  MT_ASSERT(slots >= 16 && std::has_single_bit(slots), "PieceCache: slots must be a power of two >= 16, got ", slots);
  for (size_t s = 0; s < slots; ++s) slots_[s].store(nullptr, std::memory_order_relaxed);
}

size_t PieceCache::slots_for_text(size_t bytes) {
  const double distinct = 30.0 * std::sqrt(static_cast<double>(bytes));
  const size_t want = static_cast<size_t>(std::min(4.0 * distinct, static_cast<double>(size_t{1} << 22)));
  return std::clamp(std::bit_ceil(std::max<size_t>(want, 1)), size_t{1} << 12, size_t{1} << 22);
}

uint64_t PieceCache::hash(std::string_view piece) {
  // 8 bytes at a time, each word mixed in by xor and an odd multiply; the length seeds it so that "a" and
  // "a\0" differ. Pieces are short (mostly under 16 bytes), so this is two or three multiplies.
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  const char* p = piece.data();
  size_t n = piece.size();
  uint64_t h = (n + 1) * 0xC2B2AE3D27D4EB4Full;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * kMul;
  }
  return h ^ (h >> 32);
}

std::span<const int32_t> PieceCache::find(std::string_view piece, uint64_t h) const {
  for (size_t s = h & mask_;; s = (s + 1) & mask_) {
    const Entry* e = slots_[s].load(std::memory_order_acquire);
    if (e == nullptr) return {};
    if (e->hash == h && e->len == piece.size() && std::memcmp(e->bytes(), piece.data(), piece.size()) == 0)
      return {e->ids(), e->count};
  }
}

std::byte* PieceCache::new_block() {
  std::lock_guard<std::mutex> lock(blocks_mu_);
  blocks_.push_back(std::make_unique_for_overwrite<std::byte[]>(kBlockBytes));
  return blocks_.back().get();
}

void PieceCache::Writer::insert(std::string_view piece, uint64_t h, std::span<const int32_t> ids) {
  MT_ASSERT(piece.size() >= 2 && piece.size() <= kMaxBytes && !ids.empty() && ids.size() <= piece.size(),
            "PieceCache: cannot cache a piece of ", piece.size(), " bytes as ", ids.size(), " ids");
  // Take one of the limit_ places first (and give it back if the piece turns out to be there already), so the
  // table never holds more than limit_ entries however many threads insert at once: probes always end.
  if (cache_.size_.load(std::memory_order_relaxed) >= cache_.limit_) return;
  if (cache_.size_.fetch_add(1, std::memory_order_relaxed) >= cache_.limit_) {
    cache_.size_.fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  const size_t need = (sizeof(Entry) + ids.size() * sizeof(int32_t) + piece.size() + 7) & ~size_t{7};
  if (need > left_) {
    block_ = cache_.new_block();
    left_ = kBlockBytes;
  }
  auto* e = new (block_) Entry{h, static_cast<uint32_t>(piece.size()), static_cast<uint32_t>(ids.size())};
  std::memcpy(const_cast<int32_t*>(e->ids()), ids.data(), ids.size() * sizeof(int32_t));
  std::memcpy(const_cast<char*>(e->bytes()), piece.data(), piece.size());
  for (size_t s = h & cache_.mask_;; s = (s + 1) & cache_.mask_) {
    const Entry* seen = nullptr;
    if (cache_.slots_[s].compare_exchange_strong(seen, e, std::memory_order_release, std::memory_order_acquire)) {
      block_ += need;  // published: the bytes now belong to the table
      left_ -= need;
      return;
    }
    // The slot holds another entry (seen): the same piece inserted by another thread, or a collision.
    if (seen->hash == h && seen->len == piece.size() && std::memcmp(seen->bytes(), piece.data(), piece.size()) == 0) {
      cache_.size_.fetch_sub(1, std::memory_order_relaxed);
      return;  // ours stays unpublished; the next insert writes over it
    }
  }
}

}  // namespace mt::data
