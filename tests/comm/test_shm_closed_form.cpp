// The moving collectives of the shm backend (all_gather, broadcast, all_to_all, all_to_all_v) against closed
// forms: every rank fills its buffers from its rank and index, and checks every element of what arrives
// against the formula for the rank it came from. Rank counts 1..4; sizes 0, 1, small, and around the chunk
// boundaries of the default 512 KB slot (a slot cut into n-1 pieces for all_to_all, whole for all_gather);
// uneven all_to_all_v splits with empty and one-element blocks. f32 and u8 (raw bytes). comm_shm_tiny_slots
// runs this file again with 4 KB slots (hundreds of chunks per call).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/copy.h"
#include "comm/launch.h"
#include "core/error.h"
#include "tests/comm/shm_launch.h"

namespace mt::comm {
namespace {

// Element i of what rank `from` sends to rank `to` under operation `op` (0 all_gather, 1 broadcast,
// 2 all_to_all, 3 all_to_all_v), as a value exact in f32, and its low byte for u8.
uint32_t value_of(int op, int from, int to, size_t i) {
  return static_cast<uint32_t>((op * 977 + from * 131 + to * 17 + i * 7 + i / 251) % 100003);
}

struct Typed {
  DType t;
  size_t e() const { return dtype_size(t); }
  void set(std::vector<char>& b, size_t i, uint32_t v) const {
    if (t == DType::f32) {
      float f = static_cast<float>(v);
      std::memcpy(&b[i * 4], &f, 4);
    } else {
      b[i] = static_cast<char>(v & 0xff);
    }
  }
  bool is(const std::vector<char>& b, size_t i, uint32_t v) const {
    if (t == DType::f32) {
      float f;
      std::memcpy(&f, &b[i * 4], 4);
      return f == static_cast<float>(v);
    }
    return static_cast<uint8_t>(b[i]) == static_cast<uint8_t>(v & 0xff);
  }
};

// Fails the rank with the first element that differs from `want(i)`, i < count, at buf + first.
template <typename Want>
void expect_elems(const Typed& ty, const std::vector<char>& buf, size_t first, size_t count, Want&& want,
                  const std::string& what) {
  for (size_t i = 0; i < count; ++i) {
    MT_REQUIRE(Error, ty.is(buf, first + i, want(i)), what, ": element ", i, " of ", count, " differs from ", want(i));
  }
}

// A sentinel the collectives must not write (the gaps between all_to_all_v blocks, past the end).
constexpr uint32_t kUntouched = 99991;

void gather_and_broadcast(Communicator& w, const Typed& ty, size_t count) {
  const int n = w.size(), r = w.rank();
  const std::string tag = str(dtype_name(ty.t), " n=", n, " count=", count, " rank ", r);
  // all_gather out of place and in place: shard q of the result is rank q's.
  const Shard own = shard_of(count, n, r);
  std::vector<char> part((own.count + 1) * ty.e()), all((count + 1) * ty.e());
  for (size_t i = 0; i < own.count; ++i) ty.set(part, i, value_of(0, r, 0, own.offset + i));
  for (int in_place = 0; in_place < 2; ++in_place) {
    for (size_t i = 0; i <= count; ++i) ty.set(all, i, kUntouched);
    if (in_place) {
      for (size_t i = 0; i < own.count; ++i) ty.set(all, own.offset + i, value_of(0, r, 0, own.offset + i));
      w.all_gather(all.data() + own.offset * ty.e(), all.data(), count, ty.t);
    } else {
      w.all_gather(part.data(), all.data(), count, ty.t);
    }
    for (int q = 0; q < n; ++q) {
      const Shard s = shard_of(count, n, q);
      expect_elems(ty, all, s.offset, s.count, [&](size_t i) { return value_of(0, q, 0, s.offset + i); },
                   str("all_gather", in_place ? " in place " : " ", tag, ", shard of rank ", q));
    }
    expect_elems(ty, all, count, 1, [](size_t) { return kUntouched; }, str("all_gather ", tag, ", past the end"));
  }
  // broadcast from every root.
  std::vector<char> buf((count + 1) * ty.e());
  for (int root = 0; root < n; ++root) {
    for (size_t i = 0; i <= count; ++i) ty.set(buf, i, r == root && i < count ? value_of(1, root, 0, i) : kUntouched);
    w.broadcast(buf.data(), count, ty.t, root);
    expect_elems(ty, buf, 0, count, [&](size_t i) { return value_of(1, root, 0, i); },
                 str("broadcast root ", root, " ", tag));
    expect_elems(ty, buf, count, 1, [](size_t) { return kUntouched; }, str("broadcast ", tag, ", past the end"));
  }
}

void all_to_all_blocks(Communicator& w, const Typed& ty, size_t k) {
  const int n = w.size(), r = w.rank();
  const std::string tag = str(dtype_name(ty.t), " n=", n, " k=", k, " rank ", r);
  std::vector<char> send((k * n + 1) * ty.e()), recv((k * n + 1) * ty.e());
  for (int in_place = 0; in_place < 2; ++in_place) {
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < k; ++i) ty.set(send, q * k + i, value_of(2, r, q, i));
    }
    ty.set(send, k * n, kUntouched);
    for (size_t i = 0; i <= k * n; ++i) ty.set(recv, i, kUntouched);
    std::vector<char>& out = in_place ? send : recv;
    w.all_to_all(send.data(), out.data(), k, ty.t);
    for (int p = 0; p < n; ++p) {
      expect_elems(ty, out, p * k, k, [&](size_t i) { return value_of(2, p, r, i); },
                   str("all_to_all", in_place ? " in place " : " ", tag, ", block from rank ", p));
    }
    expect_elems(ty, out, k * n, 1, [](size_t) { return kUntouched; }, str("all_to_all ", tag, ", past the end"));
    if (!in_place) {  // the send buffer is left as it was
      for (int q = 0; q < n; ++q) {
        expect_elems(ty, send, q * k, k, [&](size_t i) { return value_of(2, r, q, i); },
                     str("all_to_all ", tag, ", send block ", q, " changed"));
      }
    }
  }
}

