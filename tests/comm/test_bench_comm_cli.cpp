// `meshtrain bench comm` end to end: the table comes out, results are checked, bad flags are rejected
// with their values named.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace {

// Runs a shell command, returns its exit code and combined output.
int run(const std::string& cmd, std::string* out) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out->append(buf, n);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(BenchCommCli, PrintsCheckedTable) {
  std::string out;
  int rc = run(std::string(MESHTRAIN_BIN) +
                   " bench comm --nproc 3 --min-bytes 4K --max-bytes 64K --seconds-per-size 0.01 --no-mpi-peer",
               &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("# memcpy bandwidth"), std::string::npos) << out;
  EXPECT_NE(out.find("# all_reduce"), std::string::npos) << out;
  EXPECT_NE(out.find("# reduce_scatter"), std::string::npos) << out;
  EXPECT_NE(out.find("# all_gather"), std::string::npos) << out;
  EXPECT_NE(out.find("# broadcast"), std::string::npos) << out;
  EXPECT_NE(out.find("# all_to_all\n"), std::string::npos) << out;
  EXPECT_NE(out.find("# all_to_all_v"), std::string::npos) << out;
  EXPECT_NE(out.find("algbw * 1 for broadcast"), std::string::npos) << out;
  EXPECT_NE(out.find("       65536 "), std::string::npos) << out;
  EXPECT_EQ(out.find("WRONG"), std::string::npos) << out;
}

TEST(BenchCommCli, RejectsBadFlags) {
  std::string out;
  EXPECT_EQ(run(std::string(MESHTRAIN_BIN) + " bench comm --backend tcp", &out), 1);
  EXPECT_NE(out.find("--backend 'tcp' is not one of auto, shm, mpi"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(run(std::string(MESHTRAIN_BIN) + " bench comm --algo ring", &out), 1);
  EXPECT_NE(out.find("unknown algorithm 'ring'"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(run(std::string(MESHTRAIN_BIN) + " bench comm --ops all_gather,gossip", &out), 1);
  EXPECT_NE(out.find("unknown operation 'gossip'"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(run(std::string(MESHTRAIN_BIN) + " bench comm --rounds 0", &out), 1);
  EXPECT_NE(out.find("--rounds 0 is out of range"), std::string::npos) << out;
}

}  // namespace
