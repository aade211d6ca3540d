// Issue 22, second half: streamed samples, bounded sizes and threads, SIGPIPE and SIGHUP handled like SIGTERM,
// the stalled rank named under every layout, one coherent message per failed job, and messages that name the
// flag (or file and key) at fault. Each test reproduces the reported case and asserts the wanted behaviour.
// Multi-rank tests find their ranks through MESHTRAIN_PIDS_FILE (the launcher writes "rank pid" lines there),
// use a tiny GPT and a --comm-timeout of a few seconds.
#include <sys/stat.h>

#include <regex>
#include <set>

#include "comm/shm/job.h"
#include "tests/cli/cli_test_util.h"

namespace mt::clitest {
namespace {

using Clock = std::chrono::steady_clock;

// A child whose stdout is a pipe this test reads (and may close), stderr a file, with extra environment.
class PipedChild {
 public:
  PipedChild(const std::vector<std::string>& args, const std::string& err_path,
             const std::vector<std::pair<std::string, std::string>>& env = {}) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      int devnull = open("/dev/null", O_RDONLY);
      if (devnull >= 0) dup2(devnull, 0);
      dup2(fds[1], 1);
      int e = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (e >= 0) dup2(e, 2);
      std::vector<std::string> argv = concat({meshtrain_bin()}, args);
      std::vector<char*> c;
      for (const std::string& a : argv) c.push_back(const_cast<char*>(a.c_str()));
      c.push_back(nullptr);
      execv(c[0], c.data());
      _exit(127);
    }
    close(fds[1]);
    out_ = fds[0];
  }
  ~PipedChild() {
    close_pipe();
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      wait_for(10);
    }
  }
  pid_t pid() const { return pid_; }
  // One read() of at most `max` bytes, waiting up to timeout_s; "" on timeout or end of file.
  std::string read_some(double timeout_s, size_t max = 65536) {
    pollfd p{out_, POLLIN, 0};
    if (poll(&p, 1, (int)(timeout_s * 1000)) <= 0) return "";
    std::string buf(max, '\0');
    ssize_t k = read(out_, buf.data(), max);
    buf.resize(k > 0 ? (size_t)k : 0);
    return buf;
  }
  // Reads until `lines` newlines arrived (or timeout); returns what was read.
  std::string read_lines_upto(int lines, double timeout_s) {
    std::string all;
    const auto until = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (Clock::now() < until && std::count(all.begin(), all.end(), '\n') < lines) all += read_some(0.2);
    return all;
  }
  void close_pipe() {
    if (out_ >= 0) close(out_);
    out_ = -1;
  }
  // The wait status, or -1 if the child is still running after timeout_s.
  int wait_for(double timeout_s) {
    const auto until = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (!reaped_) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        reaped_ = true;
        status_ = st;
        break;
      }
      if (Clock::now() > until) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return status_;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  bool reaped_ = false;
  int status_ = 0;
};

// "rank pid" lines of the launcher's MESHTRAIN_PIDS_FILE, waiting up to timeout_s for all n.
std::vector<pid_t> rank_pids(const std::string& path, int n, double timeout_s = 20) {
  const auto until = Clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    std::vector<pid_t> pids(n, -1);
    int seen = 0;
    for (const std::string& line : read_lines(path)) {
      int r = -1;
      long pid = -1;
      if (std::sscanf(line.c_str(), "%d %ld", &r, &pid) == 2 && r >= 0 && r < n) {
        pids[r] = (pid_t)pid;
        seen++;
      }
    }
    if (seen == n || Clock::now() > until) return pids;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

bool process_gone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

// Waits (up to timeout_s) until none of the pids exists; true when they are all gone.
bool all_gone(const std::vector<pid_t>& pids, double timeout_s = 10) {
  const auto until = Clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    bool gone = true;
    for (pid_t p : pids) gone = gone && (p <= 0 || process_gone(p));
    if (gone || Clock::now() > until) return gone;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string l; std::getline(ss, l);)
    if (!l.empty()) out.push_back(l);
  return out;
}

