#include "comm/flight_recorder.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace mt::comm::flight {

namespace {
constexpr uint64_t kRingMagic = 0x666c696768747231ull;  // "flightr1"
constexpr int kGroupWords = kGroupChars / 8;

Ring* g_ring = nullptr;
FaultPoint g_fault;

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

void stamp(Entry& e, State s, int64_t t) {
  if (s == State::queued) e.t_queued_ns.store(t, std::memory_order_relaxed);
  if (s == State::started) e.t_started_ns.store(t, std::memory_order_relaxed);
  if (s == State::done || s == State::failed) e.t_done_ns.store(t, std::memory_order_relaxed);
}

[[noreturn]] void fire(FaultKind k) {
  if (k == FaultKind::lose) g_ring->lost.store(1, std::memory_order_seq_cst);
  if (k == FaultKind::stop) {
    raise(SIGSTOP);
    // Continued (SIGCONT): the stall is over but the test asked for a stalled rank; stay stalled.
    for (;;) pause();
  }
  raise(SIGKILL);
  for (;;) pause();
}
}  // namespace

const char* state_name(State s) {
  switch (s) {
    case State::queued: return "queued";
    case State::started: return "started";
    case State::done: return "done";
    case State::failed: return "failed";
    case State::waiting: return "waiting";
    default: return "empty";
  }
}

FaultPoint parse_fault(const std::string& spec, const char* what) {
  FaultPoint f;
  if (spec.empty()) return f;
  auto bad = [&] {
    return InputError(str(what, "='", spec, "' is not RANK:K:KIND (RANK >= 0: the world rank; K >= 1: before its K-th "
                          "communication operation; KIND kill | stop | lose)"));
  };
  const size_t a = spec.find(':'), b = a == std::string::npos ? a : spec.find(':', a + 1);
  if (b == std::string::npos) throw bad();
  const std::string r = spec.substr(0, a), k = spec.substr(a + 1, b - a - 1), kind = spec.substr(b + 1);
  auto digits = [](const std::string& t) {
    return !t.empty() && t.size() <= 12 && t.find_first_not_of("0123456789") == std::string::npos;
  };
  if (!digits(r) || !digits(k)) throw bad();
  f.rank = std::stoi(r);
  f.at = std::stoull(k);
  if (f.at < 1) throw bad();
  if (kind == "kill") f.kind = FaultKind::kill;
  else if (kind == "stop") f.kind = FaultKind::stop;
  else if (kind == "lose") f.kind = FaultKind::lose;
  else throw bad();
  return f;
}

void init_ring(Ring* ring, int world_rank) {
  std::memset(static_cast<void*>(ring), 0, sizeof(Ring));
  ring->magic = kRingMagic;
  ring->world_rank = world_rank;
}

void attach(Ring* ring, FaultPoint fault) {
  g_ring = ring;
  g_fault = (ring && fault.rank == ring->world_rank) ? fault : FaultPoint{};
  if (ring) {
    ring->pid = getpid();
    gethostname(ring->host, kHostChars - 1);
    ring->host[kHostChars - 1] = 0;
  }
}

Ring* attached() { return g_ring; }

Slot record(const std::string& group, OpKind kind, uint64_t seq, uint64_t bytes, int peer, int root, State s) {
  Ring* ring = g_ring;
  if (!ring) return {};
  const uint64_t index = ring->next.fetch_add(1, std::memory_order_relaxed);
  if (g_fault.kind != FaultKind::none && index + 1 == g_fault.at) fire(g_fault.kind);
  Entry& e = ring->e[index % kFlightEntries];
  const uint64_t id = index + 1;
  e.id.store(0, std::memory_order_relaxed);  // readers skip the entry while it is rewritten
  std::atomic_thread_fence(std::memory_order_release);
  e.state.store(static_cast<uint32_t>(s), std::memory_order_relaxed);
  e.kind.store(static_cast<uint32_t>(kind), std::memory_order_relaxed);
  e.seq.store(seq, std::memory_order_relaxed);
  e.bytes.store(bytes, std::memory_order_relaxed);
  e.peer.store(peer, std::memory_order_relaxed);
  e.root.store(root, std::memory_order_relaxed);
  e.t_queued_ns.store(0, std::memory_order_relaxed);
  e.t_started_ns.store(0, std::memory_order_relaxed);
  e.t_done_ns.store(0, std::memory_order_relaxed);
  const int64_t t = now_ns();
  e.t_queued_ns.store(t, std::memory_order_relaxed);  // issued now, whether it starts now or waits its turn
  stamp(e, s, t);
  char name[kGroupChars] = {};
  std::memcpy(name, group.data(), std::min(group.size(), size_t{kGroupChars - 1}));
  for (int w = 0; w < kGroupWords; w++) {
    uint64_t word;
    std::memcpy(&word, name + 8 * w, 8);
    e.group[w].store(word, std::memory_order_relaxed);
  }
  e.id.store(id, std::memory_order_release);
  return {&e, id};
}

void mark(Slot slot, State s) {
  if (!slot.e || slot.e->id.load(std::memory_order_acquire) != slot.id) return;
  stamp(*slot.e, s, now_ns());
  slot.e->state.store(static_cast<uint32_t>(s), std::memory_order_release);
}

std::vector<Op> snapshot(const Ring& ring) {
  std::vector<Op> out;
  const uint64_t next = ring.next.load(std::memory_order_acquire);
  const uint64_t first = next > kFlightEntries ? next - kFlightEntries : 0;
  for (uint64_t index = first; index < next; index++) {
    const Entry& e = ring.e[index % kFlightEntries];
    const uint64_t id = e.id.load(std::memory_order_acquire);
    if (id != index + 1) continue;  // being rewritten, or not yet published
    Op op;
    op.id = id;
    op.state = static_cast<State>(e.state.load(std::memory_order_acquire));
    op.kind = static_cast<OpKind>(e.kind.load(std::memory_order_relaxed));
    op.seq = e.seq.load(std::memory_order_relaxed);
    op.bytes = e.bytes.load(std::memory_order_relaxed);
    op.peer = e.peer.load(std::memory_order_relaxed);
    op.root = e.root.load(std::memory_order_relaxed);
    op.t_queued_ns = e.t_queued_ns.load(std::memory_order_relaxed);
    op.t_started_ns = e.t_started_ns.load(std::memory_order_relaxed);
    op.t_done_ns = e.t_done_ns.load(std::memory_order_relaxed);
    char name[kGroupChars + 1] = {};
    for (int w = 0; w < kGroupWords; w++) {
      const uint64_t word = e.group[w].load(std::memory_order_relaxed);
      std::memcpy(name + 8 * w, &word, 8);
    }
    op.group = name;
    std::atomic_thread_fence(std::memory_order_acquire);
    if (e.id.load(std::memory_order_relaxed) != id) continue;  // rewritten while copied
    if (static_cast<int>(op.kind) >= kNumOpKinds) continue;
    out.push_back(std::move(op));
  }
  return out;
}

std::string describe_op(const Op& op) {
  std::string s = op_kind_name(op.kind);
  if (op.kind == OpKind::send) return str(s, " #", op.seq, " to rank ", op.peer, " on group ", op.group);
  if (op.kind == OpKind::recv) return str(s, " #", op.seq, " from rank ", op.peer, " on group ", op.group);
  return str(s, " #", op.seq, " on group ", op.group);
}

}  // namespace mt::comm::flight
