// The verdict over a failed job's flight recorder rings (flight_recorder.h): one line naming the odd ranks out,
// e.g. "all ranks but 3 entered all_reduce #412 on group dp; rank 3 (host h1) is in send #17 to rank 2 on
// group pp". Pure: takes copies of the rings and what the launcher knows of each rank's fate; unit-tested on
// synthetic rings (tests/comm/test_flight_verdict.cpp).
//
// The rule. A rank's position is its earliest-issued operation that blocks it: a collective not done (queued,
// started, or failed: a rank that timed out marks its operation failed), or a message it waits on (waiting,
// failed); a message only posted (isend before the wait) does not block. A rank with no position is between
// operations (in computation, stalled or dead there), shown by its last recorded operation and its state. Ranks whose position is the same
// collective (group name, kind, #seq) form a class; the largest class with two or more ranks (ties: the one
// holding the lowest rank), or the only class when just one rank is in a collective (two ranks, one dead), is
// "the majority" and every other rank is odd:
//   - majority and odd ranks:  "all ranks but 3 entered <op>; rank 3 ... is in <op'>" (or "has not entered
//     it: its last operation was <op''>", or "recorded no operation")
//   - every rank in one class: "all N ranks are in <op>: none is missing, the operation itself did not end"
//   - no class of two:         "no two ranks are in the same collective: rank 0 is in ...; rank 1 ..."
// A rank's fate (stopped, killed, exited) and host are given where the rank is named. Messages (send/recv)
// never form a class: two ranks in a send are not in one operation.
//
// A cut link (ranks on several hosts, e.g. under mpirun across network namespaces). The verdict names a link
// when the rings show nothing but waits across it, which is what a link taken down (or a partition) leaves:
//   - every rank recorded operations and is inside one (position >= 0): none wrote no ring, none is between
//     operations (stalled or busy in its own code);
//   - no rank died or failed by itself: each fate is "" (still running), "timed out..." or "ended by SIGTERM..."
//     (mpirun ending the survivors);
//   - at least one rank timed out with a known peer (`waited` >= 0), every rank that timed out knows its peer,
//     and every such wait is on a rank of another host (both hosts known);
//   - the waits join exactly two hosts A and B, in both directions (a rank on A waited for one on B and a rank
//     on B for one on A): "the link between host A and host B is down or partitioned: ranks 0, 1 (host A) timed
//     out waiting for rank 2 (host B) and ranks 2, 3 (host B) for rank 1 (host A); no rank died or left its
//     operation"; or several hosts, each joined only to one host H and in both directions: "host H is cut off
//     from hosts A, B (its link is down or partitioned): ...".
// The sentence then leads the line, followed by "; " and the class sentence above. Waits in one direction
// only, a wait inside a host, or a wait whose peer is unknown name no link (a slow or stalled peer looks like
// that too). The rings cannot tell a cut link from a switch port down or a firewall: "down or partitioned".
#pragma once

#include <string>
#include <vector>

#include "comm/flight_recorder.h"

namespace mt::comm::flight {

struct RankView {
  int rank = -1;      // world rank
  std::string host;   // "" when unknown
  std::string fate;   // "" while running normally; else e.g. "stopped (SIGSTOP)", "killed by signal 9 (SIGKILL)"
  int waited = -1;    // a rank that timed out: the world rank it waited for (-1: none, or not known)
  std::vector<Op> ops;  // the ring's entries, oldest first
};

struct Verdict {
  std::string line;      // the sentence above (no "meshtrain:" prefix, no newline)
  std::vector<int> odd;  // the odd ranks out (world ranks), ascending; empty when every rank is in one class
  std::string link;      // the cut link's sentence (above) when the rings show one, else ""
};

// The position of one rank: index into ops of its earliest unfinished operation, or -1.
int position(const std::vector<Op>& ops);
Verdict verdict(const std::vector<RankView>& ranks);
// The cut link's sentence (rule above), or "" when the rings do not show one.
std::string cut_link(const std::vector<RankView>& ranks);

}  // namespace mt::comm::flight