// The lines of stderr that start with "meshtrain:" (headlines and errors).
std::vector<std::string> meshtrain_lines(const std::string& err) {
  std::vector<std::string> out;
  for (const std::string& l : lines_of(err))
    if (l.rfind("meshtrain:", 0) == 0) out.push_back(l);
  return out;
}

void expect_refused(const RunResult& r, const std::vector<std::string>& names) {
  EXPECT_EQ(r.exit_code, 1) << r.describe();
  EXPECT_EQ(r.term_signal, 0) << r.describe();
  for (const std::string& n : names) EXPECT_TRUE(contains(r.err, n)) << "no '" << n << "' in\n" << r.describe();
}

double mem_available_bytes() {
  for (const std::string& l : read_lines("/proc/meminfo"))
    if (l.rfind("MemAvailable:", 0) == 0) return std::stod(l.substr(13)) * 1024;
  return 0;
}

class BoundsMessages : public ::testing::Test {
 protected:
  void SetUp() override {
    shard_ = dir_ / "d.bin";
    make_random_shard(shard_, 20000, 64, 1);
  }
  // T of the issue, at the tiny shape of these tests.
  std::vector<std::string> tiny(const std::vector<std::string>& extra) const {
    return concat(
        concat({"train", "--data", shard_, "--seq-len", "16", "--batch-size", "4", "--quiet"}, tiny_gpt_flags()),
        extra);
  }
  std::vector<std::string> mlp(const std::vector<std::string>& extra) {
    IdxImages im;
    im.count = 40;
    im.rows = im.cols = 4;
    im.pixels.assign(40 * 16, 9);
    write_idx_images(dir_ / "img", im);
    IdxLabels lb;
    lb.labels.assign(40, 1);
    write_idx_labels(dir_ / "lab", lb);
    return concat({"train", "--model", "mlp", "--data", dir_ / "img", "--labels", dir_ / "lab", "--hidden", "8",
                   "--batch-size", "4", "--steps", "2", "--quiet"},
                  extra);
  }
  TempDir dir_;
  std::string shard_;
};

// ---- 7. sample streams its tokens
TEST_F(BoundsMessages, P7_SampleStreamsTokensAsTheyAreGenerated) {
  const std::string init = dir_ / "init.safetensors";
  // Wide enough that a 4 KB buffer takes seconds to fill (about 1000 tokens/s): buffered output would come as
  // one read of a whole buffer, streamed output as reads of a few tokens.
  write_gpt_init(init, GptShape{2, 2, 64, 64, 128});
  PipedChild c({"sample", "--init", init, "--max-new-tokens", "100000000", "--temperature", "0"}, dir_ / "err.txt");
  std::string got;
  size_t largest = 0;
  const auto until = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < until && got.size() < 100) {
    const std::string part = c.read_some(1);
    largest = std::max(largest, part.size());
    got += part;
  }
  ASSERT_GE(got.size(), 100u) << "fewer than 100 bytes on stdout in 30 s\n" << slurp(dir_ / "err.txt");
  EXPECT_LT(largest, 4096u) << "a read brought a whole stdio buffer: the output is not flushed per token";
  EXPECT_EQ(c.wait_for(0), -1) << "still generating: 10^8 tokens take hours";
}

// ---- 8. bench comm: overflowing sizes refused at once; the memory a size needs checked first
TEST_F(BoundsMessages, P8_BenchCommRefusesOverflowingSizes) {
  for (const std::string v : {"99999999999999999999999", "17179869184G", "1e300K"}) {
    const auto t0 = Clock::now();
    RunResult r = run_meshtrain({"bench", "comm", "--no-mpi-peer", "--max-bytes", v}, 30);
    expect_refused(r, {"--max-bytes", v, "too large"});
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0) << v;
  }
  RunResult r = run_meshtrain({"bench", "comm", "--no-mpi-peer", "--min-bytes", "99999999999999999999999"}, 30);
  expect_refused(r, {"--min-bytes", "too large"});
}