// Rank p sends cnt(p, q) elements to rank q: an uneven split with empty and one-element blocks (unit 0 makes
// every block 0 or 1 elements). Blocks sit in reverse rank order with gaps (explicit offsets), or packed
// (null offsets).
template <typename Count>
void all_to_all_v_counts(Communicator& w, const Typed& ty, Count&& cnt, bool packed, const std::string& what);

void all_to_all_v_uneven(Communicator& w, const Typed& ty, size_t unit, int salt, bool packed) {
  auto cnt = [&](int p, int q) {
    const size_t m = static_cast<size_t>((p * 5 + q * 3 + salt) % 4);  // 0..3
    return m == 0 ? size_t(0) : m == 1 ? size_t(1) : (m - 1) * unit + m;
  };
  all_to_all_v_counts(w, ty, cnt, packed, str("unit=", unit, " salt=", salt));
}

// Rank p sends cnt(p, q) elements to rank q, laid out as all_to_all_v_uneven describes; every element that
// arrives is checked against the closed form, and the gaps and the element past the end against the sentinel.
template <typename Count>
void all_to_all_v_counts(Communicator& w, const Typed& ty, Count&& cnt, bool packed, const std::string& what) {
  const int n = w.size(), r = w.rank();
  const size_t gap = packed ? 0 : 3;
  std::vector<size_t> sc(n), so(n), rc(n), ro(n);
  size_t stot = 0, rtot = 0;
  for (int j = packed ? 0 : n - 1; packed ? j < n : j >= 0; j += packed ? 1 : -1) {
    sc[j] = cnt(r, j);
    so[j] = stot;
    stot += sc[j] + gap;
    rc[j] = cnt(j, r);
    ro[j] = rtot;
    rtot += rc[j] + gap;
  }
  const std::string tag = str(dtype_name(ty.t), " n=", n, " ", what, packed ? " packed" : "", " rank ", r);
  std::vector<char> send((stot + 1) * ty.e()), recv((rtot + 1) * ty.e());
  for (size_t i = 0; i <= stot; ++i) ty.set(send, i, kUntouched);
  for (size_t i = 0; i <= rtot; ++i) ty.set(recv, i, kUntouched);
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < sc[q]; ++i) ty.set(send, so[q] + i, value_of(3, r, q, i));
  }
  w.all_to_all_v(send.data(), sc.data(), packed ? nullptr : so.data(), recv.data(), rc.data(),
                 packed ? nullptr : ro.data(), ty.t);
  for (int p = 0; p < n; ++p) {
    expect_elems(ty, recv, ro[p], rc[p], [&](size_t i) { return value_of(3, p, r, i); },
                 str("all_to_all_v ", tag, ", block from rank ", p, " (", rc[p], " elements)"));
    const size_t end = ro[p] + rc[p];
    expect_elems(ty, recv, end, gap, [](size_t) { return kUntouched; }, str("all_to_all_v ", tag, ", gap written"));
  }
  expect_elems(ty, recv, rtot, 1, [](size_t) { return kUntouched; }, str("all_to_all_v ", tag, ", past the end"));
}

