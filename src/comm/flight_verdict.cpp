#include "comm/flight_verdict.h"

#include <algorithm>
#include <map>
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

}  // namespace

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

Verdict verdict(const std::vector<RankView>& ranks) {
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

}  // namespace mt::comm::flight
