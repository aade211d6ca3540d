// Point-to-point messages over shared memory: tagged, any size, blocking or not.
//
// Each ordered pair (s, d) has a byte ring (Layout::ring) carrying a stream of messages, each a 16-byte
// header {bytes, tag} followed by the payload. Large messages stream: the sender writes as much as fits,
// the receiver drains into the posted buffer, each bumps the other's doorbell. The sender publishes its bytes in
// pieces of kPublishBytes (each with a doorbell), so a receiver already waiting copies out behind the writer; the
// receiver rings the sender at each message's end or after a quarter ring read. Matching is by (source,
// tag) in posting order; a message that arrives before its recv is posted is drained into a private
// "unexpected" buffer, so one tag never blocks another. Cost: one copy into the ring, one copy out.
//
// Progress happens inside isend/irecv on their own channel (eagerly, as far as the ring allows), inside test() of
// any request, inside wait() (the awaited channel first; the others' only when the wait would block, so a rank
// does not copy out another rank's message between two computations), and on a progress thread while a send has
// bytes the ring had no room for, a message is half read
// or a posted receive is larger than the ring, so a large isend/irecv pair moves while both sides compute (a
// posted receive whose message fits the ring is read by the rank's own next test, wait or call on that
// channel: no wake-up per message). That thread never spins: it sleeps in FUTEX_WAIT on this rank's doorbell and
// leaves the cores to the computation. The engine is thread-safe (one mutex); requests must not outlive
// their communicator.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <condition_variable>
#include <atomic>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/shm/layout.h"

namespace mt::comm::shm {

// A send publishes its bytes to the receiver in pieces of this size (one doorbell each): a waiting receiver starts
// copying out while the sender is still copying in. 1 MB with streaming stores is ~50 us on this work's host, one
// 64 KB piece ~3 us.
constexpr size_t kPublishBytes = 64 * 1024;

class P2P {
 public:
  // Throws if waiting on `peer` must stop (a failure, the deadline, the peer ended). `arrived` is asked after
  // the peer's exit mark has been read: a peer that sent and then ended is not to blame.
  using Poll = std::function<void(int peer, const std::string& what, Clock::time_point until,
                                  const std::function<bool()>& arrived)>;
  P2P(Layout layout, int rank, SpinPolicy spin, Poll poll);
  ~P2P();

  Request isend(const void* buf, size_t bytes, int peer, int tag, double timeout_s);
  Request irecv(void* buf, size_t bytes, int peer, int tag, double timeout_s);

  struct Op;  // one posted send or recv

  bool test(Op& op);
  void wait(Op& op);

 private:
  struct Unexpected {
    int tag;
    std::vector<char> data;
    size_t done = 0;
  };
  struct Incoming {  // the message currently arriving from one source
    bool active = false;
    int tag = 0;
    size_t bytes = 0, done = 0;
    std::shared_ptr<Op> recv;       // the matched recv, or
    std::shared_ptr<Unexpected> unexp;  // where it goes until one is posted
  };
  void progress();  // with mu_ held
  bool needs_thread() const;  // with mu_ held: a send not yet in the ring whole, a message half read, a
                              // posted receive larger than the ring
  void start_thread_if_pending();  // with mu_ held
  void progress_loop();
  void progress_send(int peer);
  void progress_recv(int src);
  void finish_unexpected(int src, std::shared_ptr<Unexpected> u);

  Layout L_;
  int me_;
  SpinPolicy spin_;
  Poll poll_;
  std::mutex mu_;
  std::vector<std::deque<std::shared_ptr<Op>>> sendq_;       // per destination, in posting order
  std::vector<std::list<std::shared_ptr<Op>>> posted_;       // per source: recvs not yet matched
  std::vector<std::deque<std::shared_ptr<Unexpected>>> unexpected_;  // per source: complete, unclaimed
  std::vector<Incoming> incoming_;
  std::vector<uint64_t> announced_;  // per source: the ring's tail when this rank last rang the sender's doorbell
  std::thread thread_;
  std::condition_variable cv_;
  std::atomic<bool> stop_{false};
};

}  // namespace mt::comm::shm