TEST_F(BoundsMessages, P8_BenchCommChecksMemoryBeforeAllocating) {
  const double avail = mem_available_bytes();
  ASSERT_GT(avail, 0);
  // Two buffers of this size per rank on 2 ranks: four times what the machine has free.
  const std::string size = std::to_string((long long)(avail / 1024)) + "K";
  const auto t0 = Clock::now();
  RunResult r = run_meshtrain({"bench", "comm", "--no-mpi-peer", "--nproc", "2", "--max-bytes", size}, 60);
  expect_refused(r, {"--max-bytes", size, "needs about", "GiB available", "MemAvailable"});
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0) << "refused before allocating";
}

// ---- 9. threads and activation sizes bounded, naming the flag
TEST_F(BoundsMessages, P9_ThreadsAreBounded) {
  for (const std::string v : {"100000", "2147483647", "1025"}) {
    RunResult r = run_meshtrain(tiny({"--steps", "1", "--threads", v}), 60);
    expect_refused(r, {"--threads", v, "1024"});
  }
  const std::string init = dir_ / "init.safetensors";
  write_gpt_init(init, GptShape{});
  expect_refused(run_meshtrain({"sample", "--init", init, "--threads", "100000"}), {"--threads"});
  expect_refused(run_meshtrain({"bench", "train", "--no-torch", "--threads", "100000"}), {"--threads"});
  // Hogwild's --nproc is threads of one process: bounded as ranks are.
  expect_refused(run_meshtrain(mlp({"--async", "hogwild", "--optimizer", "sgd", "--nproc", "100000"})),
                 {"--nproc", "100000", "1..256"});
}

TEST_F(BoundsMessages, P9_BenchPipelineActivationSizeCheckedAgainstMemory) {
  RunResult r = run_meshtrain({"bench", "pipeline", "--activation-kb", "1e12"}, 30);
  expect_refused(r, {"--activation-kb", "needs about", "GiB available"});
  r = run_meshtrain({"bench", "pipeline", "--activation-kb", "1e300"}, 30);
  expect_refused(r, {"--activation-kb"});
  r = run_meshtrain({"bench", "pipeline", "--forward-ms", "1e30"}, 30);
  expect_refused(r, {"--forward-ms"});
}

// ---- 10. a closed output pipe and SIGHUP end the job like SIGTERM: a message, ranks gone, /dev/shm clean
TEST_F(BoundsMessages, P10_ClosedOutputPipeEndsTheJobWithAMessage) {
  const std::string err = dir_ / "err.txt", pids_file = dir_ / "pids.txt";
  PipedChild c(tiny({"--nproc", "4", "--steps", "100000", "--metrics", "/dev/stdout"}), err,
               {{"MESHTRAIN_PIDS_FILE", pids_file}});
  const std::vector<pid_t> pids = rank_pids(pids_file, 4);
  const std::string head = c.read_lines_upto(2, 60);  // `| head -2`
  ASSERT_GE(std::count(head.begin(), head.end(), '\n'), 2) << slurp(err);
  c.close_pipe();
  const int st = c.wait_for(30);
  ASSERT_NE(st, -1) << "still running 30 s after its stdout was closed";
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGPIPE)
      << "status " << st << (WIFSIGNALED(st) ? " killed by a signal" : "") << "\n"
      << slurp(err);
  const std::vector<std::string> heads = meshtrain_lines(slurp(err));
  ASSERT_EQ(heads.size(), 1u) << slurp(err);
  EXPECT_TRUE(contains(heads[0], "SIGPIPE") && contains(heads[0], "closed")) << heads[0];
  EXPECT_TRUE(all_gone(pids)) << "a rank outlived the job";
  EXPECT_EQ(comm::shm::count_segments(c.pid()), 0);
}

