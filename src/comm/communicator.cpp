#include "comm/communicator.h"

#include <exception>

#include "core/error.h"

namespace mt::comm {

uint64_t Counters::total_sent() const {
  uint64_t s = 0;
  for (uint64_t b : bytes_sent) s += b;
  return s;
}
uint64_t Counters::total_recv() const {
  uint64_t s = 0;
  for (uint64_t b : bytes_recv) s += b;
  return s;
}

void Request::wait() {
  if (state_) state_->wait();
}
bool Request::test() { return !state_ || state_->test(); }

void wait_all(std::vector<Request>& reqs) {
  std::exception_ptr first;
  for (Request& r : reqs) {
    try {
      r.wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

std::string describe(const CollArgs& a) {
  std::string s = str(op_kind_name(a.kind), " #", a.seq);
  switch (a.kind) {
    case OpKind::all_reduce:
    case OpKind::reduce_scatter:
      return str(s, " (count=", a.count, ", ", dtype_name(a.dtype), ", ", reduce_op_name(a.op), ")");
    case OpKind::reduce:
      return str(s, " (count=", a.count, ", ", dtype_name(a.dtype), ", ", reduce_op_name(a.op), ", root=", a.root,
                 ")");
    case OpKind::broadcast:
      return str(s, " (count=", a.count, ", ", dtype_name(a.dtype), ", root=", a.root, ")");
    case OpKind::all_gather:
    case OpKind::all_to_all:
      return str(s, " (count=", a.count, ", ", dtype_name(a.dtype), ")");
    case OpKind::all_to_all_v:
      return str(s, " (", dtype_name(a.dtype), ")");
    default:
      return s;
  }
}

// A collective queued for the progress thread.
namespace {
class CollState : public detail::RequestState {
 public:
  bool test() override {
    std::lock_guard<std::mutex> l(m_);
    return done_;
  }
  void wait() override {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return done_; });
    if (err_) std::rethrow_exception(err_);
  }
  void finish(std::exception_ptr e) {
    std::lock_guard<std::mutex> l(m_);
    err_ = e;
    done_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr err_;
};

// A message's request that tells the flight recorder when it ends (the first test() or wait() that sees it
// finished). One allocation per non-blocking message, beside the backend's own state.
class RecordedMessage : public detail::RequestState {
 public:
  RecordedMessage(Request inner, flight::Slot slot) : inner_(std::move(inner)), slot_(slot) {}
  bool test() override {
    bool done = false;
    try {
      done = inner_.test();
    } catch (...) {
      flight::mark(slot_, flight::State::failed);
      throw;
    }
    if (done) flight::mark(slot_, flight::State::done);
    return done;
  }
  void wait() override {
    flight::mark(slot_, flight::State::waiting);
    try {
      inner_.wait();
    } catch (...) {
      flight::mark(slot_, flight::State::failed);
      throw;
    }
    flight::mark(slot_, flight::State::done);
  }

 private:
  Request inner_;
  flight::Slot slot_;
};
}  // namespace

struct Communicator::QueuedOp {
  uint64_t ticket;
  flight::Slot slot;
  std::function<void()> fn;
  std::shared_ptr<CollState> state = std::make_shared<CollState>();
};

Communicator::Communicator(int rank, int size, std::string name)
    : rank_(rank), size_(size), name_(std::move(name)), messages_(new std::atomic<uint64_t>[2 * size_t(size > 0 ? size : 1)]()) {}

flight::Slot Communicator::record(const CollArgs& a, flight::State s) {
  const bool rooted = a.kind == OpKind::broadcast || a.kind == OpKind::reduce;
  return flight::record(name_, a.kind, a.seq, a.count * dtype_size(a.dtype), -1, rooted ? a.root : -1, s);
}

Communicator::~Communicator() { stop_progress_thread(); }

void Communicator::stop_progress_thread() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

void Communicator::set_timeout(double seconds) {
  MT_REQUIRE(InputError, seconds > 0, "communication timeout must be > 0 seconds, got ", seconds);
  timeout_s_.store(seconds);
}

uint64_t Communicator::collectives_issued() const {
  std::lock_guard<std::mutex> l(mu_);
  return seq_;
}

void Communicator::check_peer(int peer, const char* what) const {
  MT_REQUIRE(CommError, peer >= 0 && peer < size_, what, ": peer ", peer, " is not a rank of group '", name_,
             "' (size ", size_, ")");
}

Counters Communicator::counters() const {
  Counters c;
  for (int i = 0; i < kNumOpKinds; ++i) {
    c.calls[i] = counters_.calls[i].load(std::memory_order_relaxed);
    c.bytes_sent[i] = counters_.sent[i].load(std::memory_order_relaxed);
    c.bytes_recv[i] = counters_.recvd[i].load(std::memory_order_relaxed);
  }
  return c;
}

void Communicator::reset_counters() {
  for (int i = 0; i < kNumOpKinds; ++i) {
    counters_.calls[i].store(0);
    counters_.sent[i].store(0);
    counters_.recvd[i].store(0);
  }
}

void Communicator::count_p2p(OpKind kind, size_t bytes) {
  int k = static_cast<int>(kind);
  counters_.calls[k].fetch_add(1, std::memory_order_relaxed);
  (kind == OpKind::send ? counters_.sent : counters_.recvd)[k].fetch_add(bytes, std::memory_order_relaxed);
}

void Communicator::count_bytes(const CollArgs& a) {
  const uint64_t e = dtype_size(a.dtype), n = size_;
  const uint64_t S = a.count * e, Sr = shard_of(a.count, size_, rank_).count * e;
  uint64_t sent = 0, recvd = 0;
  switch (a.kind) {
    case OpKind::all_reduce: sent = recvd = 2 * (S - Sr); break;
    case OpKind::reduce_scatter:
    case OpKind::all_gather:
    case OpKind::reduce: sent = recvd = S - Sr; break;
    case OpKind::broadcast:
      if (n > 1) (rank_ == a.root ? sent : recvd) = S;
      break;
    case OpKind::all_to_all: sent = recvd = (n - 1) * S; break;
    case OpKind::all_to_all_v:
      for (int j = 0; j < size_; ++j) {
        if (j == rank_) continue;
        sent += a.send_counts[j] * e;
        recvd += a.recv_counts[j] * e;
      }
      break;
    default: break;
  }
  int k = static_cast<int>(a.kind);
  counters_.calls[k].fetch_add(1, std::memory_order_relaxed);
  counters_.sent[k].fetch_add(sent, std::memory_order_relaxed);
  counters_.recvd[k].fetch_add(recvd, std::memory_order_relaxed);
}

CollArgs Communicator::make_args(OpKind kind) {
  CollArgs a;
  a.kind = kind;
  a.algo = algo_.load();
  a.timeout_s = timeout_s_.load();
  return a;
}

// ---- issue order ----

void Communicator::execute(uint64_t ticket, const std::function<void()>& fn, flight::Slot slot) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return turn_ == ticket; });
  std::string broken = broken_;
  l.unlock();
  std::exception_ptr err;
  flight::mark(slot, flight::State::started);
  if (!broken.empty()) {
    err = std::make_exception_ptr(
        CommError(str("group '", name_, "' is unusable after an earlier failure: ", broken)));
  } else {
    try {
      fn();
    } catch (const std::exception& e) {
      err = std::current_exception();
      l.lock();
      if (broken_.empty()) broken_ = e.what();
      l.unlock();
    } catch (...) {
      err = std::current_exception();
    }
  }
  flight::mark(slot, err ? flight::State::failed : flight::State::done);
  l.lock();
  ++turn_;
  cv_.notify_all();
  l.unlock();
  if (err) std::rethrow_exception(err);
}

