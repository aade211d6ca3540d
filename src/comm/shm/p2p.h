// Point-to-point messages over shared memory: tagged, any size, blocking or not.
//
// Each ordered pair (s, d) has a byte ring (Layout::ring) carrying a stream of messages, each a 16-byte
// header {bytes, tag} followed by the payload. Large messages stream: the sender writes as much as fits,
// the receiver drains into the posted buffer, each bumps the other's doorbell. The sender publishes its bytes in
// pieces of kPublishBytes (each with a doorbell), so a receiver already waiting copies out behind the writer; the
// receiver rings the sender at each message's end or after a quarter ring read. Matching is by (source,
// tag) in posting order; a message that arrives before its recv is posted is drained into a private
// "unexpected" buffer, so one tag never blocks another. Cost: one copy into the ring, one copy out; with single
// copy turned on (below), one copy by the receiver straight from the sender's buffer for large messages.
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

// Single copy: a send of at least this many bytes puts only a descriptor in the ring (the sender's pid, the buffer's
// address and size); the receiver copies the payload straight out of the sender's buffer with process_vm_readv
// (comm/shm/cma.h) and then consumes the descriptor, which is the sender's ack: the send completes when the receiver
// has read it (not in isend), which is what isend's contract already allows. The sender's cost per send is writing
// 32 bytes and a doorbell; the receiver does one copy instead of two.
//
// Off by default: MESHTRAIN_SHM_P2P_CMA_KB=256 (this constant, the size it was measured at) turns it on from that
// many KB; MESHTRAIN_SHM_CMA=0 keeps it off. On this work's 2-core Zen 5 guest (bench pipeline --stages 4, m 8,
// 1 MB, alternating pairs; bench/results/pipeline/zbv3_2026-11-27.md) it cut the sender's time per send from
// 0.07 to 0.01 ms but raised a waiting receiver's latency from 0.17-0.19 to 0.26-0.28 ms: process_vm_readv of 1 MB
// costs ~70 us against ~17 us for a memcpy of the same bytes from shared memory, and the receiver's copy no longer
// overlaps its wake-up (the ring's pieces let it copy behind the writer). zb-v / 1F1B did not move (0.780 against
// 0.781 means of 3 pairs twice).
//
// Fallback where the kernel refuses (EPERM without ptrace access): the first single-copy message on each channel is a
// probe, and the sender writes nothing behind it until the receiver has consumed it. If the receiver's read failed it
// says so in the descriptor's status word and expects the payload inline right behind the descriptor; the sender
// writes it there and sends everything after it on that channel through the ring. A read that fails after the
// channel's first one worked (the sender's process has ended: ESRCH) fails that receive with an error naming the rank.
constexpr size_t kP2PCmaMinBytes = 256 * 1024;

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

  // Sends of at least `bytes` go by single copy (0: none). The constructor sets the environment's (default none).
  void set_single_copy_min(size_t bytes);

 private:
  struct Unexpected {
    int tag;
    std::vector<char> data;
    size_t done = 0;
    std::string error;  // a single-copy read that failed: the recv that claims it gets this error
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
  uint64_t reap_acks(int peer);
  void read_single_copy(int src, uint64_t pos);  // with mu_ held: `pos` is the descriptor, after its header  // with mu_ held: completes the single-copy sends the receiver has consumed; the tail

  // Single copy, sender side, per destination: unknown until its first single-copy send, probing while that one is
  // not consumed (nothing is written behind it), then on or off (the receiver could not read it).
  enum class Cma : uint8_t { unknown, probing, on, off };
  struct Acked {
    std::shared_ptr<Op> op;
    uint64_t end;  // the ring position after its descriptor: consumed once the channel's tail reaches it
  };

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
  size_t cma_min_ = 0;               // single copy from this many bytes; 0: off
  int pid_ = 0;
  std::vector<Cma> cma_;             // per destination
  std::vector<std::deque<Acked>> acks_;  // per destination: single-copy sends waiting for the receiver, in order
  std::vector<char> cma_read_;       // per source: a single-copy read from it has worked (later failures are errors)
  std::thread thread_;
  std::condition_variable cv_;
  std::atomic<bool> stop_{false};
};

}  // namespace mt::comm::shm
