// Communicator: a group of ranks and the operations between them, independent of the backend (shm: forked
// workers on one host; mpi: processes under mpirun). Code above comm/ sees only this interface.
//
// Buffers are raw pointers plus element counts (not Tensors), so the layer can be tested and reused alone.
// Legend: n = size(), r = rank(), e = element bytes, S = count * e.
//
// Ordering. Collectives (including barrier and split) must be called in the same order with matching
// arguments on every rank of the group; each gets a sequence number, its "#seq" in error messages (the
// n-th collective on the group). A mismatch (kind, count, dtype, op, root) is detected at the first
// synchronisation and reported on every rank as a CommError instead of corrupting data. Blocking and
// non-blocking collectives share one order: a blocking call issued while non-blocking ones are pending
// runs after them. Point-to-point messages are ordered per (sender, receiver, tag) and independent of
// collectives.
//
// Deadlines. Every operation ends within timeout() seconds (default 300) of starting to run, with a
// CommError naming the group, operation, its #seq and the peer being waited for, or sooner when a peer's
// death or exit is known (the launcher's supervisor records it). A wait() on a queued non-blocking
// operation therefore returns within the deadlines of the operations ahead of it plus its own. After a
// failure the communicator is unusable: every later call throws at once.
//
// Threads. One thread at a time may issue calls on a communicator; different communicators (e.g. the data-
// and tensor-parallel groups of a mesh) may be used from different threads and run at the same time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/flight_recorder.h"
#include "comm/types.h"

namespace mt::comm {

// Bytes moved per operation kind, as the bandwidth-optimal algorithm moves them; the same formula on every
// backend, so the trainer's "bytes sent per rank" does not depend on where it ran:
//   all_reduce                          sent = recv = 2 (S - S_r)      (S_r = this rank's shard of S)
//   reduce_scatter, all_gather, reduce  sent = recv = S - S_r          (S = the full buffer)
//   broadcast                           root sends S, others receive S
//   all_to_all(_v), send, recv          exactly the bytes that leave / arrive from other ranks
struct Counters {
  uint64_t calls[kNumOpKinds] = {};
  uint64_t bytes_sent[kNumOpKinds] = {};
  uint64_t bytes_recv[kNumOpKinds] = {};
  uint64_t total_sent() const;
  uint64_t total_recv() const;
};

namespace detail {
// What a Request refers to; each backend and operation kind supplies its own.
class RequestState {
 public:
  virtual ~RequestState() = default;
  virtual bool test() = 0;  // makes progress if it can; true once finished (successfully or not)
  virtual void wait() = 0;  // blocks until finished; throws the operation's CommError
};
}  // namespace detail

// A handle on a started non-blocking operation. Until wait() returns (or test() returns true), the caller
// must not touch the operation's buffers: not read the receive buffer, not write the send buffer, not free
// either, not change all_to_all_v's count/offset arrays. After wait() returns, all of them are the
// caller's again. wait() may be called more than once; a default-constructed Request is already done.
class Request {
 public:
  Request() = default;
  explicit Request(std::shared_ptr<detail::RequestState> s) : state_(std::move(s)) {}
  void wait();
  bool test();
  bool valid() const { return state_ != nullptr; }

 private:
  std::shared_ptr<detail::RequestState> state_;
};
// Waits for all, then throws the first error, if any.
void wait_all(std::vector<Request>& reqs);

// Everything a backend needs to run one collective.
struct CollArgs {
  OpKind kind = OpKind::barrier;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  const size_t* send_counts = nullptr;  // all_to_all_v only: n entries each; offsets may be null (packed)
  const size_t* send_offsets = nullptr;
  const size_t* recv_counts = nullptr;
  const size_t* recv_offsets = nullptr;
  uint64_t seq = 0;  // set by Communicator: the n-th collective on this group, from 1
  Algo algo = Algo::automatic;
  double timeout_s = 300;
};
std::string describe(const CollArgs& a);  // "all_reduce #3 (count=1000, f32, sum)"

class Communicator {
 public:
  Communicator(int rank, int size, std::string name);
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }  // "world", or the name given to split()
  virtual const char* backend() const = 0;           // "shm" | "mpi"

  // Collective over this group: ranks passing the same colour form a new group, ordered by (key, rank).
  // Returns nullptr on ranks that pass colour < 0. The new group is independent: its collectives never mix
  // with this group's, and both may run at the same time. `name` labels it in errors ("dp", "tp.3").
  std::unique_ptr<Communicator> split(int colour, int key, const std::string& name = "");

