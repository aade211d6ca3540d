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
#pragma once

#include <string>
#include <vector>

#include "comm/flight_recorder.h"

namespace mt::comm::flight {

struct RankView {
  int rank = -1;      // world rank
  std::string host;   // "" when unknown
  std::string fate;   // "" while running normally; else e.g. "stopped (SIGSTOP)", "killed by signal 9 (SIGKILL)"
  std::vector<Op> ops;  // the ring's entries, oldest first
};

struct Verdict {
  std::string line;      // the sentence above (no "meshtrain:" prefix, no newline)
  std::vector<int> odd;  // the odd ranks out (world ranks), ascending; empty when every rank is in one class
};

// The position of one rank: index into ops of its earliest unfinished operation, or -1.
int position(const std::vector<Op>& ops);
Verdict verdict(const std::vector<RankView>& ranks);

}  // namespace mt::comm::flight
