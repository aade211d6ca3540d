// Raw bytes (DType::u8) on the shared-memory backend: all_gather of odd byte counts (the compressed-gradient
// payloads use it) and broadcast move them exactly, the byte counters count bytes, and reductions of bytes are
// refused with a message saying why.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/launch.h"
#include "core/error.h"

namespace {

uint8_t byte_of(int r, size_t i) { return static_cast<uint8_t>((r * 131 + i * 7 + 3) & 0xff); }

TEST(ShmBytes, AllGatherOddCountsAndBroadcast) {
  for (int n : {1, 2, 3}) {
    for (size_t count : {size_t(1), size_t(7), size_t(1001), size_t(300001)}) {
      mt::comm::LaunchOptions lo;
      lo.nproc = n;
      lo.backend = "shm";
      lo.timeout_s = 30;
      auto res = mt::comm::run_ranks(lo, [&](mt::comm::Communicator& w) {
        const int r = w.rank();
        const mt::comm::Shard mine = mt::comm::shard_of(count, n, r);
        std::vector<uint8_t> part(mine.count + 1), all(count + 1, 0);
        for (size_t i = 0; i < mine.count; i++) part[i] = byte_of(r, mine.offset + i);
        w.reset_counters();
        w.all_gather(part.data(), all.data(), count, mt::comm::DType::u8);
        for (int q = 0; q < n; q++) {
          const mt::comm::Shard s = mt::comm::shard_of(count, n, q);
          for (size_t i = 0; i < s.count; i++)
            MT_REQUIRE(mt::Error, all[s.offset + i] == byte_of(q, s.offset + i), "byte ", s.offset + i, " from rank ",
                       q, " is ", (int)all[s.offset + i]);
        }
        const uint64_t sent = w.counters().total_sent();
        MT_REQUIRE(mt::Error, sent == count - mine.count, "all_gather of ", count, " bytes counted ", sent,
                   " sent, expected ", count - mine.count);
        std::vector<uint8_t> b(count + 1, 0);
        if (r == n - 1)
          for (size_t i = 0; i < count; i++) b[i] = byte_of(99, i);
        w.broadcast(b.data(), count, mt::comm::DType::u8, n - 1);
        for (size_t i = 0; i < count; i++)
          MT_REQUIRE(mt::Error, b[i] == byte_of(99, i), "broadcast byte ", i);
      });
      EXPECT_EQ(res.exit_code, 0) << "n=" << n << " count=" << count << ": " << res.failure;
    }
  }
}

TEST(ShmBytes, ReductionsOfBytesAreRefused) {
  mt::comm::LaunchOptions lo;
  lo.nproc = 2;
  lo.backend = "shm";
  lo.timeout_s = 30;
  auto res = mt::comm::run_ranks(lo, [&](mt::comm::Communicator& w) {
    std::vector<uint8_t> b(8, 1);
    try {
      w.all_reduce(b.data(), b.data(), 8, mt::comm::DType::u8, mt::comm::ReduceOp::sum);
    } catch (const mt::InputError& e) {
      const std::string m = e.what();
      MT_REQUIRE(mt::Error, m.find("all_reduce of u8") != std::string::npos && m.find("not reduced") != std::string::npos,
                 "unexpected message: ", m);
      return;
    }
    throw mt::Error("an all_reduce of u8 was accepted");
  });
  EXPECT_EQ(res.exit_code, 0) << res.failure;
}

}  // namespace