  // ---- Collectives. send may equal recv (in place) where noted. ----
  // recv[i] = op over ranks of send[i], i < count. In place: send == recv.
  void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op);
  // send: count elements (the full buffer); recv: shard_of(count, n, r).count elements, the reduced shard r.
  // In place: recv == send + shard offset.
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op);
  // send: shard_of(count, n, r).count elements; recv: count elements, all shards in rank order.
  // In place: send == recv + shard offset.
  void all_gather(const void* send, void* recv, size_t count, DType dtype);
  // buf: count elements, read on root, written on the others.
  void broadcast(void* buf, size_t count, DType dtype, int root);
  // Like all_reduce, but only root's recv is written (recv may be null elsewhere).
  void reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root);
  // send, recv: n * count_per_rank elements; block j of send goes to rank j, block i of recv came from i.
  // In place: send == recv.
  void all_to_all(const void* send, void* recv, size_t count_per_rank, DType dtype);
  // send_counts[j] elements at send + send_offsets[j] go to rank j; recv_counts[i] elements from rank i land
  // at recv + recv_offsets[i]. Offsets in elements; null offsets mean packed in rank order. recv_counts[i]
  // must equal rank i's send_counts[r] (checked on every rank). Not in place.
  void all_to_all_v(const void* send, const size_t* send_counts, const size_t* send_offsets, void* recv,
                    const size_t* recv_counts, const size_t* recv_offsets, DType dtype);
  void barrier();

  // Non-blocking collectives: start now, progress on a per-communicator thread, finish at wait().
  Request iall_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op);
  Request ireduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op);
  Request iall_gather(const void* send, void* recv, size_t count, DType dtype);
  Request ibroadcast(void* buf, size_t count, DType dtype, int root);
  Request ireduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root);
  Request iall_to_all(const void* send, void* recv, size_t count_per_rank, DType dtype);
  Request iall_to_all_v(const void* send, const size_t* send_counts, const size_t* send_offsets, void* recv,
                        const size_t* recv_counts, const size_t* recv_offsets, DType dtype);
  Request ibarrier();

  // ---- Point to point. Messages from one sender with one tag arrive in order. The receiver's count must
  // equal the sender's (checked). A blocking send may wait until the receiver posts its recv (large
  // messages stream through a bounded channel), so exchanges should use isend + recv. ----
  void send(const void* buf, size_t count, DType dtype, int peer, int tag);
  void recv(void* buf, size_t count, DType dtype, int peer, int tag);
  Request isend(const void* buf, size_t count, DType dtype, int peer, int tag);
  Request irecv(void* buf, size_t count, DType dtype, int peer, int tag);

  // ---- Settings and counters. ----
  Counters counters() const;
  void reset_counters();
  void set_timeout(double seconds);  // for later calls; inherited by splits
  double timeout() const { return timeout_s_.load(); }
  void set_algorithm(Algo a) { algo_.store(a); }  // override the by-size choice (benchmarks)
  Algo algorithm() const { return algo_.load(); }
  uint64_t collectives_issued() const;
  // The world rank of group rank g (for messages in the flight recorder); backends that know it override.
  virtual int world_of(int g) const { return g; }

 protected:
  // Runs one collective on the calling thread, blocking, in issue order. Throws CommError.
  virtual void run_collective(const CollArgs& a) = 0;
  // The backend's split: collective over this group, runs in issue order like run_collective.
  virtual std::unique_ptr<Communicator> run_split(int colour, int key, const std::string& name, uint64_t seq,
                                                  double timeout_s) = 0;
  virtual Request start_send(const void* buf, size_t bytes, int peer, int tag) = 0;
  virtual Request start_recv(void* buf, size_t bytes, int peer, int tag) = 0;
  // Backends call this first thing in their destructor: it finishes queued work and joins the thread.
  void stop_progress_thread();
  void check_peer(int peer, const char* what) const;

 private:
  struct QueuedOp;
  CollArgs make_args(OpKind kind);
  void count_bytes(const CollArgs& a);
  void count_p2p(OpKind kind, size_t bytes);
  void run_blocking(const std::function<void()>& fn, flight::Slot slot);
  Request start(std::function<void()> fn, flight::Slot slot);
  void execute(uint64_t ticket, const std::function<void()>& fn, flight::Slot slot);
  flight::Slot record(const CollArgs& a, flight::State s);
  void progress_loop();

  int rank_, size_;
  std::string name_;
  std::atomic<double> timeout_s_{300};
  std::atomic<Algo> algo_{Algo::automatic};

  struct AtomicCounters {
    std::atomic<uint64_t> calls[kNumOpKinds] = {};
    std::atomic<uint64_t> sent[kNumOpKinds] = {};
    std::atomic<uint64_t> recvd[kNumOpKinds] = {};
  } counters_;
  // Messages per peer (group rank) and direction, for their "#n" in the flight recorder: [2 * peer + is_recv].
  std::unique_ptr<std::atomic<uint64_t>[]> messages_;

  // Issue order: every collective takes a ticket when issued and runs when turn_ reaches it, either on the
  // caller's thread (blocking) or on the progress thread (non-blocking).
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_ticket_ = 0;
  uint64_t turn_ = 0;
  uint64_t seq_ = 0;
  std::string broken_;  // set by the first failed collective
  std::deque<std::shared_ptr<QueuedOp>> queue_;
  std::thread thread_;
  bool stopping_ = false;
};

}  // namespace mt::comm