void Communicator::run_blocking(const std::function<void()>& fn, flight::Slot slot) {
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> l(mu_);
    ticket = next_ticket_++;
  }
  execute(ticket, fn, slot);
}

Request Communicator::start(std::function<void()> fn, flight::Slot slot) {
  auto job = std::make_shared<QueuedOp>();
  job->fn = std::move(fn);
  job->slot = slot;
  {
    std::lock_guard<std::mutex> l(mu_);
    job->ticket = next_ticket_++;
    queue_.push_back(job);
    if (!thread_.joinable()) thread_ = std::thread([this] { progress_loop(); });
    cv_.notify_all();
  }
  return Request(job->state);
}

void Communicator::progress_loop() {
  for (;;) {
    std::shared_ptr<QueuedOp> job;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return (!queue_.empty() && queue_.front()->ticket == turn_) || (stopping_ && queue_.empty()); });
      if (queue_.empty()) return;
      job = queue_.front();
      queue_.pop_front();
    }
    std::exception_ptr err;
    try {
      execute(job->ticket, job->fn, job->slot);
    } catch (...) {
      err = std::current_exception();
    }
    job->state->finish(err);
  }
}

// ---- the public operations: fill CollArgs, count, run in order ----

namespace {
// Bytes (u8) are moved, never combined.
void check_reducible(const CollArgs& a) {
  const bool reduces = a.kind == OpKind::all_reduce || a.kind == OpKind::reduce_scatter || a.kind == OpKind::reduce;
  MT_CHECK_INPUT(!(reduces && a.dtype == DType::u8), op_kind_name(a.kind),
                 " of u8 (raw bytes): bytes are moved (all_gather, broadcast, all_to_all, send/recv), not reduced");
}
}  // namespace

