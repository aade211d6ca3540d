// `meshtrain bench comm` end to end: the table comes out, results are checked, bad flags are rejected
// with their values named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

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

// --bound: every all_gather / all_to_all(_v) row carries the single-copy bound's time (a number, not '-': the
// process_vm_readv copies worked) and ours/bnd = bound time / our time; other collectives' rows have no such columns.
// The bench checks that the bound's copies leave the collective's output in recv (else it fails, rc != 0): with
// all_to_all_v in the list, a bound reading the wrong block of a peer's send buffer fails here.
TEST(BenchCommCli, BoundColumnsOnTheCopyRows) {
  std::string out;
  int rc = run(std::string(MESHTRAIN_BIN) +
                   " bench comm --nproc 2 --ops all_gather,reduce_scatter,all_to_all_v --min-bytes 64K --max-bytes 128K"
                   " --seconds-per-size 0.01 --no-mpi-peer --bound",
               &out);
  ASSERT_EQ(rc, 0) << out;
  std::istringstream in(out);
  std::string line, section;
  int bound_rows = 0, plain_rows = 0;
  while (std::getline(in, line)) {
    if (line.rfind("# ", 0) == 0 && line.find(' ', 2) == std::string::npos) section = line.substr(2);
    if (line.empty() || line[0] == '#') continue;
    std::istringstream f(line);
    std::vector<std::string> v;
    for (std::string x; f >> x;) v.push_back(x);
    if (section == "reduce_scatter") {
      EXPECT_EQ(v.size(), 14u) << line;
      plain_rows++;
      continue;
    }
    ASSERT_EQ(v.size(), 17u) << section << ": " << line;
    const double us = std::stod(v[4]), bnd = std::stod(v[14]), ours = std::stod(v[15]);
    EXPECT_GT(bnd, 0) << line;
    // Both times are printed to one decimal, so the printed ratio (two decimals, from the unrounded times) lies
    // between the ratios of the rounded times' extremes, plus half a unit of its own last place.
    const double lo = (bnd - 0.05) / (us + 0.05) - 0.005, hi = (bnd + 0.05) / std::max(us - 0.05, 1e-9) + 0.005;
    EXPECT_GE(ours, lo) << line;
    EXPECT_LE(ours, hi) << line;
    EXPECT_EQ(v[16], "-") << line;  // no OpenMPI run
    bound_rows++;
  }
  EXPECT_EQ(bound_rows, 4) << out;
  EXPECT_EQ(plain_rows, 2) << out;
  EXPECT_NE(out.find("# bound = single-copy bound"), std::string::npos) << out;
}

// --buffers: shared (the default) puts both buffers in the job's shared heap and every single-copy read of a peer is
// a load; private reads through the kernel. The header says which, with rank 0's reads by path (single copy from
// 32 KB here whatever the binding).
TEST(BenchCommCli, BuffersSharedReadWithLoadsPrivateThroughTheKernel) {
  auto reads = [](const std::string& out, const char* path) {
    const std::string key = std::string(" calls by ") + path;
    const size_t at = out.find(key);
    if (at == std::string::npos) return -1L;
    const size_t start = out.rfind(" in ", at) + 4;
    return std::stol(out.substr(start, at - start));
  };
  for (const char* mode : {"shared", "private"}) {
    std::string out;
    const int rc = run("MESHTRAIN_SHM_CMA_GATHER_KB=32 " + std::string(MESHTRAIN_BIN) +
                           " bench comm --nproc 2 --ops all_gather,all_to_all,all_to_all_v --min-bytes 64K"
                           " --max-bytes 128K --seconds-per-size 0.01 --no-mpi-peer --buffers " + mode,
                       &out);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_EQ(out.find("WRONG"), std::string::npos) << out;
    EXPECT_NE(out.find(std::string("# buffers = ") + mode), std::string::npos) << out;
    const long loads = reads(out, "ordinary loads"), kernel = reads(out, "process_vm_readv");
    if (std::string(mode) == "shared") {
      EXPECT_GT(loads, 0) << out;
      EXPECT_EQ(kernel, 0) << out;
    } else {
      EXPECT_EQ(loads, 0) << out;
      EXPECT_GT(kernel, 0) << out;
    }
  }
  std::string out;
  EXPECT_EQ(run(std::string(MESHTRAIN_BIN) + " bench comm --buffers pinned", &out), 1);
  EXPECT_NE(out.find("--buffers"), std::string::npos) << out;
  EXPECT_NE(out.find("pinned"), std::string::npos) << out;
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
  out.clear();
  EXPECT_EQ(run(std::string(MESHTRAIN_BIN) + " bench comm --stores auto,sideways", &out), 1);
  EXPECT_NE(out.find("--stores: 'sideways' is not one of auto, ordinary, streaming"), std::string::npos) << out;
}

// --stores with several modes: one checked row per mode and size, in the order given, each labelled; the
// fixed modes report all (nt) or none (ord) of rank 0's copies into shared memory as streamed.
TEST(BenchCommCli, StoresGiveOneCheckedRowPerMode) {
  std::string out;
  // The stores are those of the staged path: keep 64-128 KB off the single copy that bound ranks take from 32 KB.
  int rc = run("MESHTRAIN_SHM_CMA_GATHER_KB=16384 " + std::string(MESHTRAIN_BIN) +
                   " bench comm --nproc 2 --ops all_gather --min-bytes 64K --max-bytes 128K --seconds-per-size 0.01"
                   " --no-mpi-peer --stores streaming,ordinary,auto",
               &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(out.find("WRONG"), std::string::npos) << out;
  std::vector<std::vector<std::string>> rows;
  size_t at = 0;
  while ((at = out.find("\n ", at)) != std::string::npos) {
    std::istringstream line(out.substr(at + 1, out.find('\n', at + 1) - at - 1));
    std::vector<std::string> cols;
    for (std::string c; line >> c;) cols.push_back(c);
    if (cols.size() == 14) rows.push_back(cols);
    ++at;
  }
  ASSERT_EQ(rows.size(), 6u) << out;
  const char* want[] = {"nt", "ord", "auto"};
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i][0], i < 3 ? "65536" : "131072") << out;
    EXPECT_EQ(rows[i][7], "ok") << out;
    EXPECT_EQ(rows[i][12], want[i % 3]) << out;
    if (i % 3 == 0) { EXPECT_EQ(rows[i][13], "100") << out; }
    if (i % 3 == 1) { EXPECT_EQ(rows[i][13], "0") << out; }
  }
}

}  // namespace
