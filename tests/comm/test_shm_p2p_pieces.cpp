// The shm point-to-point engine's piecewise publishing (src/comm/shm/p2p.h kPublishBytes): a send hands its bytes to
// the receiver in pieces, each with a doorbell, so that a waiting receiver copies out behind the writer; the receiver
// rings the sender back once per message or per quarter ring read, never per piece. Two engines (ranks 0 and 1) on
// one region in this process's memory, driven by the test's own threads: what each rings is counted exactly.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/shm/layout.h"
#include "comm/shm/p2p.h"
#include "core/error.h"

namespace mt::comm::shm {
namespace {

struct Region {
  std::unique_ptr<char, void (*)(void*)> mem{nullptr, std::free};
  Layout L;
  Region(int n, size_t chan_bytes) {
    const size_t bytes = Layout::bytes_for(n, 4096, chan_bytes);
    mem.reset(static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096)));
    std::memset(mem.get(), 0, bytes);
    L = Layout{mem.get(), n, 4096, chan_bytes};
  }
  uint32_t bell(int rank) const { return L.ctrl(rank).doorbell.value.load(); }
};

// A wait past its deadline throws (the engine's Poll contract): a protocol that stops moving fails the test instead
// of hanging it.
P2P::Poll deadline_poll() {
  return [](int peer, const std::string& what, Clock::time_point until, const std::function<bool()>&) {
    if (Clock::now() >= until) throw CommError(what + ": deadline passed waiting on rank " + std::to_string(peer));
  };
}

std::vector<float> pattern(size_t n, int seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = float((i * 7 + size_t(seed) * 131) % 10007);
  return v;
}

TEST(ShmP2PPieces, ASendRingsTheReceiverOncePerPiece) {
  Region r(2, size_t{2} << 20);
  P2P sender(r.L, 0, SpinPolicy{2, 200}, deadline_poll());
  const size_t bytes = (size_t{1} << 20) + 8;  // a pipeline message: 1 MB and the executor's stamp
  std::vector<char> buf(bytes, 1);
  const uint32_t before = r.bell(1);
  Request q = sender.isend(buf.data(), bytes, 1, 5, 10);
  ASSERT_TRUE(q.test()) << "the message fits the ring: the send ends in its own call";
  const uint32_t pieces = uint32_t((bytes + kPublishBytes - 1) / kPublishBytes);  // 17
  EXPECT_EQ(r.bell(1) - before, pieces) << "one doorbell per " << kPublishBytes << "-byte piece";
  // A message of one piece rings once.
  const uint32_t mid = r.bell(1);
  Request q2 = sender.isend(buf.data(), 1000, 1, 6, 10);
  ASSERT_TRUE(q2.test());
  EXPECT_EQ(r.bell(1) - mid, 1u);
}

TEST(ShmP2PPieces, AReceiverRingsTheSenderOncePerMessageWhenItReadsOnlyWholeMessages) {
  Region r(2, size_t{2} << 20);
  P2P sender(r.L, 0, SpinPolicy{2, 200}, deadline_poll());
  P2P receiver(r.L, 1, SpinPolicy{2, 200}, deadline_poll());
  const size_t n = (size_t{1} << 20) / sizeof(float);
  std::vector<float> a = pattern(n, 1), got(n);
  Request s = sender.isend(a.data(), n * sizeof(float), 1, 3, 10);
  ASSERT_TRUE(s.test());
  const uint32_t before = r.bell(0);
  Request q = receiver.irecv(got.data(), n * sizeof(float), 0, 3, 10);
  q.wait();
  EXPECT_EQ(r.bell(0) - before, 1u) << "a message read whole rings its sender once";
  EXPECT_EQ(got, a);
}

// A message four times the ring through a ring of 16 KB, both sides waiting: the sender can write only after the
// receiver has rung it, and the receiver rings only at a message's end or after a quarter ring, so this ends only
// if the quarter-ring rule holds (each read of a full ring is a quarter at least). 5 s deadline.
TEST(ShmP2PPieces, AMessageLargerThanTheRingDrainsWithTheQuarterRingDoorbell) {
  Region r(2, 16 * 1024);
  const size_t n = 16 * 1024;  // 64 KB of floats
  std::vector<float> a = pattern(n, 2), b = pattern(n, 3), got_a(n), got_b(n);
  std::atomic<bool> sender_failed{false};
  std::string sender_error;
  P2P receiver(r.L, 1, SpinPolicy{2, 200}, deadline_poll());
  std::thread t([&] {
    try {
      P2P sender(r.L, 0, SpinPolicy{2, 200}, deadline_poll());
      Request x = sender.isend(a.data(), n * sizeof(float), 1, 1, 5);
      Request y = sender.isend(b.data(), n * sizeof(float), 1, 2, 5);
      x.wait();
      y.wait();
    } catch (const std::exception& e) {
      sender_error = e.what();
      sender_failed = true;
    }
  });
  std::string recv_error;
  try {
    Request qb = receiver.irecv(got_b.data(), n * sizeof(float), 0, 2, 5);
    Request qa = receiver.irecv(got_a.data(), n * sizeof(float), 0, 1, 5);
    qa.wait();
    qb.wait();
  } catch (const std::exception& e) {
    recv_error = e.what();
  }
  t.join();
  ASSERT_FALSE(sender_failed.load()) << sender_error;
  ASSERT_TRUE(recv_error.empty()) << recv_error;
  EXPECT_EQ(got_a, a);
  EXPECT_EQ(got_b, b);
}

