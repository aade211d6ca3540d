// The shared piece cache (src/data/bpe_cache.*): what is inserted is found, pieces with equal hashes are told
// apart, a piece inserted twice is kept once, a full cache refuses inserts, and concurrent writers and readers
// agree on every entry.
#include "data/bpe_cache.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace mt::data {
namespace {

std::vector<int32_t> ids_of(std::span<const int32_t> s) { return {s.begin(), s.end()}; }

TEST(PieceCache, FindsWhatWasInserted) {
  PieceCache cache(64);
  PieceCache::Writer w(cache);
  const std::string a = "hello", b = " world", c(PieceCache::kMaxBytes, 'x');
  EXPECT_TRUE(cache.find(a, PieceCache::hash(a)).empty());
  w.insert(a, PieceCache::hash(a), std::vector<int32_t>{7, 8});
  w.insert(b, PieceCache::hash(b), std::vector<int32_t>{9});
  w.insert(c, PieceCache::hash(c), std::vector<int32_t>(PieceCache::kMaxBytes, 5));
  EXPECT_EQ(ids_of(cache.find(a, PieceCache::hash(a))), (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(ids_of(cache.find(b, PieceCache::hash(b))), (std::vector<int32_t>{9}));
  EXPECT_EQ(ids_of(cache.find(c, PieceCache::hash(c))), std::vector<int32_t>(PieceCache::kMaxBytes, 5));
  EXPECT_TRUE(cache.find("hell", PieceCache::hash("hell")).empty());
  EXPECT_TRUE(cache.find(std::string("hello\0", 6), PieceCache::hash(std::string("hello\0", 6))).empty());
  EXPECT_EQ(cache.size(), 3u);
}

TEST(PieceCache, EqualHashesAreToldApartByTheBytes) {
  PieceCache cache(16);
  PieceCache::Writer w(cache);
  // The same hash for all: every piece probes from one slot, and only the bytes decide.
  const std::vector<std::string> pieces = {"ab", "ba", "abc", "xy"};
  for (size_t i = 0; i < pieces.size(); ++i) w.insert(pieces[i], 42, std::vector<int32_t>{static_cast<int32_t>(i)});
  for (size_t i = 0; i < pieces.size(); ++i)
    EXPECT_EQ(ids_of(cache.find(pieces[i], 42)), std::vector<int32_t>{static_cast<int32_t>(i)}) << pieces[i];
  EXPECT_TRUE(cache.find("aa", 42).empty());
  EXPECT_TRUE(cache.find("ab", 43).empty());  // another hash: another slot, and the stored hash differs
}

TEST(PieceCache, SecondInsertOfAPieceIsDropped) {
  PieceCache cache(16);
  PieceCache::Writer w1(cache), w2(cache);
  w1.insert("ab", PieceCache::hash("ab"), std::vector<int32_t>{1});
  w2.insert("ab", PieceCache::hash("ab"), std::vector<int32_t>{2});
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(ids_of(cache.find("ab", PieceCache::hash("ab"))), std::vector<int32_t>{1});
  w2.insert("cd", PieceCache::hash("cd"), std::vector<int32_t>{3});  // writes over w2's unpublished bytes
  EXPECT_EQ(ids_of(cache.find("cd", PieceCache::hash("cd"))), std::vector<int32_t>{3});
  EXPECT_EQ(ids_of(cache.find("ab", PieceCache::hash("ab"))), std::vector<int32_t>{1});
}

TEST(PieceCache, FullCacheRefusesInserts) {
  PieceCache cache(16);  // takes 8 entries
  PieceCache::Writer w(cache);
  for (int i = 0; i < 12; ++i) {
    const std::string p = "p" + std::to_string(i);
    w.insert(p, PieceCache::hash(p), std::vector<int32_t>{i});
  }
  EXPECT_EQ(cache.size(), 8u);
  for (int i = 0; i < 12; ++i) {
    const std::string p = "p" + std::to_string(i);
    EXPECT_EQ(cache.find(p, PieceCache::hash(p)).empty(), i >= 8) << p;
  }
}

TEST(PieceCache, SlotsForText) {
  EXPECT_EQ(PieceCache::slots_for_text(0), size_t{1} << 12);
  EXPECT_EQ(PieceCache::slots_for_text(2576674), size_t{1} << 18);  // 4 * 30 * sqrt = 193k -> 2^18
  EXPECT_EQ(PieceCache::slots_for_text(size_t{1} << 40), size_t{1} << 22);
}

TEST(PieceCache, ConcurrentWritersAndReadersAgree) {
  // Four threads insert overlapping sets of pieces (each piece's ids are a function of the piece) and read
  // everything back while the others write: every hit must carry the piece's own ids.
  PieceCache cache(size_t{1} << 14);
  auto ids_for = [](int k) { return std::vector<int32_t>{k, k + 1, k % 7}; };
  std::vector<int> bad(4, 0);
  auto work = [&](int t) {
    PieceCache::Writer w(cache);
    for (int round = 0; round < 2; ++round)
      for (int k = 0; k < 3000; ++k) {
        const int key = (k * (t + 1) + round * 997) % 4000;
        const std::string p = "piece" + std::to_string(key);
        const uint64_t h = PieceCache::hash(p);
        const std::span<const int32_t> hit = cache.find(p, h);
        if (hit.empty())
          w.insert(p, h, ids_for(key));
        else if (ids_of(hit) != ids_for(key))
          ++bad[static_cast<size_t>(t)];
      }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < 4; ++t) pool.emplace_back(work, t);
  for (std::thread& t : pool) t.join();
  EXPECT_EQ(bad, std::vector<int>(4, 0));
  size_t present = 0;
  for (int key = 0; key < 4000; ++key) {
    const std::string p = "piece" + std::to_string(key);
    const std::span<const int32_t> hit = cache.find(p, PieceCache::hash(p));
    if (!hit.empty()) {
      ++present;
      EXPECT_EQ(ids_of(hit), ids_for(key)) << p;
    }
  }
  EXPECT_EQ(cache.size(), present);  // each piece once, however the inserts raced
  EXPECT_GT(present, 3000u);
}

}  // namespace
}  // namespace mt::data
