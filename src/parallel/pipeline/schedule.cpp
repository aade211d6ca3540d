#include "parallel/pipeline/schedule.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "core/error.h"

namespace mt::pipeline {

const char* action_name(ActionKind k) {
  switch (k) {
    case ActionKind::forward: return "forward";
    case ActionKind::backward: return "backward";
    case ActionKind::recv_act: return "recv_act";
    case ActionKind::send_act: return "send_act";
    case ActionKind::recv_grad: return "recv_grad";
    case ActionKind::send_grad: return "send_grad";
  }
  return "?";
}

void ScheduleSpec::validate() const {
  MT_CHECK_INPUT(name == "gpipe" || name == "1f1b" || name == "interleaved",
                 "--schedule must be gpipe, 1f1b or interleaved, got '", name, "'");
  MT_CHECK_INPUT(stages >= 1, "--stages (pipeline ranks) must be >= 1, got ", stages);
  MT_CHECK_INPUT(micro_batches >= 1, "--micro-batches must be >= 1, got ", micro_batches);
  if (name == "interleaved") {
    MT_CHECK_INPUT(virtual_stages >= 2, "the interleaved schedule needs --virtual-stages >= 2, got ", virtual_stages);
    MT_CHECK_INPUT(micro_batches % stages == 0, "the interleaved schedule needs --micro-batches (", micro_batches,
                   ") divisible by the pipeline ranks (", stages, ")");
  } else {
    MT_CHECK_INPUT(virtual_stages == 1, "--virtual-stages ", virtual_stages, " needs --schedule interleaved");
  }
}

namespace {

// Appends the receive a compute needs, the compute, and the send it produces, for global stage s of S.
struct Emitter {
  int p, S;
  std::vector<Action>& out;
  int rank_of(int s) const { return s % p; }
  void forward(int i, int c, int j) {
    int s = c * p + j;
    if (s > 0) out.push_back({ActionKind::recv_act, i, c, rank_of(s - 1)});
    out.push_back({ActionKind::forward, i, c, -1});
    if (s < S - 1) out.push_back({ActionKind::send_act, i, c, rank_of(s + 1)});
  }
  void backward(int i, int c, int j) {
    int s = c * p + j;
    if (s < S - 1) out.push_back({ActionKind::recv_grad, i, c, rank_of(s + 1)});
    out.push_back({ActionKind::backward, i, c, -1});
    if (s > 0) out.push_back({ActionKind::send_grad, i, c, rank_of(s - 1)});
  }
};

}  // namespace

std::vector<std::vector<Action>> make_schedule(const ScheduleSpec& spec) {
  spec.validate();
  const int p = spec.stages, m = spec.micro_batches, V = spec.virtual_stages;
  std::vector<std::vector<Action>> ranks(p);
  for (int j = 0; j < p; j++) {
    Emitter e{p, p * V, ranks[j]};
    if (spec.name == "gpipe") {
      // All forwards, then all backwards in the same micro-batch order (the order does not change the
      // bubble; keeping it FIFO makes the last stage start backward with the micro-batch it finished first).
      for (int i = 0; i < m; i++) e.forward(i, 0, j);
      for (int i = 0; i < m; i++) e.backward(i, 0, j);
    } else if (spec.name == "1f1b") {
      // Warm-up p-j-1 forwards, then one forward / one backward, then the remaining backwards. At most
      // p-j micro-batches are in flight on rank j.
      const int warm = std::min(p - j - 1, m);
      int f = 0, b = 0;
      for (; f < warm; f++) e.forward(f, 0, j);
      for (; f < m; f++, b++) {
        e.forward(f, 0, j);
        e.backward(b, 0, j);
      }
      for (; b < m; b++) e.backward(b, 0, j);
    } else {
      // Interleaved 1F1B (Narayanan et al. 2021): forward unit k works on chunk (k / p) % V of micro-batch
      // (k / (p V)) p + k % p; backward units visit the chunks in reverse. Warm-up (p-j-1)*2 + (V-1)*p units.
      const int total = m * V;
      auto fwd_of = [&](int k, bool backward) {
        int c = (k / p) % V;
        if (backward) c = V - 1 - c;
        int i = (k / (p * V)) * p + k % p;
        return std::make_pair(i, c);
      };
      const int warm = std::min((p - j - 1) * 2 + (V - 1) * p, total);
      int f = 0, b = 0;
      for (; f < warm; f++) {
        auto [i, c] = fwd_of(f, false);
        e.forward(i, c, j);
      }
      for (; f < total; f++, b++) {
        auto [i, c] = fwd_of(f, false);
        e.forward(i, c, j);
        auto [bi, bc] = fwd_of(b, true);
        e.backward(bi, bc, j);
      }
      for (; b < total; b++) {
        auto [bi, bc] = fwd_of(b, true);
        e.backward(bi, bc, j);
      }
    }
  }
  return ranks;
}

void check_schedule(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& ranks) {
  const int p = spec.stages, m = spec.micro_batches, V = spec.virtual_stages, S = p * V;
  MT_REQUIRE(Error, (int)ranks.size() == p, "schedule has ", ranks.size(), " ranks, expected ", p);
  // Per rank: every (i, c) forwarded once, then backwarded once; receives right where they are needed.
  for (int j = 0; j < p; j++) {
    std::set<std::pair<int, int>> fwd, bwd;
    for (const Action& a : ranks[j]) {
      auto key = std::make_pair(a.micro_batch, a.chunk);
      if (a.kind == ActionKind::forward) {
        MT_REQUIRE(Error, fwd.insert(key).second, "rank ", j, ": micro-batch ", a.micro_batch, " chunk ", a.chunk,
                   " forwarded twice");
      } else if (a.kind == ActionKind::backward) {
        MT_REQUIRE(Error, fwd.count(key), "rank ", j, ": backward of micro-batch ", a.micro_batch, " chunk ",
                   a.chunk, " before its forward");
        MT_REQUIRE(Error, bwd.insert(key).second, "rank ", j, ": micro-batch ", a.micro_batch, " chunk ", a.chunk,
                   " backwarded twice");
      }
    }
    MT_REQUIRE(Error, (int)fwd.size() == m * V && (int)bwd.size() == m * V, "rank ", j, " runs ", fwd.size(),
               " forwards and ", bwd.size(), " backwards, expected ", m * V, " each");
  }
  // Execute: non-blocking sends deposit messages; a rank blocks on a receive until its message exists.
  // Message key: (is_grad, micro-batch, receiving global stage).
  std::map<std::tuple<bool, int, int>, int> mailbox;  // -> sender rank
  std::vector<size_t> pc(p, 0);
  std::vector<std::set<std::pair<int, int>>> have_act(p), have_grad(p);
  for (bool progress = true; progress;) {
    progress = false;
    for (int j = 0; j < p; j++) {
      while (pc[j] < ranks[j].size()) {
        const Action& a = ranks[j][pc[j]];
        const int s = a.chunk * p + j;
        if (a.kind == ActionKind::send_act || a.kind == ActionKind::send_grad) {
          const bool grad = a.kind == ActionKind::send_grad;
          const int to = grad ? s - 1 : s + 1;
          MT_REQUIRE(Error, to >= 0 && to < S && a.peer == to % p, "rank ", j, ": ", action_name(a.kind),
                     " of micro-batch ", a.micro_batch, " to rank ", a.peer, " does not go to stage ", to);
          auto key = std::make_tuple(grad, a.micro_batch, to);
          MT_REQUIRE(Error, !mailbox.count(key), "rank ", j, ": ", action_name(a.kind), " of micro-batch ",
                     a.micro_batch, " sent twice");
          mailbox[key] = j;
        } else if (a.kind == ActionKind::recv_act || a.kind == ActionKind::recv_grad) {
          const bool grad = a.kind == ActionKind::recv_grad;
          auto key = std::make_tuple(grad, a.micro_batch, s);
          auto it = mailbox.find(key);
          if (it == mailbox.end()) break;  // blocked
          MT_REQUIRE(Error, it->second == a.peer, "rank ", j, ": ", action_name(a.kind), " of micro-batch ",
                     a.micro_batch, " expects rank ", a.peer, " but rank ", it->second, " sent it");
          mailbox.erase(it);
          (grad ? have_grad : have_act)[j].insert({a.micro_batch, a.chunk});
        } else if (a.kind == ActionKind::forward) {
          MT_REQUIRE(Error, s == 0 || have_act[j].count({a.micro_batch, a.chunk}), "rank ", j, ": forward of ",
                     "micro-batch ", a.micro_batch, " chunk ", a.chunk, " before receiving its activation");
        } else {
          MT_REQUIRE(Error, s == S - 1 || have_grad[j].count({a.micro_batch, a.chunk}), "rank ", j,
                     ": backward of micro-batch ", a.micro_batch, " chunk ", a.chunk,
                     " before receiving its gradient");
        }
        pc[j]++;
        progress = true;
      }
    }
  }
  for (int j = 0; j < p; j++) {
    if (pc[j] < ranks[j].size()) {
      const Action& a = ranks[j][pc[j]];
      throw Error(str("deadlock: rank ", j, " waits forever at action ", pc[j], " (", action_name(a.kind),
                      " of micro-batch ", a.micro_batch, " chunk ", a.chunk, " from rank ", a.peer, ")"));
    }
  }
  MT_REQUIRE(Error, mailbox.empty(), mailbox.size(), " message(s) sent but never received");
}

}  // namespace mt::pipeline