#define MT_COLL(kind_, ...)                                 \
  CollArgs a = make_args(kind_);                            \
  __VA_ARGS__;                                              \
  check_reducible(a);                                       \
  {                                                         \
    std::lock_guard<std::mutex> l(mu_);                     \
    a.seq = ++seq_;                                         \
  }                                                         \
  count_bytes(a);

std::unique_ptr<Communicator> Communicator::split(int colour, int key, const std::string& name) {
  uint64_t seq;
  {
    std::lock_guard<std::mutex> l(mu_);
    seq = ++seq_;
  }
  counters_.calls[static_cast<int>(OpKind::split)].fetch_add(1);
  std::unique_ptr<Communicator> out;
  double t = timeout_s_.load();
  const flight::Slot slot = flight::record(name_, OpKind::split, seq, 0, -1, -1, flight::State::queued);
  run_blocking([&] { out = run_split(colour, key, name, seq, t); }, slot);
  if (out) {
    out->set_timeout(t);
    out->set_algorithm(algo_.load());
  }
  return out;
}

// Non-blocking: the lambda holds a copy of the arguments; sequence numbers are taken at issue time.
#define MT_BLOCKING(...)                       \
  MT_COLL(__VA_ARGS__)                         \
  run_blocking([&] { run_collective(a); }, record(a, flight::State::queued));
#define MT_START(...)  \
  MT_COLL(__VA_ARGS__) \
  return start([this, a] { run_collective(a); }, record(a, flight::State::queued));

void Communicator::all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
  MT_BLOCKING(OpKind::all_reduce, a.send = send, a.recv = recv, a.count = count, a.dtype = dtype, a.op = op)
}
void Communicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
  MT_BLOCKING(OpKind::reduce_scatter, a.send = send, a.recv = recv, a.count = count, a.dtype = dtype, a.op = op)
}
void Communicator::all_gather(const void* send, void* recv, size_t count, DType dtype) {
  MT_BLOCKING(OpKind::all_gather, a.send = send, a.recv = recv, a.count = count, a.dtype = dtype)
}
void Communicator::broadcast(void* buf, size_t count, DType dtype, int root) {
  check_peer(root, "broadcast root");
  MT_BLOCKING(OpKind::broadcast, a.send = buf, a.recv = buf, a.count = count, a.dtype = dtype, a.root = root)
}
void Communicator::reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root) {
  check_peer(root, "reduce root");
  MT_BLOCKING(OpKind::reduce, a.send = send, a.recv = recv, a.count = count, a.dtype = dtype, a.op = op,
              a.root = root)
}
void Communicator::all_to_all(const void* send, void* recv, size_t count_per_rank, DType dtype) {
  MT_BLOCKING(OpKind::all_to_all, a.send = send, a.recv = recv, a.count = count_per_rank, a.dtype = dtype)
}
void Communicator::all_to_all_v(const void* send, const size_t* send_counts, const size_t* send_offsets, void* recv,
                                const size_t* recv_counts, const size_t* recv_offsets, DType dtype) {
  MT_BLOCKING(OpKind::all_to_all_v, a.send = send, a.recv = recv, a.dtype = dtype, a.send_counts = send_counts,
              a.send_offsets = send_offsets, a.recv_counts = recv_counts, a.recv_offsets = recv_offsets)
}
void Communicator::barrier() { MT_BLOCKING(OpKind::barrier) }

