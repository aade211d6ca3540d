#include "parallel/pipeline/schedule_check.h"

#include <cstdint>
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

}  // namespace

void check_schedule(const ScheduleSpec& spec, const Schedule& schedule) {
  const int p = spec.stages, m = spec.micro_batches, V = spec.virtual_stages, S = p * V;
  MT_CHECK_INPUT(p >= 1 && m >= 1 && V >= 1, "check_schedule: p, m and V must be at least 1, got p = ", p, ", m = ", m,
                 ", V = ", V);
  if ((int)schedule.size() != p) throw ScheduleError(str("the schedule has ", schedule.size(), " lists for p = ", p, " ranks"));

  // ---- Each rank alone: shape, peers, order of computations and their messages. ----
  for (int j = 0; j < p; j++) {
    const std::vector<Action>& list = schedule[j];
    std::vector<uint16_t> state((size_t)m * V, 0);
    auto at = [&](int i, int c) -> uint16_t& { return state[(size_t)i * V + c]; };
    bool stepped = false;
    for (size_t k = 0; k < list.size(); k++) {
      const Action& a = list[k];
      auto fail = [&](const auto&... msg) { throw ScheduleError(str(where(j, k, a), ": ", msg...)); };
      if (stepped) fail("an action after optimizer_step, which must be the last");
      if (a.kind == ActionKind::optimizer_step) {
        if (a.micro_batch != -1 || a.chunk != -1 || a.peer != -1)
          fail("optimizer_step takes no micro-batch, chunk or peer (all -1)");
        stepped = true;
        continue;
      }
      if (a.micro_batch < 0 || a.micro_batch >= m) fail("micro-batch out of range [0, ", m, ")");
      if (a.chunk < 0 || a.chunk >= V) fail("chunk out of range [0, ", V, ")");
      const int i = a.micro_batch, c = a.chunk, s = stage_of(j, c, p);

      // The rank at the other end, as placement dictates.
      auto expect_peer = [&](int neighbour, const char* what) {
        if (neighbour < 0 || neighbour >= S) fail("stage ", s, " has no stage ", neighbour, " to ", what);
        const int r = rank_of_stage(neighbour, p);
        if (r == j) fail("stage ", neighbour, " is on this rank too: the tensor is handed over in memory, not sent");
        if (a.peer != r) fail("the peer must be rank ", r, ", which holds stage ", neighbour);
      };
      switch (a.kind) {
        case ActionKind::forward:
        case ActionKind::backward:
          if (a.peer != -1) fail("a computation has no peer (-1)");
          break;
        case ActionKind::send_act: expect_peer(s + 1, "send an activation to"); break;
        case ActionKind::post_recv_act:
        case ActionKind::wait_recv_act: expect_peer(s - 1, "receive an activation from"); break;
        case ActionKind::send_grad: expect_peer(s - 1, "send a gradient to"); break;
        case ActionKind::post_recv_grad:
        case ActionKind::wait_recv_grad: expect_peer(s + 1, "receive a gradient from"); break;
        case ActionKind::optimizer_step: break;
      }

      uint16_t& st = at(i, c);
      auto once = [&](Flag f, const char* what) {
        if (st & f) fail(what, " a second time");
        st |= f;
      };
      switch (a.kind) {
        case ActionKind::forward:
          if (s > 0 && rank_of_stage(s - 1, p) != j && !(st & kWaitedAct))
            fail("forward before its input activation is received (no wait_recv_act before it)");
          if (s > 0 && rank_of_stage(s - 1, p) == j && !(at(i, chunk_of_stage(s - 1, p)) & kForward))
            fail("forward of stage ", s, " before the forward of stage ", s - 1, " on this rank");
          once(kForward, "forward");
          break;
        case ActionKind::backward:
          if (!(st & kForward)) fail("backward before the forward of the same micro-batch and chunk");
          if (s < S - 1 && rank_of_stage(s + 1, p) != j && !(st & kWaitedGrad))
            fail("backward before its output gradient is received (no wait_recv_grad before it)");
          if (s < S - 1 && rank_of_stage(s + 1, p) == j && !(at(i, chunk_of_stage(s + 1, p)) & kBackward))
            fail("backward of stage ", s, " before the backward of stage ", s + 1, " on this rank");
          once(kBackward, "backward");
          break;
        case ActionKind::send_act:
          if (!(st & kForward)) fail("sends an activation before the forward that computes it");
          once(kSentAct, "sends the activation");
          break;
        case ActionKind::send_grad:
          if (!(st & kBackward)) fail("sends a gradient before the backward that computes it");
          once(kSentGrad, "sends the gradient");
          break;
        case ActionKind::post_recv_act: once(kPostedAct, "posts the receive"); break;
        case ActionKind::post_recv_grad: once(kPostedGrad, "posts the receive"); break;
        case ActionKind::wait_recv_act:
          if (!(st & kPostedAct)) fail("waits for a receive that was not posted before");
          once(kWaitedAct, "waits for the receive");
          break;
        case ActionKind::wait_recv_grad:
          if (!(st & kPostedGrad)) fail("waits for a receive that was not posted before");
          once(kWaitedGrad, "waits for the receive");
          break;
        case ActionKind::optimizer_step: break;
      }
    }
    if (!stepped) throw ScheduleError(str("rank ", j, ": the list does not end with optimizer_step"));
    for (int i = 0; i < m; i++) {
      for (int c = 0; c < V; c++) {
        const uint16_t st = at(i, c);
        const int s = stage_of(j, c, p);
        auto fail = [&](const auto&... msg) {
          throw ScheduleError(str("rank ", j, ", micro-batch ", i, ", chunk ", c, " (stage ", s, "): ", msg...));
        };
        if (!(st & kForward)) fail("never forwarded");
        if (!(st & kBackward)) fail("never backwarded");
        if (s < S - 1 && rank_of_stage(s + 1, p) != j && !(st & kSentAct)) fail("the activation is never sent");
        if (s > 0 && rank_of_stage(s - 1, p) != j && !(st & kSentGrad)) fail("the input gradient is never sent");
        // A post without its wait cannot get here: a post is only accepted for an input from another rank,
        // and the computation that needs that input, which did run, needed the wait.
      }
    }
  }

  // ---- Matching: per channel, the n-th posted receive is for the n-th sent message. ----
  auto channel = [&](const Message& msg) { return ((size_t)msg.from_rank * p + msg.to_rank) * 2 + (msg.grad ? 1 : 0); };
  std::vector<std::vector<Endpoint>> sends((size_t)p * p * 2), posts((size_t)p * p * 2);
  // post_index[j][(i * V + c) * 2 + grad]: the position on its channel of rank j's post for that message.
  std::vector<std::vector<size_t>> post_index((size_t)p, std::vector<size_t>((size_t)m * V * 2, 0));
  for (int j = 0; j < p; j++) {
    for (size_t k = 0; k < schedule[j].size(); k++) {
      const Action& a = schedule[j][k];
      if (is_send(a.kind)) {
        Message msg = message_of(a, j, p);
        sends[channel(msg)].push_back({msg, j, k});
      } else if (is_post(a.kind)) {
        Message msg = message_of(a, j, p);
        std::vector<Endpoint>& ch = posts[channel(msg)];
        post_index[j][((size_t)a.micro_batch * V + a.chunk) * 2 + (msg.grad ? 1 : 0)] = ch.size();
        ch.push_back({msg, j, k});
      }
    }
  }
  for (size_t ch = 0; ch < sends.size(); ch++) {
    const std::vector<Endpoint>& out = sends[ch];
    const std::vector<Endpoint>& in = posts[ch];
    const int from = (int)(ch / 2 / p), to = (int)(ch / 2 % p);
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

  // ---- No deadlock: replay with sends that never block. ----
  std::vector<size_t> sent((size_t)p * p * 2, 0), pc((size_t)p, 0);
  auto blocked_on = [&](int j) -> const Endpoint* {  // the send rank j waits for, or null if it can go on
    const Action& a = schedule[j][pc[j]];
    if (!is_wait(a.kind)) return nullptr;
    Message msg = message_of(a, j, p);
    const size_t ch = channel(msg);
    const size_t n = post_index[j][((size_t)a.micro_batch * V + a.chunk) * 2 + (msg.grad ? 1 : 0)];
    return sent[ch] > n ? nullptr : &sends[ch][n];
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int j = 0; j < p; j++) {
      while (pc[j] < schedule[j].size() && !blocked_on(j)) {
        const Action& a = schedule[j][pc[j]];
        if (is_send(a.kind)) sent[channel(message_of(a, j, p))]++;
        pc[j]++;
        progress = true;
      }
    }
  }
  std::string stuck;
  for (int j = 0; j < p; j++) {
    if (pc[j] == schedule[j].size()) continue;
    const Endpoint* e = blocked_on(j);
    stuck += str(stuck.empty() ? "" : "; ", where(j, pc[j], schedule[j][pc[j]]), " waits for rank ", e->rank,
                 "'s action ", e->k, " (", to_string(schedule[e->rank][e->k]), ")");
  }
  if (!stuck.empty()) throw ScheduleError("deadlock: " + stuck);
}

}  // namespace mt::pipeline
