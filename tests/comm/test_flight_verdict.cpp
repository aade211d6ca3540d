// The flight recorder's ring (wrap-around, late marks, fault specs) and the verdict over synthetic rings of
// several shapes (flight_verdict.h states the rule these check). No processes.
#include <gtest/gtest.h>

#include <memory>

#include "comm/flight_recorder.h"
#include "comm/flight_verdict.h"
#include "core/error.h"

namespace mt::comm::flight {
namespace {

Op coll(uint64_t id, const char* group, OpKind k, uint64_t seq, State s) {
  Op o;
  o.id = id;
  o.group = group;
  o.kind = k;
  o.seq = seq;
  o.state = s;
  return o;
}
Op msg(uint64_t id, const char* group, OpKind k, uint64_t n, int peer, State s) {
  Op o = coll(id, group, k, n, s);
  o.peer = peer;
  return o;
}
RankView rank(int r, std::vector<Op> ops, std::string host = "", std::string fate = "") {
  RankView v;
  v.rank = r;
  v.ops = std::move(ops);
  v.host = std::move(host);
  v.fate = std::move(fate);
  return v;
}

TEST(FlightVerdict, OneRankInAMessageWhileTheOthersAreInACollective) {
  // The issue's example: ranks 0-2 wait in all_reduce #412 on dp; rank 3 sits in a send to rank 2 on pp.
  std::vector<RankView> ranks;
  for (int r = 0; r < 3; r++)
    ranks.push_back(rank(r, {coll(1, "dp", OpKind::all_reduce, 411, State::done),
                             coll(2, "dp", OpKind::all_reduce, 412, r == 0 ? State::failed : State::started)}));
  ranks.push_back(rank(3, {coll(1, "dp", OpKind::all_reduce, 411, State::done),
                           msg(2, "pp", OpKind::send, 17, 2, State::waiting)}, "h1"));
  const Verdict v = verdict(ranks);
  EXPECT_EQ(v.line, "all ranks but 3 entered all_reduce #412 on group dp; rank 3 (host h1) is in send #17 to rank 2 "
                    "on group pp");
  EXPECT_EQ(v.odd, std::vector<int>({3}));
}

TEST(FlightVerdict, AStalledRankBetweenOperations) {
  std::vector<RankView> ranks;
  for (int r = 0; r < 4; r++) {
    if (r == 1) {
      ranks.push_back(rank(1, {coll(7, "world", OpKind::barrier, 3, State::done),
                               coll(8, "world", OpKind::all_reduce, 4, State::done)}, "h", "stopped (SIGSTOP)"));
    } else {
      ranks.push_back(rank(r, {coll(8, "world", OpKind::all_reduce, 4, State::done),
                               coll(9, "world", OpKind::all_reduce, 5, State::failed)}, "h"));
    }
  }
  const Verdict v = verdict(ranks);
  EXPECT_EQ(v.line, "all ranks but 1 entered all_reduce #5 on group world; rank 1 (host h; stopped (SIGSTOP)) has "
                    "not entered it: its last operation was all_reduce #4 on group world (done)");
  EXPECT_EQ(v.odd, std::vector<int>({1}));
}

TEST(FlightVerdict, PositionIsTheEarliestUnfinishedOperation) {
  // A queued non-blocking all-reduce (id 5) is ahead of a failed blocking one (id 6) and a later failure (7):
  // the rank is in #5, whatever the ring's slot order.
  std::vector<Op> ops = {coll(7, "dp", OpKind::barrier, 9, State::failed), coll(4, "dp", OpKind::all_gather, 3, State::done),
                         coll(6, "dp", OpKind::all_reduce, 8, State::failed),
                         coll(5, "dp", OpKind::all_reduce, 7, State::queued)};
  EXPECT_EQ(position(ops), 3);
  std::vector<RankView> ranks = {rank(0, ops), rank(1, {coll(5, "dp", OpKind::all_reduce, 7, State::started)}),
                                 rank(2, {coll(5, "dp", OpKind::all_gather, 3, State::done)})};
  const Verdict v = verdict(ranks);
  EXPECT_EQ(v.line, "all ranks but 2 entered all_reduce #7 on group dp; rank 2 has not entered it: its last operation "
                    "was all_gather #3 on group dp (done)");
}

TEST(FlightVerdict, EveryRankInTheSameCollective) {
  std::vector<RankView> ranks;
  for (int r = 0; r < 3; r++) ranks.push_back(rank(r, {coll(3, "tp", OpKind::reduce_scatter, 12, State::started)}));
  ranks[2].fate = "killed by signal 9 (SIGKILL)";
  const Verdict v = verdict(ranks);
  EXPECT_EQ(v.line, "all 3 ranks are in reduce_scatter #12 on group tp: none is missing, the operation itself did not "
                    "end; rank 2 (killed by signal 9 (SIGKILL))");
  EXPECT_TRUE(v.odd.empty());
}

TEST(FlightVerdict, MessagesNeverFormAClass) {
  // Two pipeline stages each waiting to receive from the other: a cycle, no collective in common.
  // Rank 0's posted send (#2, not waited on) does not block it: its receive does.
  std::vector<RankView> ranks = {rank(0, {msg(3, "pp", OpKind::send, 2, 1, State::started),
                                          msg(4, "pp", OpKind::recv, 3, 1, State::failed)}),
                                 rank(1, {msg(9, "pp", OpKind::recv, 3, 0, State::waiting)})};
  const Verdict v = verdict(ranks);
  EXPECT_EQ(v.line, "no two ranks are in the same collective: rank 0 is in recv #3 from rank 1 on group pp; rank 1 is "
                    "in recv #3 from rank 0 on group pp");
  EXPECT_EQ(v.odd, std::vector<int>({0, 1}));
  // A stalled rank with only a posted send is between operations, shown with its last one and its state.
  ranks[1] = rank(1, {msg(8, "pp", OpKind::recv, 2, 0, State::done), msg(9, "pp", OpKind::send, 3, 0, State::started)},
                  "", "stopped (SIGSTOP)");
  EXPECT_EQ(verdict(ranks).line, "no two ranks are in the same collective: rank 0 is in recv #3 from rank 1 on group "
                                 "pp; rank 1 (stopped (SIGSTOP)) is between operations: its last was send #3 to rank 0 "
                                 "on group pp (started)");
}

TEST(FlightVerdict, TheLargestClassWinsAndTiesGoToTheLowestRank) {
  // Ranks 0 and 3 in all_reduce #2 on tp, ranks 1 and 2 in all_reduce #2 on another group named tp too (the
  // same class: names, not instances), rank 4 dead with nothing recorded, rank 5 in a queued barrier.
  std::vector<RankView> ranks = {rank(0, {coll(2, "tp", OpKind::all_reduce, 2, State::started)}),
                                 rank(1, {coll(2, "dp", OpKind::all_gather, 1, State::started)}),
                                 rank(2, {coll(2, "dp", OpKind::all_gather, 1, State::started)}),
                                 rank(3, {coll(2, "tp", OpKind::all_reduce, 2, State::started)}),
                                 rank(4, {}, "", "killed by signal 9 (SIGKILL)"),
                                 rank(5, {coll(2, "world", OpKind::barrier, 1, State::queued)})};
  const Verdict v = verdict(ranks);
  EXPECT_EQ(v.line, "all ranks but 1, 2, 4, 5 entered all_reduce #2 on group tp; rank 1 is in all_gather #1 on group "
                    "dp; rank 2 is in all_gather #1 on group dp; rank 4 (killed by signal 9 (SIGKILL)) recorded no "
                    "operation; rank 5 is in barrier #1 on group world (queued behind earlier operations)");
  EXPECT_EQ(v.odd, std::vector<int>({1, 2, 4, 5}));
  // A tie of two classes of two: the one holding rank 0 wins.
  ranks[0].ops[0] = coll(2, "pp", OpKind::barrier, 4, State::started);
  ranks[3].ops[0] = coll(2, "pp", OpKind::barrier, 4, State::started);
  EXPECT_EQ(verdict(ranks).odd, std::vector<int>({1, 2, 4, 5}));
  ranks[0].ops[0] = coll(2, "dp", OpKind::all_gather, 1, State::started);  // now 0, 1, 2 against 3 alone
  EXPECT_EQ(verdict(ranks).odd, std::vector<int>({3, 4, 5}));
}

TEST(FlightVerdict, OneRankInACollectiveIsTheMajorityOnlyWhenNoOtherIsInOne) {
  std::vector<RankView> ranks = {rank(0, {coll(3, "dp", OpKind::all_reduce, 7, State::failed)}),
                                 rank(1, {coll(3, "dp", OpKind::all_reduce, 6, State::done)}, "h", "killed by signal 9 (SIGKILL)")};
  EXPECT_EQ(verdict(ranks).line, "all ranks but 1 entered all_reduce #7 on group dp; rank 1 (host h; killed by signal 9 "
                                 "(SIGKILL)) has not entered it: its last operation was all_reduce #6 on group dp (done)");
  ranks[1].ops[0].state = State::started;  // two classes of one: no majority
  EXPECT_EQ(verdict(ranks).odd, std::vector<int>({0, 1}));
}

// ---- a cut link (flight_verdict.h's rule) ----

// Four ranks, two on each of hosts h0 and h1, all in all_gather #80 on world, as a link taken down leaves them:
// each timed out waiting for a rank on the other host (rank r waited for waited[r]).
std::vector<RankView> cut_ranks(std::vector<int> waited, std::vector<std::string> hosts = {"h0", "h0", "h1", "h1"}) {
  std::vector<RankView> ranks;
  for (int r = 0; r < static_cast<int>(waited.size()); r++) {
    RankView v = rank(r, {coll(1, "world", OpKind::all_gather, 79, State::done),
                          coll(2, "world", OpKind::all_gather, 80, State::failed)},
                      hosts[r], str("timed out waiting for rank ", waited[r]));
    v.waited = waited[r];
    ranks.push_back(std::move(v));
  }
  return ranks;
}

TEST(FlightVerdict, WaitsThatAllCrossOneLinkBothWaysNameIt) {
  const Verdict v = verdict(cut_ranks({2, 2, 1, 1}));
  const std::string link =
      "the link between host h0 and host h1 is down or partitioned: ranks 0, 1 (host h0) timed out waiting for rank 2 "
      "(host h1), ranks 2, 3 (host h1) for rank 1 (host h0); no rank died or left its operation";
  EXPECT_EQ(v.link, link);
  EXPECT_EQ(v.line, link + "; all 4 ranks are in all_gather #80 on group world: none is missing, the operation itself "
                           "did not end; rank 0 (host h0; timed out waiting for rank 2); rank 1 (host h0; timed out "
                           "waiting for rank 2); rank 2 (host h1; timed out waiting for rank 1); rank 3 (host h1; "
                           "timed out waiting for rank 1)");
  EXPECT_TRUE(v.odd.empty());
  // Survivors that mpirun ended (SIGTERM) inside the operation before their own deadline do not hide the link.
  std::vector<RankView> r = cut_ranks({3, 2, 0, 1});
  r[1].fate = "ended by SIGTERM (mpirun ending the job: another rank failed or died)";
  r[1].waited = -1;
  EXPECT_EQ(cut_link(r), "the link between host h0 and host h1 is down or partitioned: rank 0 (host h0) timed out "
                         "waiting for rank 3 (host h1), rank 2 (host h1) for rank 0 (host h0), rank 3 (host h1) for "
                         "rank 1 (host h0); no rank died or left its operation");
}

TEST(FlightVerdict, NoLinkIsNamedUnlessEveryWaitCrossesItBothWaysAndNoRankDied) {
  EXPECT_NE(cut_link(cut_ranks({2, 2, 1, 1})), "");  // the shape each case below breaks in one place
  EXPECT_EQ(cut_link(cut_ranks({2, 0, 1, 1})), "");  // rank 1 waited inside its own host
  std::vector<RankView> r = cut_ranks({2, 2, 1, 1});
  for (int i : {2, 3}) r[i].fate = "ended by SIGTERM", r[i].waited = -1;
  EXPECT_EQ(cut_link(r), "");  // one direction only: h1 may just be slow or stalled
  r = cut_ranks({2, 2, 1, 1});
  r[3].fate = "killed by signal 9 (SIGKILL)";
  EXPECT_EQ(cut_link(r), "");  // a rank died
  r = cut_ranks({2, 2, 1, 1});
  r[3].ops.pop_back();  // rank 3 is between operations (stalled or busy in its own code)
  EXPECT_EQ(cut_link(r), "");
  r = cut_ranks({2, 2, 1, 1});
  r[3].ops.clear();  // rank 3 wrote no ring
  EXPECT_EQ(cut_link(r), "");
  r = cut_ranks({2, 2, 1, 1});
  r[0].fate = "timed out (--comm-timeout)", r[0].waited = -1;  // a timeout whose peer is not known
  EXPECT_EQ(cut_link(r), "");
  r = cut_ranks({2, 2, 1, 1});
  r[0].fate = "failed";  // a rank that failed by itself (e.g. a full disk) with a wait recorded
  EXPECT_EQ(cut_link(r), "");
  EXPECT_EQ(cut_link(cut_ranks({2, 2, 1, 1}, {"h0", "h0", "", "h1"})), "");  // a host not known
}

TEST(FlightVerdict, AHostCutOffFromSeveralOthersIsNamed) {
  // Hosts h0, h1, h2 (two ranks each); h1's link is down: h0 and h2 wait for h1, h1 waits for h0.
  const std::vector<std::string> hosts = {"h0", "h0", "h1", "h1", "h2", "h2"};
  EXPECT_EQ(cut_link(cut_ranks({2, 3, 0, 0, 2, 2}, hosts)),
            "host h1 is cut off from hosts h0, h2 (its link is down or partitioned): rank 0 (host h0) timed out "
            "waiting for rank 2 (host h1), rank 1 (host h0) for rank 3 (host h1), ranks 2, 3 (host h1) for rank 0 "
            "(host h0), ranks 4, 5 (host h2) for rank 2 (host h1); no rank died or left its operation");
  EXPECT_EQ(cut_link(cut_ranks({2, 3, 4, 4, 0, 0}, hosts)), "");  // a cycle h0 -> h1 -> h2 -> h0: no common host
  // h1 waited for h2, but h2's ranks were ended by mpirun before their own deadline: h2 did not wait for h1.
  std::vector<RankView> r = cut_ranks({2, 3, 4, 4, 2, 2}, hosts);
  for (int i : {4, 5}) r[i].fate = "ended by SIGTERM", r[i].waited = -1;
  EXPECT_EQ(cut_link(r), "");
  r[4] = cut_ranks({2, 3, 4, 4, 2, 2}, hosts)[4];  // rank 4 did wait for h1: h1 is cut off from h0 and h2
  EXPECT_NE(cut_link(r), "");
}

// ---- the ring itself ----

struct AttachedRing {
  std::unique_ptr<Ring> ring = std::make_unique<Ring>();
  explicit AttachedRing(int world_rank) {
    init_ring(ring.get(), world_rank);
    attach(ring.get());
  }
  ~AttachedRing() { attach(nullptr); }
};

TEST(FlightRing, KeepsTheLastEntriesInOrderAndIgnoresLateMarks) {
  EXPECT_EQ(record("g", OpKind::barrier, 1, 0, -1, -1, State::started).e, nullptr);  // nothing attached: no-op
  AttachedRing a(2);
  const Slot first = record("world", OpKind::all_reduce, 1, 400, -1, -1, State::queued);
  mark(first, State::started);
  EXPECT_EQ(snapshot(*a.ring)[0].state, State::started);
  const int total = kFlightEntries + 10;
  for (int i = 2; i <= total; i++) record("a-very-long-group-name-that-is-cut", OpKind::send, i, 8, 5, -1, State::started);
  mark(first, State::done);  // its slot now holds operation kFlightEntries + 1: must not be touched
  const std::vector<Op> ops = snapshot(*a.ring);
  ASSERT_EQ(ops.size(), size_t(kFlightEntries));
  EXPECT_EQ(ops.front().id, uint64_t(total - kFlightEntries + 1));
  EXPECT_EQ(ops.back().id, uint64_t(total));
  EXPECT_EQ(ops.back().seq, uint64_t(total));
  for (const Op& op : ops) EXPECT_EQ(op.state, State::started);
  EXPECT_EQ(ops.back().group, std::string("a-very-long-group-name-that-is-cut").substr(0, kGroupChars - 1));
  EXPECT_EQ(describe_op(ops.back()), str("send #", total, " to rank 5 on group ", ops.back().group));
  EXPECT_GT(ops.back().t_started_ns, 0);
}

TEST(FlightRing, FaultSpecs) {
  FaultPoint f = parse_fault("3:17:stop");
  EXPECT_EQ(f.rank, 3);
  EXPECT_EQ(f.at, 17u);
  EXPECT_EQ(f.kind, FaultKind::stop);
  EXPECT_EQ(parse_fault("0:1:kill").kind, FaultKind::kill);
  EXPECT_EQ(parse_fault("1:2:lose").kind, FaultKind::lose);
  EXPECT_EQ(parse_fault("").kind, FaultKind::none);
  for (const char* bad : {"3:0:kill", "3:1", "x:1:kill", "-1:1:kill", "1:1:explode", "1::kill", "1:2:kill:"}) {
    try {
      parse_fault(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("MESHTRAIN_FAULT='") + bad + "'"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace mt::comm::flight
