#include "parallel/pipeline/schedule_check.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

namespace mt::pipeline {

namespace {

// What has happened to one (i, c) on one rank so far.
enum Flag : uint16_t {
  kForward = 1 << 0,
  kBackward = 1 << 1,
  kSentAct = 1 << 2,
  kSentGrad = 1 << 3,
  kPostedAct = 1 << 4,
  kWaitedAct = 1 << 5,
  kPostedGrad = 1 << 6,
  kWaitedGrad = 1 << 7,
  kWeight = 1 << 8,  // the parameter gradients: backward, or backward_weight after backward_input
  kUpdated = 1 << 9,  // the update after this micro-batch alone (optimizer_step(i): pipedream, pipemare)
};

struct Endpoint {  // one send or post on a channel
  Message msg;
  int rank;
  size_t k;
};

std::string where(int j, size_t k, const Action& a) { return str("rank ", j, ", action ", k, " (", to_string(a), ")"); }

std::string describe(const Message& msg) {
  return str(msg.grad ? "gradient" : "activation", " of micro-batch ", msg.micro_batch, " from stage ", msg.from_stage,
             " to stage ", msg.to_stage);
}

// The checks of check_schedule, one method per part, over one schedule and its placement.
class Checker {
 public:
  Checker(const ScheduleSpec& spec, const Schedule& schedule)
      : sched_(schedule), pl_(schedule.placement), p_(spec.stages), m_(spec.micro_batches), V_(spec.virtual_stages) {}
  void run() {
    for (int j = 0; j < p_; j++) check_rank(j);
    check_matching();
    check_deadlock();
  }

 private:
  using Fail = std::function<void(const std::string&)>;
  void check_rank(int j);
  void check_peer(int j, const Action& a, const Fail& fail);
  void check_order(int j, const Action& a, std::vector<uint16_t>& state, const Fail& fail);
  void check_complete(int j, const std::vector<uint16_t>& state);
  void check_matching();
  void check_deadlock();
  size_t channel(const Message& msg) const {
    return ((size_t)msg.from_rank * p_ + msg.to_rank) * 2 + (msg.grad ? 1 : 0);
  }
  size_t key(const Action& a, bool grad) const { return ((size_t)a.micro_batch * V_ + a.chunk) * 2 + (grad ? 1 : 0); }
  // The rank holding micro-batch i's stage s (-1: no such stage).
  int rank_at(int i, int s) const { return s < 0 || s >= pl_.stages() ? -1 : pl_.slot(i, s).rank; }
  const Endpoint* blocked_on(int j) const;