TEST_F(BoundsMessages, P10_SighupEndsTheJobLikeSigterm) {
  const std::string err = dir_ / "err.txt", pids_file = dir_ / "pids.txt", m = dir_ / "m.jsonl";
  PipedChild c(tiny({"--nproc", "4", "--steps", "100000", "--metrics", m}), err, {{"MESHTRAIN_PIDS_FILE", pids_file}});
  const std::vector<pid_t> pids = rank_pids(pids_file, 4);
  const auto until = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < until && read_lines(m).size() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_GE(read_lines(m).size(), 2u) << slurp(err);
  ASSERT_EQ(kill(c.pid(), SIGHUP), 0);
  const int st = c.wait_for(10);
  ASSERT_NE(st, -1) << "still running 10 s after SIGHUP";
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGHUP) << "status " << st << "\n" << slurp(err);
  EXPECT_TRUE(contains(slurp(err), "interrupted by SIGHUP")) << slurp(err);
  EXPECT_TRUE(all_gone(pids)) << "a rank outlived the job";
  EXPECT_EQ(comm::shm::count_segments(c.pid()), 0);
}

// ---- 11. the stalled rank is named under every layout
// SIGSTOPs world rank `stop` once the run has made progress and returns the job's stderr.
std::string stall_rank(const std::vector<std::string>& args, const std::string& dir, int nproc, int stop) {
  const std::string err = dir + "/err.txt", pids_file = dir + "/pids.txt", m = dir + "/m.jsonl";
  PipedChild c(concat(args, {"--metrics", m}), err, {{"MESHTRAIN_PIDS_FILE", pids_file}});
  const std::vector<pid_t> pids = rank_pids(pids_file, nproc);
  const auto until = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < until && read_lines(m).size() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GE(read_lines(m).size(), 3u) << slurp(err);
  EXPECT_GT(pids[stop], 0);
  if (pids[stop] > 0) kill(pids[stop], SIGSTOP);
  const int st = c.wait_for(40);
  if (pids[stop] > 0) kill(pids[stop], SIGCONT);  // if it is still there, let the supervisor's SIGKILL land
  EXPECT_NE(st, -1) << "the job did not end 40 s after rank " << stop << " stopped (--comm-timeout 3)";
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << "status " << st << "\n" << slurp(err);
  EXPECT_TRUE(all_gone(pids)) << "a rank outlived the job";
  return slurp(err);
}

void expect_blames(const std::string& err, int rank) {
  const std::vector<std::string> heads = meshtrain_lines(err);
  ASSERT_EQ(heads.size(), 1u) << err;
  EXPECT_TRUE(contains(heads[0], "meshtrain: rank " + std::to_string(rank) + " did not respond")) << heads[0];
}

TEST_F(BoundsMessages, P11_StoppedRankNamedUnderPipelineParallelism) {
  const std::string err = stall_rank(
      tiny({"--nproc", "4", "--pp", "2", "--micro-batch-size", "1", "--comm-timeout", "3", "--steps", "100000"}),
      dir_.path(), 4, 1);
  expect_blames(err, 1);
}

TEST_F(BoundsMessages, P11_StoppedWorkerNamedUnderParameterServer) {
  // 3 workers and a server; batch 6 splits over the workers.
  std::vector<std::string> args = tiny({"--nproc", "4", "--async", "ps", "--comm-timeout", "3", "--steps", "100000"});
  args[std::find(args.begin(), args.end(), "--batch-size") - args.begin() + 1] = "6";
  expect_blames(stall_rank(args, dir_.path(), 4, 1), 1);
}