Request Communicator::iall_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
  MT_START(OpKind::all_reduce, a.send = send, a.recv = recv, a.count = count, a.dtype = dtype, a.op = op)
}
Request Communicator::ireduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
  MT_START(OpKind::reduce_scatter, a.send = send, a.recv = recv, a.count = count, a.dtype = dtype, a.op = op)
}
Request Communicator::iall_gather(const void* send, void* recv, size_t count, DType dtype) {
  MT_START(OpKind::all_gather, a.send = send, a.recv = recv, a.count = count, a.dtype = dtype)
}
Request Communicator::ibroadcast(void* buf, size_t count, DType dtype, int root) {
  check_peer(root, "broadcast root");
  MT_START(OpKind::broadcast, a.send = buf, a.recv = buf, a.count = count, a.dtype = dtype, a.root = root)
}
Request Communicator::ireduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root) {
  check_peer(root, "reduce root");
  MT_START(OpKind::reduce, a.send = send, a.recv = recv, a.count = count, a.dtype = dtype, a.op = op, a.root = root)
}
Request Communicator::iall_to_all(const void* send, void* recv, size_t count_per_rank, DType dtype) {
  MT_START(OpKind::all_to_all, a.send = send, a.recv = recv, a.count = count_per_rank, a.dtype = dtype)
}
Request Communicator::iall_to_all_v(const void* send, const size_t* send_counts, const size_t* send_offsets,
                                    void* recv, const size_t* recv_counts, const size_t* recv_offsets, DType dtype) {
  MT_START(OpKind::all_to_all_v, a.send = send, a.recv = recv, a.dtype = dtype, a.send_counts = send_counts,
           a.send_offsets = send_offsets, a.recv_counts = recv_counts, a.recv_offsets = recv_offsets)
}
Request Communicator::ibarrier() { MT_START(OpKind::barrier) }

void Communicator::send(const void* buf, size_t count, DType dtype, int peer, int tag) {
  isend(buf, count, dtype, peer, tag).wait();
}
void Communicator::recv(void* buf, size_t count, DType dtype, int peer, int tag) {
  irecv(buf, count, dtype, peer, tag).wait();
}
Request Communicator::isend(const void* buf, size_t count, DType dtype, int peer, int tag) {
  check_peer(peer, "send");
  const size_t bytes = count * dtype_size(dtype);
  count_p2p(OpKind::send, bytes);
  if (!flight::attached()) return start_send(buf, bytes, peer, tag);
  const uint64_t n = messages_[2 * size_t(peer)].fetch_add(1, std::memory_order_relaxed) + 1;
  const flight::Slot slot = flight::record(name_, OpKind::send, n, bytes, world_of(peer), -1, flight::State::started);
  return Request(std::make_shared<RecordedMessage>(start_send(buf, bytes, peer, tag), slot));
}
Request Communicator::irecv(void* buf, size_t count, DType dtype, int peer, int tag) {
  check_peer(peer, "recv");
  const size_t bytes = count * dtype_size(dtype);
  count_p2p(OpKind::recv, bytes);
  if (!flight::attached()) return start_recv(buf, bytes, peer, tag);
  const uint64_t n = messages_[2 * size_t(peer) + 1].fetch_add(1, std::memory_order_relaxed) + 1;
  const flight::Slot slot = flight::record(name_, OpKind::recv, n, bytes, world_of(peer), -1, flight::State::started);
  return Request(std::make_shared<RecordedMessage>(start_recv(buf, bytes, peer, tag), slot));
}

}  // namespace mt::comm