// Many 1 MB messages, the receiver waiting while each is published: it reads pieces as they arrive (behind the
// writer) and must still get every byte in order and tag.
TEST(ShmP2PPieces, MessagesReadWhileTheyArePublishedArriveWhole) {
  Region r(2, (size_t{2} << 20) + 4096);
  const size_t n = (size_t{1} << 20) / sizeof(float) + 2;
  const int k = 12;
  std::vector<std::vector<float>> sent;
  for (int i = 0; i < k; i++) sent.push_back(pattern(n, 10 + i));
  std::string sender_error;
  P2P receiver(r.L, 1, SpinPolicy{2, 200}, deadline_poll());
  std::thread t([&] {
    try {
      P2P sender(r.L, 0, SpinPolicy{2, 200}, deadline_poll());
      std::vector<Request> q;
      for (int i = 0; i < k; i++) q.push_back(sender.isend(sent[i].data(), n * sizeof(float), 1, 100 + i, 10));
      for (Request& x : q) x.wait();
    } catch (const std::exception& e) {
      sender_error = e.what();
    }
  });
  std::vector<float> got(n);
  for (int i = 0; i < k; i++) {
    Request q = receiver.irecv(got.data(), n * sizeof(float), 0, 100 + i, 10);
    q.wait();
    ASSERT_EQ(got, sent[i]) << "message " << i;
  }
  t.join();
  ASSERT_TRUE(sender_error.empty()) << sender_error;
}

// Reads go to the awaited channel first: a send, a posted receive and a wait whose message is there leave what has
// arrived from other ranks in their rings (read by their own calls later), so they do not delay the rank's next
// computation; a wait that has to block reads them meanwhile. Rank 1 of 3, a 1 MB message from rank 0 waiting
// unread in its ring.
TEST(ShmP2PPieces, ACallReadsItsOwnChannelAndLeavesOthersUntilItWouldBlock) {
  Region r(3, (size_t{2} << 20) + 4096);
  P2P r0(r.L, 0, SpinPolicy{2, 200}, deadline_poll());
  P2P r1(r.L, 1, SpinPolicy{2, 200}, deadline_poll());
  P2P r2(r.L, 2, SpinPolicy{2, 200}, deadline_poll());
  const size_t n = (size_t{1} << 20) / sizeof(float);
  std::vector<float> from0 = pattern(n, 4), from2 = pattern(n, 5), out = pattern(n, 6), got(n), got0(n);
  ASSERT_TRUE(r0.isend(from0.data(), n * sizeof(float), 1, 7, 10).test());
  auto unread_from_0 = [&] { return r.L.chan(0, 1).tail.load() == 0; };
  ASSERT_TRUE(r2.isend(from2.data(), n * sizeof(float), 1, 8, 10).test());
  // A send from rank 1 and a receive whose message is there: rank 0's message stays in the ring.
  ASSERT_TRUE(r1.isend(out.data(), n * sizeof(float), 2, 9, 10).test());
  EXPECT_TRUE(unread_from_0()) << "a send read another rank's message on its way out";
  Request q = r1.irecv(got.data(), n * sizeof(float), 2, 8, 10);
  q.wait();
  EXPECT_EQ(got, from2);
  EXPECT_TRUE(unread_from_0()) << "a receive whose message was there read another rank's message too";
  // A wait that blocks (rank 2 sends only once rank 0's message has been read, or after 10 s) reads it meanwhile.
  std::atomic<bool> read_while_blocked{false};
  std::thread t([&] {
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (unread_from_0() && Clock::now() < until) std::this_thread::yield();
    read_while_blocked = !unread_from_0();
    r2.isend(from2.data(), n * sizeof(float), 1, 10, 10).wait();
  });
  Request q2 = r1.irecv(got.data(), n * sizeof(float), 2, 10, 30);
  q2.wait();
  t.join();
  EXPECT_TRUE(read_while_blocked.load()) << "a blocked wait left another rank's message in its ring";
  r1.irecv(got0.data(), n * sizeof(float), 0, 7, 10).wait();
  EXPECT_EQ(got0, from0);
}

}  // namespace
}  // namespace mt::comm::shm