// The slot in use (MESHTRAIN_SHM_SLOT_KB, as the launcher reads it; 512 KB by default).
size_t slot_bytes() {
  const char* s = std::getenv("MESHTRAIN_SHM_SLOT_KB");
  return s ? size_t(std::atol(s)) * 1024 : size_t(512) * 1024;
}
// Per-rank f32 element counts around the chunk boundaries: all_gather chunks a shard by slot/4 elements,
// all_to_all pieces hold slot/(n-1) bytes rounded down to cache lines (131072, 65536, 43680 f32 for n = 2, 3,
// 4 with the default slot), and 0, 1, 2, 3, 1000.
std::vector<size_t> counts_for(int n) {
  const size_t chunk = slot_bytes() / 4, piece = slot_bytes() / size_t(std::max(n - 1, 1)) / 64 * 64 / 4;
  return {0, 1, 2, 3, 1000, piece - 1, piece + 1, chunk - 1, chunk + 1};
}

class ShmClosedForm : public ::testing::TestWithParam<int> {};

TEST_P(ShmClosedForm, AllGatherAndBroadcast) {
  const int n = GetParam();
  auto res = run_ranks(testing::shm_opts(n), [&](Communicator& w) {
    for (DType t : {DType::f32, DType::u8}) {
      for (size_t k : counts_for(n)) gather_and_broadcast(w, Typed{t}, k * size_t(n) + (k % 3));
    }
  });
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

TEST_P(ShmClosedForm, AllToAll) {
  const int n = GetParam();
  auto res = run_ranks(testing::shm_opts(n), [&](Communicator& w) {
    for (DType t : {DType::f32, DType::u8}) {
      for (size_t k : counts_for(n)) all_to_all_blocks(w, Typed{t}, k);
    }
  });
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

TEST_P(ShmClosedForm, AllToAllVUnevenSplits) {
  const int n = GetParam();
  auto res = run_ranks(testing::shm_opts(n), [&](Communicator& w) {
    for (DType t : {DType::f32, DType::u8}) {
      const std::vector<size_t> c = counts_for(n);
      for (size_t unit : {size_t(0), size_t(1), size_t(13), c[5], c[8]}) {
        for (int salt = 0; salt < 4; ++salt) all_to_all_v_uneven(w, Typed{t}, unit, salt, salt % 2 == 1);
      }
    }
  });
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShmClosedForm, ::testing::Values(1, 2, 3, 4));

// Slots too small to carry every rank's count row next to one cache line per peer (4 KB slots, 56 ranks:
// a 1 KB row + 55 lines > 4 KB) exchange the counts in a step of their own first; same closed form.
TEST(ShmClosedFormCounts, AllToAllVCountsInOwnStep) {
  const char* saved = std::getenv("MESHTRAIN_SHM_SLOT_KB");
  std::string keep = saved ? saved : "";
  setenv("MESHTRAIN_SHM_SLOT_KB", "4", 1);
  auto res = run_ranks(testing::shm_opts(56), [&](Communicator& w) {
    for (size_t unit : {size_t(0), size_t(5)}) all_to_all_v_uneven(w, Typed{DType::f32}, unit, 1, false);
  });
  if (saved) {
    setenv("MESHTRAIN_SHM_SLOT_KB", keep.c_str(), 1);
  } else {
    unsetenv("MESHTRAIN_SHM_SLOT_KB");
  }
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

// Sets an environment variable for one scope (the ranks are forked inside it and read it when their
// communicators are made), then restores it.
struct ScopedEnv {
  std::string name, saved;
  bool had;
  ScopedEnv(const char* n, const char* v) : name(n), had(std::getenv(n) != nullptr) {
    if (had) saved = std::getenv(n);
    setenv(n, v, 1);
  }
  ~ScopedEnv() {
    if (had) {
      setenv(name.c_str(), saved.c_str(), 1);
    } else {
      unsetenv(name.c_str());
    }
  }
};

// all_to_all_v goes single copy when ANY rank's send buffer reaches the threshold (here 1 KB): ranks whose own
// send buffers are below it (a few elements, or nothing at all) write no staged blocks then and must read and
// be read by single copy too. Rank `big` sends 300 f32 (1200 B) to every rank, the others 0-3 elements; a
// round where nobody reaches it stays staged. 2-4 ranks, offsets in reverse order with gaps, and packed.
TEST(ShmClosedFormCounts, AllToAllVSingleCopyWhenOneRankReachesIt) {
  ScopedEnv thr("MESHTRAIN_SHM_CMA_GATHER_KB", "1");
  for (int n : {2, 3, 4}) {
    auto res = run_ranks(testing::shm_opts(n), [&](Communicator& w) {
      for (int big = -1; big < w.size(); ++big) {
        auto cnt = [&](int p, int q) { return p == big ? size_t(300) : size_t((p * 5 + q * 3 + big + 1) % 4); };
        for (bool packed : {false, true}) all_to_all_v_counts(w, Typed{DType::f32}, cnt, packed, str("big=", big));
      }
      // Only one rank sends anything; the others have empty send buffers.
      auto lone = [&](int p, int q) { return p == 1 ? size_t(400 + q) : size_t(0); };
      all_to_all_v_counts(w, Typed{DType::f32}, lone, false, "lone sender");
    });
    EXPECT_EQ(res.exit_code, 0) << "n=" << n << ", rank " << res.failed_rank << ": " << res.failure;
  }
}

// all_to_all with rank 0 in place and the others out of place (a rank in place vetoes single copy).
void all_to_all_rank0_in_place(Communicator& w, const Typed& ty, size_t k) {
  const int n = w.size(), r = w.rank();
  std::vector<char> send(k * n * ty.e()), recv(k * n * ty.e());
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < k; ++i) ty.set(send, q * k + i, value_of(2, r, q, i));
  }
  std::vector<char>& out = r == 0 ? send : recv;
  w.all_to_all(send.data(), out.data(), k, ty.t);
  for (int p = 0; p < n; ++p) {
    expect_elems(ty, out, p * k, k, [&](size_t i) { return value_of(2, p, r, i); },
                 str("all_to_all, rank 0 in place, n=", n, " k=", k, " rank ", r, ", block from rank ", p));
  }
}

// The middle sizes (here 1 KB up to the 16 MB single-copy threshold) go single copy when any rank's stores into
// shared memory stream (the slow regime), staged otherwise; the ranks agree in the first step. Each rank's store
// policy is fixed here: nobody streams, one rank does (each in turn), everybody does. Sizes below and above 1 KB;
// all_gather out of place and in place, all_to_all out of place, with rank 0 in place (a veto), and all_to_all_v.
TEST(ShmClosedFormCounts, MiddleSizesSingleCopyWhenAnyRankStreams) {
  ScopedEnv slow("MESHTRAIN_SHM_CMA_SLOW_KB", "1");
  ScopedEnv thr("MESHTRAIN_SHM_CMA_GATHER_KB", "16384");
  for (int n : {2, 3}) {
    auto res = run_ranks(testing::shm_opts(n), [&](Communicator& w) {
      for (int streamer = -1; streamer <= w.size(); ++streamer) {  // -1: nobody; size(): everybody
        copy_in_policy() = CopyInPolicy::fixed(streamer == w.size() || w.rank() == streamer);
        for (size_t k : {size_t(100), size_t(300), size_t(5000), size_t(140000)}) {
          gather_and_broadcast(w, Typed{DType::f32}, k * size_t(w.size()) + 1);
          all_to_all_blocks(w, Typed{DType::f32}, k);
          all_to_all_rank0_in_place(w, Typed{DType::f32}, k);
          auto cnt = [&](int p, int q) { return (k * size_t(p + 1) + size_t(q)) % (2 * k); };
          all_to_all_v_counts(w, Typed{DType::f32}, cnt, false, str("k=", k, " streamer=", streamer));
        }
      }
    });
    EXPECT_EQ(res.exit_code, 0) << "n=" << n << ", rank " << res.failed_rank << ": " << res.failure;
  }
}

}  // namespace
}  // namespace mt::comm
