// The shm point-to-point engine's single-copy path (src/comm/shm/p2p.h kP2PCmaMinBytes): a send at or above the
// threshold puts a 32-byte record (header + descriptor) in the ring, the receiver copies the payload straight out of
// the sender's buffer (process_vm_readv) and consumes the record, which completes the send. Below the threshold the
// payload goes through the ring as before. The channel's first single-copy message is a probe: refused by the kernel
// (EPERM), its payload follows inline and the channel stays on the ring. Engines in this process share a plain
// region (process_vm_readv on this process's own pid); the refusal and dead-peer cases fork real processes over a
// shared mapping.
#include <gtest/gtest.h>

#include <linux/capability.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "comm/shm/layout.h"
#include "comm/shm/p2p.h"
#include "core/error.h"

namespace mt::comm::shm {
namespace {

constexpr size_t kHeader = 16, kRecord = 32;  // a message's header; header + single-copy descriptor

// A region shared with forked children (MAP_SHARED), zeroed.
struct SharedRegion {
  void* mem = MAP_FAILED;
  size_t bytes = 0;
  Layout L;
  SharedRegion(int n, size_t chan_bytes) {
    bytes = (Layout::bytes_for(n, 4096, chan_bytes) + 4095) / 4096 * 4096;
    mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) throw std::runtime_error("mmap failed");
    L = Layout{static_cast<char*>(mem), n, 4096, chan_bytes};
  }
  ~SharedRegion() { munmap(mem, bytes); }
  uint64_t head(int s, int d) const { return L.chan(s, d).head.load(); }
};

P2P::Poll deadline_poll() {
  return [](int peer, const std::string& what, Clock::time_point until, const std::function<bool()>&) {
    if (Clock::now() >= until) throw CommError(what + ": deadline passed waiting on rank " + std::to_string(peer));
  };
}

// As the communicator's poll does with the job's exit marks: a wait on a peer whose process has ended (and whose
// part did not arrive) fails at once, naming it; the deadline stays as the backstop.
P2P::Poll process_poll(pid_t pid) {
  return [pid](int peer, const std::string& what, Clock::time_point until, const std::function<bool()>& arrived) {
    const pid_t w = waitpid(pid, nullptr, WNOHANG);
    const bool ended = w == pid || (w < 0 && errno == ECHILD);
    if (ended && !(arrived && arrived()))
      throw CommError(what + ": rank " + std::to_string(peer) + "'s process has ended");
    if (Clock::now() >= until) throw CommError(what + ": deadline passed waiting on rank " + std::to_string(peer));
  };
}

std::vector<char> pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; i++) v[i] = char((i * 7 + size_t(seed) * 131) % 251);
  return v;
}