// ---- 13. messages name what the user gave
TEST_F(BoundsMessages, P13_MessagesNameTheRightThing) {
  // A --n-embd too wide: the other dimensions are shown with their real (default) values, not 0.
  RunResult r = run_meshtrain(concat({"train", "--data", shard_, "--n-layer", "1", "--n-head", "2", "--n-embd", "65536",
                                      "--vocab-size", "256", "--seq-len", "16", "--batch-size", "4"},
                                     {}));
  expect_refused(r, {"--n-embd 65536", "--n-positions 256 (default)"});
  EXPECT_FALSE(contains(r.err, "--n-positions 0")) << r.err;

  r = run_meshtrain(tiny({"--nproc", "2", "--tp", "2", "--compress", "topk:0.1"}));
  expect_refused(r, {"--compress", "--tp 2"});
  EXPECT_FALSE(contains(r.err, "--nproc > 1")) << r.err;

  r = run_meshtrain({"bench", "pipeline", "--stages", "300"});
  expect_refused(r, {"--stages 300"});
  EXPECT_FALSE(contains(r.err, "--nproc")) << r.err;

  const std::string summary = dir_ / "s.json";
  write_bytes(summary, R"({"pipeline": {"schedule": "1f1b", "stages": -2, "micro_batches": 4, "virtual_stages": 1,
      "stage_forward_ms": [1, 1], "stage_backward_ms": [2, 2], "bubble_measured": 0.2}})");
  r = run_meshtrain({"simulate", "--from-summary", summary});
  expect_refused(r, {summary, "pipeline.stages", "-2"});
  EXPECT_FALSE(contains(r.err, "simulate needs")) << r.err;
}

TEST_F(BoundsMessages, P13_SafetensorsMetadataErrorsNameTheFileAndKey) {
  const std::string plain = dir_ / "plain.safetensors", bad = dir_ / "bad.safetensors";
  write_gpt_init(plain, GptShape{});
  SafetensorsReader in(plain);
  SafetensorsWriter w;
  for (const auto& [k, v] : in.metadata()) w.set_metadata(k, v);
  w.set_metadata("moe_every", "1");
  w.set_metadata("moe_top_k", "3");
  std::map<std::string, std::vector<float>> data = read_all_f32(plain);
  for (const TensorInfo& t : in.tensors()) w.add_f32(t.name, t.shape, data[t.name].data());
  w.write(bad);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"sample", "--init", bad},
        std::vector<std::string>{"train", "--init", bad, "--data", shard_, "--seq-len", "16", "--batch-size", "4"}}) {
    RunResult r = run_meshtrain(args);
    expect_refused(r, {bad, "metadata moe_top_k", "3"});
    EXPECT_FALSE(contains(r.err, "--moe-top-k")) << r.err;
  }
}

// ---- 14. one coherent message per failed job, with the first failing rank's reason
TEST_F(BoundsMessages, P14_DivergedMultiRankJobGivesOneMessage) {
  RunResult r = run_meshtrain(
      tiny({"--nproc", "2", "--steps", "6", "--lr", "1e30", "--checkpoint-dir", dir_ / "ck", "--save-every", "1"}),
      120);
  EXPECT_EQ(r.exit_code, 1) << r.describe();
  const std::vector<std::string> heads = meshtrain_lines(r.err);
  ASSERT_EQ(heads.size(), 1u) << r.err;
  EXPECT_TRUE(contains(heads[0], "loss is") && contains(heads[0], "No good checkpoint exists")) << heads[0];
  for (const std::string& l : lines_of(r.err)) EXPECT_FALSE(std::regex_search(l, std::regex("^rank \\d+: "))) << l;
}