  const Schedule& sched_;
  const Placement& pl_;
  const int p_, m_, V_;
  std::vector<std::vector<Endpoint>> sends_, posts_;  // per channel
  // post_index_[j][key(a, grad)]: the position on its channel of rank j's post for that message.
  std::vector<std::vector<size_t>> post_index_;
  std::vector<size_t> sent_, pc_;  // replay: messages sent per channel, position per rank
};

void Checker::check_rank(int j) {
  const std::vector<Action>& list = sched_[j];
  std::vector<uint16_t> state((size_t)m_ * V_, 0);
  bool stepped = false;
  int micro_steps = 0;  // per-micro-batch updates so far
  for (size_t k = 0; k < list.size(); k++) {
    const Action& a = list[k];
    const Fail fail = [&](const std::string& msg) { throw ScheduleError(str(where(j, k, a), ": ", msg)); };
    if (stepped) fail("an action after optimizer_step, which must be the last");
    if (a.kind == ActionKind::optimizer_step && a.micro_batch >= 0) {  // the update after one micro-batch
      if (a.micro_batch >= m_ || a.chunk < 0 || a.chunk >= V_ || a.peer != -1)
        fail("a micro-batch's optimizer_step takes a micro-batch in [0, m), a chunk of this rank and no peer");
      uint16_t& st = state[(size_t)a.micro_batch * V_ + a.chunk];
      if (!(st & kWeight)) fail("optimizer_step of a micro-batch before its backward");
      if (st & kUpdated) fail("optimizer_step of a micro-batch a second time");
      st |= kUpdated;
      micro_steps++;
      if (k + 1 == list.size()) stepped = true;
      continue;
    }
    if (a.kind == ActionKind::optimizer_step) {
      if (micro_steps > 0) fail("a step-end optimizer_step in a list of per-micro-batch updates");
      if (a.micro_batch != -1 || a.chunk != -1 || a.peer != -1)
        fail("optimizer_step takes no micro-batch, chunk or peer (all -1)");
      stepped = true;
      continue;
    }
    if (a.micro_batch < 0 || a.micro_batch >= m_) fail(str("micro-batch out of range [0, ", m_, ")"));
    if (a.chunk < 0 || a.chunk >= V_) fail(str("chunk out of range [0, ", V_, ")"));
    if (!pl_.visits(a.micro_batch, j, a.chunk))
      fail(str("micro-batch ", a.micro_batch, " does not pass through chunk ", a.chunk, " of rank ", j, " (route ",
               pl_.route_of(a.micro_batch), " of the placement)"));
    check_peer(j, a, fail);
    check_order(j, a, state, fail);
  }
  if (!stepped) throw ScheduleError(str("rank ", j, ": the list does not end with optimizer_step"));
  check_complete(j, state);
  if (micro_steps > 0)
    for (int i = 0; i < m_; i++)
      for (int c = 0; c < V_; c++)
        if (pl_.visits(i, j, c) && !(state[(size_t)i * V_ + c] & kUpdated))
          throw ScheduleError(str("rank ", j, ", micro-batch ", i, ", chunk ", c,
                                  ": no optimizer_step after its backward, in a list of per-micro-batch updates"));
}

// The rank at the other end of a message, as placement dictates.
void Checker::check_peer(int j, const Action& a, const Fail& fail) {
  const int s = pl_.stage_of(j, a.chunk);
  auto expect_peer = [&](int neighbour, const char* what) {
    const int r = rank_at(a.micro_batch, neighbour);
    if (r < 0) fail(str("stage ", s, " has no stage ", neighbour, " to ", what));
    if (r == j) fail(str("stage ", neighbour, " is on this rank too: the tensor is handed over in memory, not sent"));
    if (a.peer != r) fail(str("the peer must be rank ", r, ", which holds stage ", neighbour));
  };
  switch (a.kind) {
    case ActionKind::send_act:
      expect_peer(s + 1, "send an activation to");
      break;
    case ActionKind::post_recv_act:
    case ActionKind::wait_recv_act:
      expect_peer(s - 1, "receive an activation from");
      break;
    case ActionKind::send_grad:
      expect_peer(s - 1, "send a gradient to");
      break;
    case ActionKind::post_recv_grad:
    case ActionKind::wait_recv_grad:
      expect_peer(s + 1, "receive a gradient from");
      break;
    default:
      if (a.peer != -1) fail("a computation has no peer (-1)");
  }
}

// What must have happened on this rank before a, and that it happens once.
void Checker::check_order(int j, const Action& a, std::vector<uint16_t>& state, const Fail& fail) {
  const int i = a.micro_batch, s = pl_.stage_of(j, a.chunk), S = pl_.stages();
  auto at = [&](int c) -> uint16_t& { return state[(size_t)i * V_ + c]; };
  uint16_t& st = at(a.chunk);
  auto once = [&](Flag f, const char* what) {
    if (st & f) fail(str(what, " a second time"));
    st |= f;
  };
  const int before = rank_at(i, s - 1), after = rank_at(i, s + 1);
  switch (a.kind) {
    case ActionKind::forward:
      if (s > 0 && before != j && !(st & kWaitedAct))
        fail("forward before its input activation is received (no wait_recv_act before it)");
      if (s > 0 && before == j && !(at(pl_.slot(i, s - 1).chunk) & kForward))
        fail(str("forward of stage ", s, " before the forward of stage ", s - 1, " on this rank"));
      once(kForward, "forward");
      break;
    case ActionKind::backward:
    case ActionKind::backward_input:
      if (!(st & kForward)) fail("backward before the forward of the same micro-batch and chunk");
      if (s < S - 1 && after != j && !(st & kWaitedGrad))
        fail("backward before its output gradient is received (no wait_recv_grad before it)");
      if (s < S - 1 && after == j && !(at(pl_.slot(i, s + 1).chunk) & kBackward))
        fail(str("backward of stage ", s, " before the backward of stage ", s + 1, " on this rank"));
      once(kBackward, "backward");
      if (a.kind == ActionKind::backward) once(kWeight, "weight gradient");
      break;
    case ActionKind::backward_weight:
      if (!(st & kBackward)) fail("backward_weight before the backward_input of the same micro-batch and chunk");
      once(kWeight, "weight gradient");
      break;
    case ActionKind::send_act:
      if (!(st & kForward)) fail("sends an activation before the forward that computes it");
      once(kSentAct, "sends the activation");
      break;
    case ActionKind::send_grad:
      if (!(st & kBackward)) fail("sends a gradient before the backward that computes it");
      once(kSentGrad, "sends the gradient");
      break;
    case ActionKind::post_recv_act:
      once(kPostedAct, "posts the receive");
      break;
    case ActionKind::post_recv_grad:
      once(kPostedGrad, "posts the receive");
      break;
    case ActionKind::wait_recv_act:
      if (!(st & kPostedAct)) fail("waits for a receive that was not posted before");
      once(kWaitedAct, "waits for the receive");
      break;
    case ActionKind::wait_recv_grad:
      if (!(st & kPostedGrad)) fail("waits for a receive that was not posted before");
      once(kWaitedGrad, "waits for the receive");
      break;
    case ActionKind::optimizer_step:
      break;
  }
}

// Every (i, c) of the rank's routes ran whole and sent what other ranks need.
void Checker::check_complete(int j, const std::vector<uint16_t>& state) {
  const int S = pl_.stages();
  for (int i = 0; i < m_; i++) {
    for (int c = 0; c < V_; c++) {
      if (!pl_.visits(i, j, c)) continue;
      const uint16_t st = state[(size_t)i * V_ + c];
      const int s = pl_.stage_of(j, c);
      auto fail = [&](const auto&... msg) {
        throw ScheduleError(str("rank ", j, ", micro-batch ", i, ", chunk ", c, " (stage ", s, "): ", msg...));
      };
      if (!(st & kForward)) fail("never forwarded");
      if (!(st & kBackward)) fail("never backwarded");
      if (!(st & kWeight)) fail("its weight gradient is never computed (no backward_weight)");
      if (s < S - 1 && rank_at(i, s + 1) != j && !(st & kSentAct)) fail("the activation is never sent");
      if (s > 0 && rank_at(i, s - 1) != j && !(st & kSentGrad)) fail("the input gradient is never sent");
      // A post without its wait cannot get here: a post is only accepted for an input from another rank,
      // and the computation that needs that input, which did run, needed the wait.
    }
  }
}

// Per channel, the n-th posted receive is for the n-th sent message.
void Checker::check_matching() {
  sends_.assign((size_t)p_ * p_ * 2, {});
  posts_.assign((size_t)p_ * p_ * 2, {});
  post_index_.assign((size_t)p_, std::vector<size_t>((size_t)m_ * V_ * 2, 0));
  for (int j = 0; j < p_; j++) {
    for (size_t k = 0; k < sched_[j].size(); k++) {
      const Action& a = sched_[j][k];
      if (is_send(a.kind)) {
        Message msg = message_of(a, j, pl_);
        sends_[channel(msg)].push_back({msg, j, k});
      } else if (is_post(a.kind)) {
        Message msg = message_of(a, j, pl_);
        std::vector<Endpoint>& ch = posts_[channel(msg)];
        post_index_[j][key(a, msg.grad)] = ch.size();
        ch.push_back({msg, j, k});
      }
    }
  }
  for (size_t ch = 0; ch < sends_.size(); ch++) {
    const std::vector<Endpoint>& out = sends_[ch];
    const std::vector<Endpoint>& in = posts_[ch];
    const int from = (int)(ch / 2 / p_), to = (int)(ch / 2 % p_);
    const char* kind = ch % 2 ? "gradients" : "activations";
    for (size_t n = 0; n < std::max(out.size(), in.size()); n++) {
      if (n >= out.size() || n >= in.size() || !(out[n].msg == in[n].msg)) {
        std::string sent = n < out.size() ? str(describe(out[n].msg), " (rank ", from, ", action ", out[n].k, ")")
                                          : std::string("nothing");
        std::string posted = n < in.size() ? str(describe(in[n].msg), " (rank ", to, ", action ", in[n].k, ")")
                                           : std::string("nothing");
        throw ScheduleError(str("rank ", from, " -> rank ", to, " ", kind, ": message #", n, " sent is ", sent,
                                " but receive #", n, " posted is for ", posted, "; rank ", to,
                                " must post its receives in the order rank ", from, " sends"));
      }
    }
  }
}

// The send rank j waits for in the replay, or null if it can go on.
const Endpoint* Checker::blocked_on(int j) const {
  const Action& a = sched_[j][pc_[j]];
  if (!is_wait(a.kind)) return nullptr;
  Message msg = message_of(a, j, pl_);
  const size_t ch = channel(msg);
  const size_t n = post_index_[j][key(a, msg.grad)];
  return sent_[ch] > n ? nullptr : &sends_[ch][n];
}

// No deadlock: replay with sends that never block.
void Checker::check_deadlock() {
  sent_.assign((size_t)p_ * p_ * 2, 0);
  pc_.assign((size_t)p_, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int j = 0; j < p_; j++) {
      while (pc_[j] < sched_[j].size() && !blocked_on(j)) {
        const Action& a = sched_[j][pc_[j]];
        if (is_send(a.kind)) sent_[channel(message_of(a, j, pl_))]++;
        pc_[j]++;
        progress = true;
      }
    }
  }
  std::string stuck;
  for (int j = 0; j < p_; j++) {
    if (pc_[j] == sched_[j].size()) continue;
    const Endpoint* e = blocked_on(j);
    stuck += str(stuck.empty() ? "" : "; ", where(j, pc_[j], sched_[j][pc_[j]]), " waits for rank ", e->rank,
                 "'s action ", e->k, " (", to_string(sched_[e->rank][e->k]), ")");
  }
  if (!stuck.empty()) throw ScheduleError("deadlock: " + stuck);
}

}  // namespace

void check_schedule(const ScheduleSpec& spec, const Schedule& schedule) {
  const int p = spec.stages, m = spec.micro_batches, V = spec.virtual_stages;
  MT_CHECK_INPUT(p >= 1 && m >= 1 && V >= 1, "check_schedule: p, m and V must be at least 1, got p = ", p, ", m = ", m,
                 ", V = ", V);
  if ((int)schedule.size() != p)
    throw ScheduleError(str("the schedule has ", schedule.size(), " lists for p = ", p, " ranks"));
  const Placement& pl = schedule.placement;
  if (pl.ranks() != p || pl.chunks() != V)
    throw ScheduleError(str("the placement is for ", pl.ranks(), " ranks x ", pl.chunks(),
                            " chunks, the spec has p = ", p, ", V = ", V));
  Checker(spec, schedule).run();
}

}  // namespace mt::pipeline
