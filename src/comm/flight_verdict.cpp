#include "comm/flight_verdict.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "core/error.h"

namespace mt::comm::flight {

namespace {

bool is_collective(OpKind k) { return k != OpKind::send && k != OpKind::recv; }

// "rank 3 (host h1; stopped (SIGSTOP))"
std::string who(const RankView& r) {
  std::string extra;
  if (!r.host.empty()) extra = "host " + r.host;
  if (!r.fate.empty()) extra += (extra.empty() ? "" : "; ") + r.fate;
  return extra.empty() ? str("rank ", r.rank) : str("rank ", r.rank, " (", extra, ")");
}

std::string where(const RankView& r, bool missing_from_majority) {
  const int p = position(r.ops);
  if (p >= 0) {
    const Op& op = r.ops[p];
    return str(who(r), " is in ", describe_op(op), op.state == State::queued ? " (queued behind earlier operations)" : "");
  }
  if (r.ops.empty()) return str(who(r), " recorded no operation");
  const Op& last = r.ops.back();
  return str(who(r), missing_from_majority ? " has not entered it: its last operation was " : " is between operations: its last was ",
             describe_op(last), " (", state_name(last.state), ")");
}

std::string join_ranks(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); i++) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

// "ranks 0, 1 (host A) timed out waiting for rank 2 (host B), rank 3 (host B) for rank 1 (host A)"
std::string waits_text(const std::map<std::pair<std::string, int>, std::vector<int>>& waits,
                       const std::map<int, std::string>& host_of) {
  std::string s;
  for (const auto& [key, who] : waits) {
    const auto& [host, peer] = key;
    s += str(s.empty() ? "" : ", ", who.size() > 1 ? "ranks " : "rank ", join_ranks(who), " (host ", host, ")",
             s.empty() ? " timed out waiting for rank " : " for rank ", peer, " (host ", host_of.at(peer), ")");
  }
  return s;
}

}  // namespace

std::string cut_link(const std::vector<RankView>& ranks) {
  std::map<int, std::string> host_of;
  for (const RankView& r : ranks) host_of[r.rank] = r.host;
  // (waiter's host, waited rank) -> waiters, and the directed host pairs the waits join.
  std::map<std::pair<std::string, int>, std::vector<int>> waits;
  std::set<std::pair<std::string, std::string>> dir;
  for (const RankView& r : ranks) {
    if (r.ops.empty() || position(r.ops) < 0) return "";  // wrote no ring, or not inside an operation
    const bool timed_out = starts_with(r.fate, "timed out");
    if (!r.fate.empty() && !timed_out && !starts_with(r.fate, "ended by SIGTERM")) return "";  // died or failed
    if (timed_out && r.waited < 0) return "";  // a wait whose peer is not known
    if (r.waited < 0) continue;
    const auto peer = host_of.find(r.waited);
    if (peer == host_of.end() || r.host.empty() || peer->second.empty() || peer->second == r.host) return "";
    waits[{r.host, r.waited}].push_back(r.rank);
    dir.insert({r.host, peer->second});
  }
  if (dir.empty()) return "";
  for (auto& [key, who] : waits) std::sort(who.begin(), who.end());
  const std::string tail = "; no rank died or left its operation";
  // The hosts every wait touches: one pair joined both ways, or one host H joined to each other host both ways
  // (each other host waited for H, and H waited for some of them).
  std::set<std::string> common;
  for (const auto& [a, b] : dir) common.insert({a, b});
  for (const auto& [a, b] : dir) {
    std::set<std::string> keep;
    for (const std::string& h : common)
      if (h == a || h == b) keep.insert(h);
    common = keep;
  }
  if (common.empty()) return "";
  if (common.size() == 2) {  // two hosts only: both directions
    const std::string a = *common.begin(), b = *common.rbegin();
    if (!dir.count({a, b}) || !dir.count({b, a})) return "";
    return str("the link between host ", a, " and host ", b, " is down or partitioned: ", waits_text(waits, host_of),
               tail);
  }
  const std::string h = *common.begin();
  bool from_h = false;
  std::set<std::string> others;
  for (const auto& [a, b] : dir) {
    from_h = from_h || a == h;
    others.insert(a == h ? b : a);
  }
  std::string names;
  for (const std::string& x : others) {
    if (!dir.count({x, h})) return "";  // a host that H waited for but that did not wait for H
    names += (names.empty() ? "" : ", ") + x;
  }
  if (!from_h || names.empty()) return "";
  return str("host ", h, " is cut off from host", names.find(',') == std::string::npos ? " " : "s ", names,
             " (its link is down or partitioned): ", waits_text(waits, host_of), tail);
}

