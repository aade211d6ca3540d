// The cache of encoded pieces that all threads encoding one text share: piece bytes (up to kMaxBytes) -> ids.
//
// Why shared: English text repeats a small set of pieces (2.5 MB of fortunes: 477k pieces of 2+ bytes, 47k
// distinct), so most of the merge loop's work is the first encoding of each distinct piece. With a cache per
// thread, every thread pays for the pieces its part has in common with the others (two halves of that text
// hold 32k and 30k distinct pieces: 1.29x the whole's misses), and two threads do some 12% more work than one.
// Shared, each distinct piece is encoded about once whatever the thread count.
//
// How: an insert-only open-addressing table (linear probing) of pointers to entries; an entry (hash, piece
// bytes, ids) is written by the thread that encoded the piece into that thread's arena (Writer) and then
// published by a compare-and-swap of a null slot (release; lookups load slots with acquire), so readers
// never take a lock and never see a half-written entry. Two threads missing the same piece at the same time
// both encode it; the second insert finds the first's entry and drops its own (a few wasted bytes). Entries
// are never changed or removed, and the arenas live as long as the cache.
//
// Limits: the slot count is fixed at construction (from an estimate of the distinct pieces, see
// slots_for_text); once half the slots are used, inserts are refused and pieces not yet cached are encoded
// every time (slower, same ids). Not a general concurrent map: no erase, no resize (a library map such as
// TBB's locks or allocates per insert and chases nodes per lookup, which is the hot path here).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

namespace mt::data {

class PieceCache {
 public:
  static constexpr size_t kMaxBytes = 64;  // longer pieces are not cached (rare, and cheap to tell apart)

  // slots: a power of two >= 16.
  explicit PieceCache(size_t slots);
  PieceCache(const PieceCache&) = delete;
  PieceCache& operator=(const PieceCache&) = delete;

  // A slot count for a text of `bytes` bytes: four times an estimate of its distinct pieces, 30 * sqrt(bytes)
  // (2.5 MB of English: 48k estimated, 47k counted), as a power of two in [2^12, 2^22] (32 KB .. 32 MB).
  static size_t slots_for_text(size_t bytes);

  static uint64_t hash(std::string_view piece);

  // The cached ids of piece (piece.size() <= kMaxBytes, h == hash(piece)); empty span when not cached.
  // Pieces of one byte are never cached (they are one token each), so an empty span always means "absent".
  std::span<const int32_t> find(std::string_view piece, uint64_t h) const;

  // One thread's way to insert: holds that thread's arena block. One Writer per thread.
  class Writer {
   public:
    explicit Writer(PieceCache& cache) : cache_(cache) {}
    // Caches ids for piece (h == hash(piece), 2 <= piece.size() <= kMaxBytes, 1 <= ids.size() <= piece.size());
    // does nothing when the cache is full or the piece is already there. Safe concurrently with find and with
    // other Writers' inserts.
    void insert(std::string_view piece, uint64_t h, std::span<const int32_t> ids);

   private:
    PieceCache& cache_;
    std::byte* block_ = nullptr;
    size_t left_ = 0;
  };

  // Entries in the table (while inserts run, it may count ones about to be published or dropped).
  size_t size() const { return size_.load(std::memory_order_relaxed); }
  size_t slots() const { return mask_ + 1; }

 private:
  // Entry layout: header, then count int32 ids, then len piece bytes; 8-byte aligned.
  struct Entry {
    uint64_t hash;
    uint32_t len, count;
    const int32_t* ids() const { return reinterpret_cast<const int32_t*>(this + 1); }
    const char* bytes() const { return reinterpret_cast<const char*>(ids() + count); }
  };
  static constexpr size_t kBlockBytes = 1 << 16;
  std::byte* new_block();

  std::unique_ptr<std::atomic<const Entry*>[]> slots_;
  size_t mask_;
  size_t limit_;  // the table never holds more entries than this (half the slots)
  // Written by inserts: on a cache line of its own, away from the fields every lookup reads.
  alignas(64) std::atomic<size_t> size_{0};
  std::mutex blocks_mu_;  // guards blocks_ (a Writer takes a new block every kBlockBytes)
  std::vector<std::unique_ptr<std::byte[]>> blocks_;
};

}  // namespace mt::data