TEST_F(BoundsMessages, P14_SignalHandlerFailureReachesTheHeadline) {
  // The data shard shrinks under a 2-rank job: each rank's SIGBUS handler used to write its own line in pieces.
  const std::string big = dir_ / "big.bin", err = dir_ / "err.txt", m = dir_ / "m.jsonl";
  make_random_shard(big, 400000, 64, 3);
  PipedChild c(concat(concat({"train", "--data", big, "--seq-len", "16", "--batch-size", "4", "--steps", "1000000",
                              "--quiet", "--nproc", "2", "--metrics", m},
                             tiny_gpt_flags()),
                      {}),
               err);
  const auto until = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < until && read_lines(m).size() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_GE(read_lines(m).size(), 3u) << slurp(err);
  ASSERT_EQ(truncate(big.c_str(), 1024), 0);
  const int st = c.wait_for(30);
  ASSERT_NE(st, -1) << "still running 30 s after the shard shrank";
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << "status " << st << "\n" << slurp(err);
  const std::vector<std::string> heads = meshtrain_lines(slurp(err));
  ASSERT_EQ(heads.size(), 1u) << slurp(err);
  EXPECT_TRUE(contains(heads[0], "failed: " + big + " shrank")) << heads[0];
  EXPECT_FALSE(contains(heads[0], "exited with code")) << heads[0];
}

// ---- 15. range checks that agree
TEST_F(BoundsMessages, P15_RangeChecksAgree) {
  for (const std::string v : {"-1", "-0.5"}) expect_refused(run_meshtrain(tiny({"--min-lr", v})), {"--min-lr"});
  for (const std::string v : {"-1", "0"}) expect_refused(run_meshtrain(tiny({"--servers", v})), {"--servers"});
  expect_refused(run_meshtrain(tiny({"--dp", "0"})), {"--dp"});
  expect_refused(run_meshtrain({"bench", "comm", "--no-mpi-peer", "--nproc", "0"}), {"--nproc 0", "1..256"});
  RunResult r = run_meshtrain({"bench", "comm", "--no-mpi-peer", "--min-bytes", "1", "--max-bytes", "1"});
  expect_refused(r, {"--min-bytes 1"});
  EXPECT_FALSE(contains(r.out, "nan")) << r.out;
}

// ---- 16. flags that do nothing are refused; help, rate and prepare
TEST_F(BoundsMessages, P16_FlagsForTheOtherModelAreRefused) {
  expect_refused(run_meshtrain(tiny({"--steps", "1", "--labels", shard_})), {"--labels", "--model gpt"});
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--recompute"}, std::vector<std::string>{"--seq-len", "8"},
        std::vector<std::string>{"--n-layer", "3"}})
    expect_refused(run_meshtrain(mlp(extra)), {extra[0], "--model mlp"});
  expect_refused(run_meshtrain(tiny({"--steps", "1", "--compress", ""})), {"--compress", "empty"});
  // The control: the same MLP command without them runs.
  RunResult ok = run_meshtrain(mlp({}), 60);
  EXPECT_EQ(ok.exit_code, 0) << ok.describe();
}

TEST_F(BoundsMessages, P16_HelpAndRate) {
  RunResult h = run_meshtrain({"train", "--help"});
  EXPECT_EQ(h.exit_code, 0);
  EXPECT_TRUE(contains(h.out, "the larger of 256 and --seq-len")) << h.out;
  RunResult r = run_meshtrain({"train", "--data", shard_, "--seq-len", "16", "--batch-size", "4", "--steps", "1",
                               "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--vocab-size", "64"},
                              60);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.err, "done: 1 steps")) << r.err;
  EXPECT_FALSE(contains(r.err, " 0 tokens/s")) << r.err;
}

TEST_F(BoundsMessages, P16_PrepareRefusesAnOversizedTextAtOnce) {
  const std::string text = dir_ / "big.txt";
  { std::ofstream f(text); }
  ASSERT_EQ(truncate(text.c_str(), (off_t)1 << 31), 0);  // sparse: no disk space taken
  const auto t0 = Clock::now();
  RunResult r = run_meshtrain({"prepare", "--text", text, "--out", dir_ / "o.bin"}, 30);
  expect_refused(r, {"--text", text, "2147483648 bytes"});
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 3.0) << "refused from its size, unread";
  EXPECT_FALSE(fs::exists(dir_ / "o.bin"));
}

}  // namespace
}  // namespace mt::clitest