// Runs body in a child process; its exit code: 0 if body returned true, 1 if false, 2 if it threw.
pid_t spawn(const std::function<bool()>& body) {
  const pid_t pid = fork();
  if (pid == 0) {
    int code = 2;
    try {
      code = body() ? 0 : 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d: %s\n", int(getpid()), e.what());
    }
    _exit(code);
  }
  return pid;
}
int exit_code(pid_t pid) {
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

TEST(ShmP2PSingleCopy, SendsAtOrAboveTheThresholdPutOnlyADescriptorInTheRing) {
  SharedRegion r(2, size_t{2} << 20);
  P2P sender(r.L, 0, SpinPolicy{2, 200}, deadline_poll());
  P2P receiver(r.L, 1, SpinPolicy{2, 200}, deadline_poll());
  const size_t T = 64 * 1024;
  sender.set_single_copy_min(T);
  int tag = 0;
  for (size_t bytes : {T - 1, T, T + 1, size_t{1} << 20, (size_t{1} << 20) + 8, T - 1}) {
    SCOPED_TRACE(bytes);
    const std::vector<char> a = pattern(bytes, tag);
    std::vector<char> sent = a, got(bytes);
    const uint64_t h0 = r.head(0, 1);
    Request s = sender.isend(sent.data(), bytes, 1, tag, 10);
    const bool single = bytes >= T;
    EXPECT_EQ(r.head(0, 1) - h0, single ? kRecord : kHeader + bytes);
    EXPECT_EQ(s.test(), !single) << "a single-copy send ends when the receiver has read it, a ring send in its call";
    Request q = receiver.irecv(got.data(), bytes, 0, tag, 10);
    q.wait();
    s.wait();
    EXPECT_EQ(got, a);
    tag++;
  }
}

TEST(ShmP2PSingleCopy, ASendEndsOnlyAfterTheReceiverCopiedSoItsBufferIsFreeThenAndNotBefore) {
  SharedRegion r(2, size_t{2} << 20);
  P2P sender(r.L, 0, SpinPolicy{2, 200}, deadline_poll());
  P2P receiver(r.L, 1, SpinPolicy{2, 200}, deadline_poll());
  sender.set_single_copy_min(256 * 1024);
  const size_t bytes = (size_t{1} << 20) + 8;
  for (int round = 0; round < 3; round++) {  // the first is the channel's probe, the others run with single copy on
    SCOPED_TRACE(round);
    const std::vector<char> a = pattern(bytes, round);
    std::vector<char> buf = a, got(bytes);
    Request s = sender.isend(buf.data(), bytes, 1, 9, 10);
    EXPECT_FALSE(s.test()) << "the receiver has not read it: the sender may not reuse its buffer yet";
    EXPECT_FALSE(s.test());
    Request q = receiver.irecv(got.data(), bytes, 0, 9, 10);
    q.wait();
    EXPECT_TRUE(s.test()) << "read: the send has ended";
    std::memset(buf.data(), 0x5a, bytes);  // the sender's again
    EXPECT_EQ(got, a);
  }
}

TEST(ShmP2PSingleCopy, ManyInFlightOnOneChannelArriveWholeMatchedByTagInPostingOrder) {
  SharedRegion r(2, size_t{2} << 20);
  P2P sender(r.L, 0, SpinPolicy{2, 200}, deadline_poll());
  P2P receiver(r.L, 1, SpinPolicy{2, 200}, deadline_poll());
  const size_t T = 64 * 1024;
  sender.set_single_copy_min(T);
  {  // the channel's probe: while it is out nothing is written behind it
    std::vector<char> a = pattern(T, 99), b = pattern(100, 98), ga(T), gb(100);
    Request s1 = sender.isend(a.data(), T, 1, 100, 10);
    const uint64_t h = r.head(0, 1);
    Request s2 = sender.isend(b.data(), 100, 1, 101, 10);
    EXPECT_EQ(r.head(0, 1), h) << "a send behind the channel's probe waits for the probe's answer";
    Request q1 = receiver.irecv(ga.data(), T, 0, 100, 10), q2 = receiver.irecv(gb.data(), 100, 0, 101, 10);
    q1.wait();
    q2.wait();
    s1.wait();
    s2.wait();
    EXPECT_EQ(ga, a);
    EXPECT_EQ(gb, b);
  }
  // Twelve sends in flight at once, single-copy and ring ones interleaved, two tags used twice (matched in posting
  // order), received partly out of order (those arrive unexpected and are read into the engine's own buffers).
  struct Msg {
    int tag;
    size_t bytes;
  };
  const std::vector<Msg> msgs = {{1, T},        {2, 1000},    {3, 3 * T},  {7, 2 * T + 5}, {4, T - 1}, {7, 2 * T + 5},
                                 {5, 1 << 20},  {6, 17},      {8, T + 1},  {9, 200000},    {8, T + 1}, {10, 0}};
  std::vector<std::vector<char>> sent, got;
  std::vector<Request> sends, recvs;
  for (size_t i = 0; i < msgs.size(); i++) {
    sent.push_back(pattern(msgs[i].bytes, int(i)));
    got.emplace_back(msgs[i].bytes);
  }
  for (size_t i = 0; i < msgs.size(); i++) sends.push_back(sender.isend(sent[i].data(), msgs[i].bytes, 1, msgs[i].tag, 10));
  // Mostly last first; within each same-tag pair (3 and 5, 8 and 10) the earlier message's receive first.
  const std::vector<size_t> order = {11, 8, 9, 10, 7, 6, 3, 4, 5, 2, 1, 0};
  for (size_t i : order) recvs.push_back(receiver.irecv(got[i].data(), msgs[i].bytes, 0, msgs[i].tag, 10));
  wait_all(recvs);
  wait_all(sends);
  for (size_t i = 0; i < msgs.size(); i++) EXPECT_EQ(got[i], sent[i]) << "message " << i << " tag " << msgs[i].tag;
}

// A process that may not read another's memory: without CAP_SYS_PTRACE in its effective set, and its peer not
// dumpable, process_vm_readv fails with EPERM (as where ptrace access is restricted).
bool drop_ptrace() {
  __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct d[2]{};
  if (syscall(SYS_capget, &h, d) != 0) return false;
  d[0].effective &= ~(1u << CAP_SYS_PTRACE);
  return syscall(SYS_capset, &h, d) == 0;
}

TEST(ShmP2PSingleCopy, ARefusedReadTakesThePayloadInlineAndTheChannelStaysOnTheRing) {
  SharedRegion r(2, size_t{2} << 20);
  const size_t T = 64 * 1024;
  const std::vector<size_t> sizes = {4 * T, 5 * T + 3, 100, size_t{1} << 20};
  const pid_t sender = spawn([&] {
    prctl(PR_SET_DUMPABLE, 0);  // before its first descriptor is out
    P2P s(r.L, 0, SpinPolicy{2, 200}, deadline_poll());
    s.set_single_copy_min(T);
    std::vector<std::vector<char>> bufs;
    std::vector<Request> reqs;
    for (size_t i = 0; i < sizes.size(); i++) bufs.push_back(pattern(sizes[i], int(i)));
    for (size_t i = 0; i < sizes.size(); i++) reqs.push_back(s.isend(bufs[i].data(), sizes[i], 1, int(i), 10));
    wait_all(reqs);
    return true;
  });
  const pid_t receiver = spawn([&] {
    if (!drop_ptrace()) return false;
    P2P q(r.L, 1, SpinPolicy{2, 200}, deadline_poll());
    bool ok = true;
    for (size_t i = 0; i < sizes.size(); i++) {
      std::vector<char> got(sizes[i]);
      q.irecv(got.data(), sizes[i], 0, int(i), 10).wait();
      ok = ok && got == pattern(sizes[i], int(i));
    }
    return ok;
  });
  EXPECT_EQ(exit_code(sender), 0);
  EXPECT_EQ(exit_code(receiver), 0) << "the receiver got every message whole";
  // The probe's record, its payload inline, then the other three through the ring with their headers.
  size_t ring = kRecord + sizes[0];
  for (size_t i = 1; i < sizes.size(); i++) ring += kHeader + sizes[i];
  EXPECT_EQ(r.head(0, 1), ring) << "the refused channel carried every payload through the ring";
}

TEST(ShmP2PSingleCopy, AReceiveFromASenderThatEndedMidMessageFailsNamingIt) {
  SharedRegion r(2, size_t{2} << 20);
  const size_t T = 64 * 1024;
  // The sender's first message goes through (the channel's single copy is on); then it ends with its second one's
  // descriptor out and unread: its buffer is gone with it.
  const pid_t child = spawn([&] {
    P2P s(r.L, 0, SpinPolicy{2, 200}, deadline_poll());
    s.set_single_copy_min(T);
    std::vector<char> a = pattern(2 * T, 1), b = pattern(2 * T, 2);
    s.isend(a.data(), a.size(), 1, 1, 10).wait();
    Request lost = s.isend(b.data(), b.size(), 1, 2, 10);
    return true;  // ends without waiting for it
  });
  P2P q(r.L, 1, SpinPolicy{2, 200}, process_poll(child));
  std::vector<char> got(2 * T);
  q.irecv(got.data(), got.size(), 0, 1, 10).wait();
  EXPECT_EQ(got, pattern(2 * T, 1));
  EXPECT_EQ(exit_code(child), 0);
  try {
    q.irecv(got.data(), got.size(), 0, 2, 10).wait();
    ADD_FAILURE() << "a receive from a process that ended before its copy succeeded";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("from rank 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("has ended"), std::string::npos) << e.what();
  }
}

TEST(ShmP2PSingleCopy, AProbeFromASenderThatEndedIsReportedNotAHang) {
  SharedRegion r(2, size_t{2} << 20);
  const size_t T = 64 * 1024;
  const pid_t child = spawn([&] {
    P2P s(r.L, 0, SpinPolicy{2, 200}, deadline_poll());
    s.set_single_copy_min(T);
    std::vector<char> a = pattern(2 * T, 1);
    Request lost = s.isend(a.data(), a.size(), 1, 1, 10);
    return true;  // ends with the channel's probe out and unread
  });
  EXPECT_EQ(exit_code(child), 0);
  P2P q(r.L, 1, SpinPolicy{2, 200}, process_poll(child));
  std::vector<char> got(2 * T);
  const auto t0 = Clock::now();
  try {
    q.irecv(got.data(), got.size(), 0, 1, 10).wait();
    ADD_FAILURE() << "a receive from a process that ended before its copy succeeded";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("has ended"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5)) << "reported by the poll, not by the 10 s deadline";
}

TEST(ShmP2PSingleCopy, ASenderWhoseReceiverEndedWithoutReadingFailsInsteadOfWaiting) {
  SharedRegion r(2, size_t{2} << 20);
  const size_t T = 64 * 1024;
  const pid_t child = spawn([&] {
    P2P q(r.L, 1, SpinPolicy{2, 200}, deadline_poll());
    return true;  // ends without reading anything
  });
  P2P s(r.L, 0, SpinPolicy{2, 200}, process_poll(child));
  s.set_single_copy_min(T);
  std::vector<char> a = pattern(2 * T, 1);
  Request x = s.isend(a.data(), a.size(), 1, 1, 10);
  const auto t0 = Clock::now();
  try {
    x.wait();
    ADD_FAILURE() << "a single-copy send completed without its receiver";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("has ended"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5)) << "reported by the poll, not by the 10 s deadline";
}

}  // namespace
}  // namespace mt::comm::shm