int position(const std::vector<Op>& ops) {
  int best = -1;
  for (size_t i = 0; i < ops.size(); i++) {
    const State s = ops[i].state;
    const bool blocks = is_collective(ops[i].kind) ? s == State::queued || s == State::started || s == State::failed
                                                   : s == State::waiting || s == State::failed;
    if (!blocks) continue;
    if (best < 0 || ops[i].id < ops[best].id) best = static_cast<int>(i);
  }
  return best;
}

static Verdict verdict_of_classes(const std::vector<RankView>& ranks) {
  Verdict v;
  if (ranks.empty()) return v;
  // Classes of ranks whose position is the same collective.
  using Key = std::tuple<std::string, int, uint64_t>;
  std::map<Key, std::vector<int>> classes;  // key -> indices into ranks
  for (size_t i = 0; i < ranks.size(); i++) {
    const int p = position(ranks[i].ops);
    if (p < 0) continue;
    const Op& op = ranks[i].ops[p];
    if (!is_collective(op.kind)) continue;
    classes[{op.group, static_cast<int>(op.kind), op.seq}].push_back(static_cast<int>(i));
  }
  const std::vector<int>* major = nullptr;
  for (const auto& [key, members] : classes) {
    if (members.size() < 2 && classes.size() > 1) continue;  // a lone rank is the majority only when alone
    if (!major || members.size() > major->size() ||
        (members.size() == major->size() && ranks[members[0]].rank < ranks[(*major)[0]].rank))
      major = &members;
  }
  if (!major) {
    std::string s = "no two ranks are in the same collective: ";
    for (size_t i = 0; i < ranks.size(); i++) {
      s += (i ? "; " : "") + where(ranks[i], false);
      v.odd.push_back(ranks[i].rank);
    }
    std::sort(v.odd.begin(), v.odd.end());
    v.line = s;
    return v;
  }
  const RankView& any = ranks[(*major)[0]];
  const std::string op = describe_op(any.ops[position(any.ops)]);
  std::vector<size_t> odd;
  for (size_t i = 0; i < ranks.size(); i++)
    if (std::find(major->begin(), major->end(), static_cast<int>(i)) == major->end()) odd.push_back(i);
  std::sort(odd.begin(), odd.end(), [&](size_t a, size_t b) { return ranks[a].rank < ranks[b].rank; });
  if (odd.empty()) {
    std::string s = str("all ", ranks.size(), " ranks are in ", op, ": none is missing, the operation itself did not end");
    for (const RankView& r : ranks)
      if (!r.fate.empty() || !r.host.empty()) s += "; " + who(r);
    v.line = s;
    return v;
  }
  for (size_t i : odd) v.odd.push_back(ranks[i].rank);
  std::string s = str("all ranks but ", join_ranks(v.odd), " entered ", op);
  for (size_t i : odd) s += "; " + where(ranks[i], true);
  v.line = s;
  return v;
}

Verdict verdict(const std::vector<RankView>& ranks) {
  Verdict v = verdict_of_classes(ranks);
  v.link = cut_link(ranks);
  if (!v.link.empty()) v.line = v.link + "; " + v.line;
  return v;
}

}  // namespace mt::comm::flight
