// Flight recorder rings as per-rank files (flight_files.h: what each rank writes under MPI) and their gathering
// into the verdict: a ring written and read back is the ring's snapshot; a rank without a file is named with the
// host the other ranks' files give for it; malformed or mixed files are refused naming the file. No processes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "comm/flight_files.h"
#include "comm/flight_recorder.h"
#include "comm/flight_verdict.h"
#include "core/error.h"

namespace mt::comm::flight {
namespace {

struct TempPrefix {
  std::string dir;
  TempPrefix() {
    char tmpl[] = "/tmp/mt_flight_files_XXXXXX";
    dir = mkdtemp(tmpl);
  }
  ~TempPrefix() { std::system(("rm -rf '" + dir + "'").c_str()); }
  std::string flight() const { return dir + "/m.jsonl.flight.json"; }
};

// A ring of `rank` with `done` finished all-reduces on "world" and, when `inside`, one more started.
std::unique_ptr<Ring> ring_of(int rank, int done, bool inside, const char* host) {
  auto ring = std::make_unique<Ring>();
  init_ring(ring.get(), rank);
  attach(ring.get());
  for (int i = 1; i <= done; i++) mark(record("world", OpKind::all_reduce, i, 64, -1, -1, State::started), State::done);
  if (inside) record("world", OpKind::all_reduce, done + 1, 64, -1, -1, State::started);
  attach(nullptr);
  std::snprintf(ring->host, kHostChars, "%s", host);
  return ring;
}

TEST(FlightFiles, RankFilePathSitsBesideTheFlightFile) {
  EXPECT_EQ(rank_file_path("/a/m.jsonl.flight.json", 3), "/a/m.jsonl.flight.rank3.json");
  EXPECT_EQ(rank_file_path("x", 0), "x.rank0.json");
}

TEST(FlightFiles, AWrittenRingReadsBackAsItsSnapshot) {
  TempPrefix t;
  auto ring = std::make_unique<Ring>();
  init_ring(ring.get(), 0);
  attach(ring.get());
  // More operations than the ring holds, of several kinds, one left waiting.
  for (int i = 1; i <= kFlightEntries + 7; i++)
    mark(record(i % 2 ? "dp" : "tp \"x\"\\y", i % 3 ? OpKind::all_gather : OpKind::broadcast, i, 100 + i, -1,
                i % 3 ? -1 : 1, State::queued),
         State::done);
  const Slot s = record("pp", OpKind::send, 4, 12, 2, -1, State::started);
  mark(s, State::waiting);
  attach(nullptr);
  std::snprintf(ring->host, kHostChars, "host \"q\"\nline");
  ASSERT_TRUE(write_rank_file(rank_file_path(t.flight(), 0).c_str(), *ring, 1, "[\"h0\"]", "timed out \"x\"", 2,
                              "err\\or\ttab"));
  const Gathered g = gather_rank_files(t.flight());
  ASSERT_EQ(g.size, 1);
  EXPECT_TRUE(g.missing.empty());
  const std::vector<Op> want = snapshot(*ring);
  const std::vector<Op>& got = g.views[0].ops;
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(got.size(), size_t{kFlightEntries});
  for (size_t i = 0; i < got.size(); i++) {
    EXPECT_EQ(got[i].id, want[i].id);
    EXPECT_EQ(got[i].state, want[i].state);
    EXPECT_EQ(got[i].kind, want[i].kind);
    EXPECT_EQ(got[i].seq, want[i].seq);
    EXPECT_EQ(got[i].bytes, want[i].bytes);
    EXPECT_EQ(got[i].peer, want[i].peer);
    EXPECT_EQ(got[i].root, want[i].root);
    EXPECT_EQ(got[i].group, want[i].group);
    EXPECT_EQ(got[i].t_queued_ns, want[i].t_queued_ns);
    EXPECT_EQ(got[i].t_started_ns, want[i].t_started_ns);
    EXPECT_EQ(got[i].t_done_ns, want[i].t_done_ns);
  }
  EXPECT_EQ(got.back().kind, OpKind::send);
  EXPECT_EQ(got.back().state, State::waiting);
  EXPECT_EQ(g.views[0].host, "host \"q\" line");  // a control character becomes a space
  EXPECT_EQ(g.views[0].fate, "timed out \"x\"");
  EXPECT_EQ(g.errors[0], "err\\or tab");
  EXPECT_EQ(g.waited[0], 2);
}

TEST(FlightFiles, ARankWithoutAFileIsNamedWithItsHostFromTheOthers) {
  // Ranks 0-2 wrote their rings, inside all_reduce #5; rank 3 (SIGKILLed, or behind a cut link) wrote nothing.
  TempPrefix t;
  const char* hosts = "[\"h0\", \"h0\", \"h1\", \"h1\"]";
  for (int r = 0; r < 3; r++) {
    auto ring = ring_of(r, 4, true, r < 2 ? "h0" : "h1");
    ASSERT_TRUE(write_rank_file(rank_file_path(t.flight(), r).c_str(), *ring, 4, hosts,
                                r == 0 ? "timed out waiting for rank 3" : "ended by SIGTERM", r == 0 ? 3 : -1, ""));
  }
  const Gathered g = gather_rank_files(t.flight());
  ASSERT_EQ(g.size, 4);
  EXPECT_EQ(g.missing, std::vector<int>({3}));
  EXPECT_TRUE(g.inside);
  EXPECT_EQ(g.views[3].host, "h1");
  EXPECT_TRUE(g.views[3].ops.empty());
  EXPECT_EQ(g.verdict.odd, std::vector<int>({3}));
  EXPECT_EQ(g.verdict.line, "all ranks but 3 entered all_reduce #5 on group world; rank 3 (host h1; " +
                                g.views[3].fate + ") recorded no operation");
  EXPECT_EQ(g.waited, std::vector<int>({3, -1, -1, -1}));
}

TEST(FlightFiles, WaitsAcrossOneLinkInTheFilesNameTheLink) {
  // Every rank wrote its ring inside all_reduce #3, timed out waiting for a rank on the other host (a cut link): the
  // files' waited_for reaches the verdict's rule (flight_verdict.h).
  TempPrefix t;
  const char* hosts = "[\"h0\", \"h0\", \"h1\", \"h1\"]";
  const int waited[4] = {2, 3, 0, 0};
  for (int r = 0; r < 4; r++) {
    auto ring = ring_of(r, 2, true, r < 2 ? "h0" : "h1");
    const std::string fate = "timed out waiting for rank " + std::to_string(waited[r]);
    ASSERT_TRUE(write_rank_file(rank_file_path(t.flight(), r).c_str(), *ring, 4, hosts, fate.c_str(), waited[r], ""));
  }
  const Gathered g = gather_rank_files(t.flight());
  ASSERT_EQ(g.size, 4);
  EXPECT_EQ(g.verdict.link, "the link between host h0 and host h1 is down or partitioned: rank 0 (host h0) timed out "
                            "waiting for rank 2 (host h1), rank 1 (host h0) for rank 3 (host h1), ranks 2, 3 (host h1) "
                            "for rank 0 (host h0); no rank died or left its operation");
  EXPECT_EQ(g.verdict.line.rfind(g.verdict.link + "; all 4 ranks are in all_reduce #3 on group world", 0), 0u)
      << g.verdict.line;
}

TEST(FlightFiles, NoFileMeansSizeZero) {
  TempPrefix t;
  EXPECT_EQ(gather_rank_files(t.flight()).size, 0);
}

TEST(FlightFiles, MalformedOrMixedFilesAreRefusedNamingTheFile) {
  TempPrefix t;
  const std::string f0 = rank_file_path(t.flight(), 0), f1 = rank_file_path(t.flight(), 1);
  std::ofstream(f0) << "{\"rank\": 0, \"size\": 2, \"host\": \"h\", \"fate\": \"\", \"waited_for\": -1, "
                       "\"error\": \"\", \"hosts\": [], \"ops\": [{\"id\": 1}]}";
  try {
    gather_rank_files(t.flight());
    FAIL() << "an op without its fields was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(f0), std::string::npos) << e.what();
  }
  auto ring = ring_of(0, 1, false, "h0");
  ASSERT_TRUE(write_rank_file(f0.c_str(), *ring, 2, nullptr, "", -1, ""));
  auto other = ring_of(1, 1, false, "h0");
  ASSERT_TRUE(write_rank_file(f1.c_str(), *other, 3, nullptr, "", -1, ""));  // a file of another job's size
  try {
    gather_rank_files(t.flight());
    FAIL() << "files of two sizes were accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(f1), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("disagrees"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mt::comm::flight
