// Issue 13, "nothing a user passes may destroy data or hang": one test (or a few) per numbered point of the
// issue, each reproducing the reported misuse through the real CLI and asserting the wanted behaviour.
// Devices and FIFOs are made with mknod/mkfifo inside the test's temporary directory (the tests run as root;
// a test that cannot make a device node says so and skips), never the system's /dev/null.
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <regex>
#include <set>

#include "tests/cli/cli_test_util.h"
#include "trace/chrome_trace.h"

namespace mt::clitest {
namespace {

// Tiny GPT on `data` (a shard of 64-token vocabulary) plus `extra`.
std::vector<std::string> tiny(const std::string& data, const std::vector<std::string>& extra) {
  return concat(concat({"train", "--data", data, "--seq-len", "16", "--batch-size", "4", "--quiet"}, tiny_gpt_flags()),
                extra);
}

void expect_error_naming(const RunResult& r, const std::vector<std::string>& words) {
  EXPECT_FALSE(r.timed_out) << r.describe();
  EXPECT_EQ(r.term_signal, 0) << r.describe();
  EXPECT_EQ(r.exit_code, 1) << r.describe();
  for (const std::string& w : words) EXPECT_TRUE(contains(r.err, w)) << "stderr lacks \"" << w << "\"\n" << r.describe();
}

std::string kind(const std::string& p) {
  struct stat st;
  if (lstat(p.c_str(), &st) != 0) return "missing";
  if (S_ISLNK(st.st_mode)) return "symlink";
  if (S_ISCHR(st.st_mode)) return "chr";
  if (S_ISFIFO(st.st_mode)) return "fifo";
  if (S_ISDIR(st.st_mode)) return "dir";
  if (S_ISREG(st.st_mode)) return "file";
  return "other";
}

// A character device equal to /dev/null (1,3) or /dev/zero (1,5), made in `dir`.
bool make_chr(const std::string& path, int minor) { return mknod(path.c_str(), S_IFCHR | 0666, makedev(1, minor)) == 0; }

class Hardening : public ::testing::Test {
 protected:
  void SetUp() override {
    shard_ = dir_ / "data.bin";
    make_random_shard(shard_, 5000, 64, 1);
  }
  TempDir dir_;
  std::string shard_;
};

// ---- 1. outputs: devices written in place, symlinks followed, directories refused
TEST_F(Hardening, P1_DeviceOutputStaysADevice) {
  const std::string null = dir_ / "null", text = dir_ / "t.txt";
  if (!make_chr(null, 3)) GTEST_SKIP() << "mknod needs root";
  write_bytes(text, "hello, world\n");
  RunResult r = run_meshtrain({"prepare", "--text", text, "--out", null});
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(kind(null), "chr") << "the device node was replaced";
  EXPECT_FALSE(fs::exists(dir_ / "null.tmp." + std::to_string(getpid())));
  // Every train output at once into the device.
  r = run_meshtrain(tiny(shard_, {"--steps", "2", "--metrics", null, "--summary", null, "--save", null,
                                  "--trace", null}));
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(kind(null), "chr");
  // The ranks' trace parts of a device target live in the temp directory, not beside the node (in /dev).
  EXPECT_EQ(fs::path(trace::trace_part_path(null, 1)).parent_path(), fs::temp_directory_path());
  EXPECT_EQ(trace::trace_part_path(dir_ / "t.json", 1), dir_ / "t.json.rank1");
  r = run_meshtrain(tiny(shard_, {"--steps", "2", "--nproc", "2", "--trace", null}), 60);
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_FALSE(fs::exists(trace::trace_part_path(null, 0))) << "rank parts are removed after the merge";
  for (auto& e : fs::directory_iterator(dir_.path()))  // no temporaries or rank parts left beside it
    EXPECT_TRUE(e.path().filename() == "null" || e.path().filename() == "t.txt" || e.path().filename() == "data.bin")
        << e.path();
}

TEST_F(Hardening, P1_StdoutAndFifoOutputsAreWrittenInPlace) {
  const std::string text = dir_ / "t.txt", fifo = dir_ / "fifo";
  write_bytes(text, "abcdefgh");
  RunResult r = run_meshtrain({"prepare", "--text", text, "--out", "/dev/stdout"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  ASSERT_EQ(r.out.size(), 1024u + 2 * 8) << "the shard goes to stdout (here a pipe)";
  int32_t magic;
  std::memcpy(&magic, r.out.data(), 4);
  EXPECT_EQ(magic, 20240520);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  // No reader: an error at once, not a wait.
  r = run_meshtrain({"prepare", "--text", text, "--out", fifo}, 10);
  expect_error_naming(r, {fifo, "FIFO"});
  EXPECT_EQ(kind(fifo), "fifo");
  // With a reader (this test holds it open read-write, so it never sees EOF): the bytes arrive through it.
  int fd = open(fifo.c_str(), O_RDWR | O_NONBLOCK);
  ASSERT_GE(fd, 0);
  r = run_meshtrain({"prepare", "--text", text, "--out", fifo}, 10);
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  char buf[4096];
  ssize_t n = read(fd, buf, sizeof buf);
  close(fd);
  EXPECT_EQ(n, 1024 + 2 * 8);
  EXPECT_EQ(kind(fifo), "fifo");
}

TEST_F(Hardening, P1_SymlinkTargetReplacedLinkKept) {
  const std::string target = dir_ / "weights.safetensors", link = dir_ / "link.safetensors";
  write_bytes(target, "old");
  fs::create_symlink("weights.safetensors", link);  // relative, as `ln -s` makes them
  RunResult r = run_meshtrain(tiny(shard_, {"--steps", "2", "--save", link}));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(kind(link), "symlink");
  EXPECT_EQ(fs::read_symlink(link).string(), "weights.safetensors");
  EXPECT_EQ(kind(target), "file");
  EXPECT_EQ(read_all_f32(target).count("wte.weight"), 1u) << "the target holds the saved weights";
  // A dangling link: the file it names is created.
  const std::string dangling = dir_ / "dangling", named = dir_ / "made.safetensors";
  fs::create_symlink(named, dangling);
  r = run_meshtrain(tiny(shard_, {"--steps", "1", "--save", dangling}));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(kind(dangling), "symlink");
  EXPECT_EQ(kind(named), "file");
}

TEST_F(Hardening, P1_DirectoryOutputIsAClearError) {
  const std::string d = dir_ / "adir", text = dir_ / "t.txt";
  fs::create_directory(d);
  write_bytes(text, "abcdefgh");
  RunResult r = run_meshtrain({"prepare", "--text", text, "--out", d});
  expect_error_naming(r, {"--out", d, "is a directory"});
  for (const char* flag : {"--save", "--metrics", "--summary", "--trace"}) {
    r = run_meshtrain(tiny(shard_, {"--steps", "1", flag, d}));
    expect_error_naming(r, {flag, d, "is a directory"});
  }
  EXPECT_EQ(kind(d), "dir");
}

// ---- 2. checkpoint pruning by step; foreign checkpoints; leftovers of killed saves
TEST_F(Hardening, P2_FreshRunIntoAnotherRunsCheckpointsIsRefused) {
  const std::string ck = dir_ / "ck";
  RunResult r = run_meshtrain(tiny(shard_, {"--steps", "8", "--save-every", "4", "--checkpoint-dir", ck}));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  r = run_meshtrain(tiny(shard_, {"--steps", "2", "--save-every", "1", "--checkpoint-dir", ck}));
  expect_error_naming(r, {ck, "step_00000004", "step_00000008", "--overwrite-checkpoints", "--resume"});
  EXPECT_EQ(trim(slurp(ck + "/latest")), "step_00000008");
  EXPECT_TRUE(is_complete_checkpoint(ck + "/step_00000008"));
  // Asked for: the old ones go, the new run's stay and latest names a complete one.
  r = run_meshtrain(tiny(shard_, {"--steps", "2", "--save-every", "1", "--checkpoint-dir", ck,
                                  "--overwrite-checkpoints"}));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(trim(slurp(ck + "/latest")), "step_00000002");
  EXPECT_TRUE(is_complete_checkpoint(ck + "/step_00000002"));
  EXPECT_TRUE(is_complete_checkpoint(ck + "/step_00000001"));
  EXPECT_FALSE(fs::exists(ck + "/step_00000004"));
  EXPECT_FALSE(fs::exists(ck + "/step_00000008"));
}

TEST_F(Hardening, P2_PruningByStepNeverDeletesLatestOrNewer) {
  const std::string ck = dir_ / "ck";
  RunResult r = run_meshtrain(
      tiny(shard_, {"--steps", "20", "--save-every", "10", "--keep-checkpoints", "0", "--checkpoint-dir", ck}));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  write_bytes(ck + "/latest", "step_00000010\n");  // e.g. pointed back at the last good one after divergence
  // Leftovers of killed processes: a save's temp directory, latest's temp file, and a half-pruned step.
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, nullptr, 0);
  const std::string tmp_dir = ck + "/step_00000011.tmp." + std::to_string(dead);
  const std::string tmp_latest = ck + "/latest.tmp." + std::to_string(dead);
  fs::create_directory(tmp_dir);
  write_bytes(tmp_dir + "/model.safetensors", "partial");
  write_bytes(tmp_latest, "step_00000011\n");
  fs::create_directory(ck + "/step_00000003");
  write_bytes(ck + "/step_00000003/state.json", "{\"step\": 3}");
  // --keep-checkpoints 1 with names sorted as text used to delete the one just written (step_00000012 sorts
  // before step_00000020) and leave latest naming nothing.
  r = run_meshtrain(tiny(shard_, {"--steps", "12", "--save-every", "1", "--keep-checkpoints", "1", "--resume", ck,
                                  "--checkpoint-dir", ck}));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(trim(slurp(ck + "/latest")), "step_00000012");
  EXPECT_TRUE(is_complete_checkpoint(ck + "/step_00000012"));
  EXPECT_TRUE(is_complete_checkpoint(ck + "/step_00000020")) << "newer than latest: kept";
  EXPECT_FALSE(fs::exists(ck + "/step_00000011")) << "older than latest, beyond --keep-checkpoints 1";
  EXPECT_FALSE(fs::exists(ck + "/step_00000010"));
  EXPECT_FALSE(fs::exists(tmp_dir));
  EXPECT_FALSE(fs::exists(tmp_latest));
  EXPECT_FALSE(fs::exists(ck + "/step_00000003")) << "a half-pruned step is removed at start";
}

// ---- 3. --comm-timeout up to infinity
TEST_F(Hardening, P3_HugeAndInfiniteCommTimeoutsWait) {
  for (const char* t : {"inf", "1e10", "1e300"}) {
    RunResult r = run_meshtrain(tiny(shard_, {"--steps", "2", "--nproc", "2", "--comm-timeout", t}), 60);
    EXPECT_EQ(r.exit_code, 0) << "--comm-timeout " << t << "\n" << r.describe();
  }
  RunResult h = run_meshtrain({"train", "--help"});
  EXPECT_TRUE(std::regex_search(h.out, std::regex("--comm-timeout[^\\n]*\\n?[^\\n]*inf: wait forever"))) << h.out;
}

// ---- 4. a FIFO as any input: an error at once
TEST_F(Hardening, P4_FifoInputsFailAtOnce) {
  const std::string fifo = dir_ / "fifo", init = dir_ / "init.safetensors";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  write_gpt_init(init, GptShape{});
  const std::vector<std::vector<std::string>> cases = {
      tiny(fifo, {"--steps", "1"}),
      tiny(shard_, {"--steps", "1", "--val-data", fifo, "--eval-every", "1"}),
      concat({"train", "--data", shard_, "--seq-len", "16", "--batch-size", "4", "--steps", "1", "--init", fifo,
              "--n-head", "2"}, {}),
      {"train", "--model", "mlp", "--data", fifo, "--labels", fifo, "--steps", "1"},
      {"sample", "--init", fifo},
      {"prepare", "--text", fifo, "--out", dir_ / "o.bin"},
  };
  for (const auto& args : cases) {
    auto t0 = std::chrono::steady_clock::now();
    RunResult r = run_meshtrain(args, 10);
    expect_error_naming(r, {fifo, "FIFO"});
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  }
}

// ---- 5. an output equal to an input is refused; a shard that shrinks under a run is a clear error
TEST_F(Hardening, P5_OutputEqualToInputIsRefusedBeforeWriting) {
  const std::string before = slurp(shard_), init = dir_ / "init.safetensors", alias = dir_ / "alias.bin";
  write_gpt_init(init, GptShape{});
  fs::create_symlink(shard_, alias);
  for (const auto& [flag, path] : std::vector<std::pair<std::string, std::string>>{
           {"--metrics", shard_}, {"--summary", shard_}, {"--trace", alias}, {"--save", shard_}}) {
    RunResult r = run_meshtrain(tiny(shard_, {"--steps", "2", flag, path}));
    expect_error_naming(r, {flag, "--data", "same file"});
    EXPECT_EQ(slurp(shard_), before) << flag << " destroyed the data file";
  }
  const std::string init_before = slurp(init);
  RunResult r = run_meshtrain({"train", "--data", shard_, "--seq-len", "16", "--batch-size", "4", "--steps", "1",
                               "--quiet", "--init", init, "--save", init});
  expect_error_naming(r, {"--save", "--init", "same file"});
  EXPECT_EQ(slurp(init), init_before);
  r = run_meshtrain({"prepare", "--text", shard_, "--out", alias});
  expect_error_naming(r, {"--out", "--text", "same file"});
  EXPECT_EQ(slurp(shard_), before);
}

TEST_F(Hardening, P5_ShardTruncatedDuringTheRunIsNamedNotSigbus) {
  const std::string big = dir_ / "big.bin", err = dir_ / "err.txt";
  make_random_shard(big, 200000, 64, 3);
  BackgroundProcess p(concat({meshtrain_bin()},
                             concat(concat({"train", "--data", big, "--seq-len", "16", "--batch-size", "4", "--steps",
                                            "1000000", "--log-every", "1"},
                                           tiny_gpt_flags()),
                                    {})),
                      dir_ / "out.txt", err);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline && !contains(slurp(err), "step 3/") && !p.exited())
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(contains(slurp(err), "step 3/")) << slurp(err);
  ASSERT_EQ(truncate(big.c_str(), 1024), 0);  // another job rewrites the file: only the header is left
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline && !p.exited())
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(p.exited()) << "still running 30 s after the shard shrank";
  int st = p.wait();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << "status " << st << " (signal " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0)
                                                      << ")\n" << slurp(err);
  EXPECT_TRUE(contains(slurp(err), big) && contains(slurp(err), "shrank")) << slurp(err);
}

// ---- 6. bench train: --steps 0 and a failing bench leave nothing behind
std::set<std::string> dead_bench_dirs() {
  std::set<std::string> s;
  for (auto& e : fs::directory_iterator(fs::temp_directory_path())) {
    const std::string n = e.path().filename().string();
    if (n.rfind("meshtrain_bench_", 0) != 0) continue;
    const pid_t pid = (pid_t)std::atol(n.c_str() + 16);
    if (pid > 0 && kill(pid, 0) != 0) s.insert(n);  // its process is gone: a leftover
  }
  return s;
}

TEST(HardeningBench, P6_StepsZeroAndFailuresLeaveNoTempDir) {
  const auto before = dead_bench_dirs();
  RunResult r = run_meshtrain({"bench", "train", "--no-torch", "--steps", "0"});
  expect_error_naming(r, {"--steps"});
  // A bench that fails inside training (n_embd not divisible by n_head) after writing its data.
  r = run_meshtrain({"bench", "train", "--no-torch", "--steps", "1", "--warmup", "0", "--n-layer", "1", "--n-head", "4",
                     "--n-embd", "30", "--vocab-size", "64", "--seq-len", "8", "--batch-size", "2"});
  EXPECT_EQ(r.exit_code, 1) << r.describe();
  EXPECT_EQ(r.term_signal, 0) << r.describe();
  EXPECT_EQ(dead_bench_dirs(), before) << "a /tmp/meshtrain_bench_PID directory was left behind";
}

// ---- 7. untrusted sizes
TEST_F(Hardening, P7_InitMetadataIsCheckedBeforeAllocating) {
  const std::string p = dir_ / "liar.safetensors";
  // Metadata for a 100 x 8192 model (tens of GB) and no model tensor at all (the issue's 122-byte file).
  write_raw_safetensors(p,
                        R"({"__metadata__":{"n_layer":"100","n_head":"64","n_embd":"8192","vocab_size":"50257",)"
                        R"("n_positions":"1024"}})",
                        0);
  auto t0 = std::chrono::steady_clock::now();
  RunResult r = run_meshtrain({"sample", "--init", p, "--max-new-tokens", "1"}, 30);
  expect_error_naming(r, {p, "wte.weight"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0)
      << "took too long: allocated before checking?";
}

TEST_F(Hardening, P7_EndlessDeviceAsIdxDataIsRefused) {
  const std::string zero = dir_ / "zero";
  if (!make_chr(zero, 5)) GTEST_SKIP() << "mknod needs root";
  RunResult r = run_meshtrain({"train", "--model", "mlp", "--data", zero, "--labels", zero, "--steps", "1"}, 20);
  expect_error_naming(r, {zero, "character device"});
}

TEST_F(Hardening, P7_UnallocatableShapeSaysHowManyBytes) {
  // (64 + 32) x 16000 + 24 x (12 x 16000^2 + 13 x 16000) = 73734528000 parameters, x 4 bytes: refused before
  // any allocation, against this host's memory and swap (a few GB here), with the bytes it needs.
  RunResult r = run_meshtrain({"train", "--data", shard_, "--seq-len", "16", "--batch-size", "4", "--steps", "1",
                               "--quiet", "--n-layer", "24", "--n-head", "2", "--n-embd", "16000", "--vocab-size",
                               "64", "--n-positions", "32"},
                              60);
  expect_error_naming(r, {"--n-embd 16000", "needs 2.94938e+11 bytes for its weights alone"});
  EXPECT_FALSE(contains(r.err, "unexpected error")) << r.describe();
  // Shapes whose byte count would not even fit in 64 bits: no wrapped size, no bare bad_alloc.
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{{"--n-embd", "2000000000"},
                                                                                   {"--n-layer", "2000000000"}}) {
    std::vector<std::string> a = {"train", "--data", shard_, "--seq-len", "16", "--batch-size", "4", "--steps", "1",
                                  "--quiet", "--n-head", "2"};
    a = concat(a, {flag, value});
    RunResult big = run_meshtrain(a, 60);
    expect_error_naming(big, {"bytes", flag + " " + value, flag == "--n-embd" ? "2^31 elements" : "weights alone"});
  }
}

// ---- 8. output locations checked at start; a stop without a checkpoint refused
TEST_F(Hardening, P8_BadOutputLocationsFailBeforeTraining) {
  const std::string metrics = dir_ / "m.jsonl";
  for (const char* flag : {"--save", "--summary"}) {
    auto t0 = std::chrono::steady_clock::now();
    RunResult r = run_meshtrain(tiny(shard_, {"--steps", "1000000", "--metrics", metrics, flag,
                                              dir_ / "no/such/dir/out.json"}),
                                30);
    expect_error_naming(r, {flag, "no/such/dir", "does not exist"});
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
    EXPECT_TRUE(read_lines(metrics).empty()) << "steps ran before the check";
  }
  write_bytes(dir_ / "plainfile", "x");
  RunResult r = run_meshtrain(tiny(shard_, {"--steps", "1", "--checkpoint-dir", dir_ / "plainfile"}));
  expect_error_naming(r, {"--checkpoint-dir", "not a directory"});
}

TEST_F(Hardening, P8_StopNeedsACheckpointAndCheckpointDirAloneSavesAtTheEnd) {
  RunResult r = run_meshtrain(tiny(shard_, {"--steps", "4", "--stop-at-step", "2"}));
  expect_error_naming(r, {"--stop-at-step", "--checkpoint-dir"});
  const std::string ck = dir_ / "ck";
  r = run_meshtrain(tiny(shard_, {"--steps", "3", "--checkpoint-dir", ck}));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(trim(slurp(ck + "/latest")), "step_00000003");
  EXPECT_TRUE(is_complete_checkpoint(ck + "/step_00000003"));
}

// ---- 9. metrics after a crash and resume read as one run
TEST_F(Hardening, P9_ResumeDropsMetricsRowsFromTheResumedStepOn) {
  const std::string ck = dir_ / "ck", m = dir_ / "m.jsonl";
  RunResult r = run_meshtrain(
      tiny(shard_, {"--steps", "14", "--save-every", "10", "--checkpoint-dir", ck, "--metrics", m}));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  // The crash: the checkpoint at 14 never happened and the last row was torn.
  fs::remove_all(ck + "/step_00000014");
  write_bytes(ck + "/latest", "step_00000010\n");
  { std::ofstream(m, std::ios::app) << "{\"step\":14,\"lo"; }
  r = run_meshtrain(tiny(shard_, {"--steps", "20", "--save-every", "10", "--resume", ck, "--checkpoint-dir", ck,
                                  "--metrics", m}));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  std::vector<std::string> rows = read_lines(m);
  ASSERT_EQ(rows.size(), 20u) << slurp(m);
  for (size_t i = 0; i < rows.size(); i++) EXPECT_EQ(nlohmann::json::parse(rows[i])["step"].get<int64_t>(), (int64_t)i);
}

// ---- 10. a finite blow-up is stopped, naming the step and the last good checkpoint
TEST_F(Hardening, P10_AdamWAtLr1e3IsStoppedByTheGuard) {
  const std::string ck = dir_ / "ck", m = dir_ / "m.jsonl";
  const std::vector<std::string> base = {"--steps", "60", "--lr", "1e3", "--grad-clip", "0"};
  RunResult off = run_meshtrain(tiny(shard_, concat(base, {"--divergence-factor", "0", "--metrics", m})), 60);
  ASSERT_EQ(off.exit_code, 0) << "premise: without the guard the run ends 'successfully'\n" << off.describe();
  const double final_loss = nlohmann::json::parse(read_lines(m).back())["loss"].get<double>();
  ASSERT_GT(final_loss, 100.0) << "premise: the loss blew up (random guessing is ln 64 = 4.2)";

  // The same run with the guard (default factor 10, window 5): stopped at step 6, the blow-up began at step 2.
  RunResult r = run_meshtrain(tiny(shard_, concat(base, {"--metrics", m})), 60);
  expect_error_naming(r, {"loss is", "at step 6", "since step 2", "running median", "No checkpoint was written"});
  EXPECT_EQ(read_lines(m).size(), 5u);
}

TEST_F(Hardening, P10_SlowBlowUpNamesTheLastGoodCheckpoint) {
  // AdamW whose lr climbs slowly (warm-up towards 1e3): the loss grows over tens of steps, so checkpoints
  // from before the blow-up exist.
  const std::string ck = dir_ / "ck", m = dir_ / "m.jsonl";
  RunResult r = run_meshtrain(tiny(shard_, {"--steps", "60", "--lr", "1e3", "--warmup-steps", "10000", "--grad-clip",
                                            "0", "--save-every", "1", "--keep-checkpoints", "0", "--checkpoint-dir",
                                            ck, "--metrics", m}),
                              60);
  expect_error_naming(r, {"running median", "--divergence-factor"});
  std::smatch sm;
  ASSERT_TRUE(std::regex_search(r.err, sm, std::regex(R"(loss is \S+ at step (\d+), .*since step (\d+))"))) << r.describe();
  const int64_t step = std::stoll(sm[1].str()), since = std::stoll(sm[2].str());
  // Numbered as the progress line: step N is the N-th step, so N-1 rows were written before it.
  EXPECT_EQ((int64_t)read_lines(m).size(), step - 1) << r.describe();
  EXPECT_EQ(step - since + 1, 5) << "the default window is 5 steps";
  ASSERT_TRUE(std::regex_search(r.err, sm, std::regex(R"(last good checkpoint is (\S+?)[ ,.;]*(\(|$))"))) << r.describe();
  const fs::path good(sm[1].str());
  ASSERT_TRUE(is_complete_checkpoint(good));
  EXPECT_EQ(trim(slurp(ck + "/latest")), good.filename().string());
  const int64_t good_step = nlohmann::json::parse(slurp((good / "state.json").string()))["step"].get<int64_t>();
  // step_k holds the weights that compute step k+1: good ones come before the first high step.
  EXPECT_LT(good_step + 1, since) << r.describe();
  EXPECT_EQ(good_step + 1, since - 1) << "the newest checkpoint before the blow-up";
}

TEST_F(Hardening, P10_ParameterServerRunIsGuardedToo) {
  RunResult r = run_meshtrain(tiny(shard_, {"--steps", "30", "--lr", "1e3", "--grad-clip", "0", "--nproc", "2",
                                            "--async", "ps"}),
                              120);
  EXPECT_EQ(r.exit_code, 1) << r.describe();
  EXPECT_TRUE(contains(r.err, "running median") && contains(r.err, "at step 6")) << r.describe();
}

// ---- 11. the timeout headline names the rank waited for
// The job's first "meshtrain: rank N ..." line: rank 1 (the straggler) first, rank 0 as the one that waited.
std::string expect_stalled_rank_1_headline(const RunResult& r) {
  std::smatch m;
  if (!std::regex_search(r.err, m, std::regex(R"(meshtrain: (rank \d+)[^\n]*)"))) {
    ADD_FAILURE() << "no headline: " << r.describe();
    return "";
  }
  const std::string headline = m[0].str();
  EXPECT_EQ(m[1].str(), "rank 1") << headline;
  EXPECT_TRUE(contains(headline, "rank 0 timed out waiting for it")) << headline;
  EXPECT_TRUE(contains(headline, "--comm-timeout")) << headline;
  return headline;
}

TEST_F(Hardening, P11_TimeoutHeadlineNamesTheStalledRank) {
  RunResult r = run_meshtrain(
      tiny(shard_, {"--steps", "3", "--nproc", "2", "--straggler", "1:3000", "--comm-timeout", "1"}), 60);
  EXPECT_EQ(r.exit_code, 1) << r.describe();
  const std::string headline = expect_stalled_rank_1_headline(r);
  EXPECT_TRUE(contains(headline, "all_reduce") || contains(headline, "all_gather")) << headline;
}

#ifdef MESHTRAIN_MPIEXEC
// The same headline under mpirun: the MPI backend exchanges collective descriptors point to point, so the rank
// whose descriptor never came is known and named first.
TEST_F(Hardening, P11_TimeoutHeadlineUnderMpirunNamesTheStalledRank) {
  RunResult r = run_command(
      concat({MESHTRAIN_MPIEXEC, "--oversubscribe", "--bind-to", "none", "-np", "2", meshtrain_bin()},
             tiny(shard_, {"--steps", "3", "--backend", "mpi", "--straggler", "1:3000", "--comm-timeout", "1"})),
      90);
  EXPECT_NE(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(expect_stalled_rank_1_headline(r), "world rank 1")) << r.describe();
}
#endif

// ---- 12. the smaller defects
TEST_F(Hardening, P12_SampleFlagsAndNanWeights) {
  const std::string init = dir_ / "init.safetensors";
  write_gpt_init(init, GptShape{});
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--temperature", "-1"}, "--temperature"}, {{"--temperature", "nan"}, "--temperature"},
      {{"--top-k", "-1"}, "--top-k"},             {{"--max-new-tokens", "-1"}, "--max-new-tokens"}};
  for (const auto& [flags, name] : bad) {
    RunResult r = run_meshtrain(concat({"sample", "--init", init}, flags));
    expect_error_naming(r, {name});
  }
  // NaN weights: an error naming the tensor, not NUL bytes and exit 0.
  GptShape s;
  mt::SafetensorsWriter w;
  std::vector<std::vector<float>> store;
  for (auto& [name, shape] : gpt_tensor_shapes(s)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    store.emplace_back((size_t)n, name == "h.1.mlp.c_fc.weight" ? NAN : 0.01f);
    w.add_f32(name, shape, store.back().data());
  }
  w.set_metadata("n_head", "2");
  const std::string nanfile = dir_ / "nan.safetensors";
  w.write(nanfile);
  RunResult r = run_meshtrain({"sample", "--init", nanfile, "--max-new-tokens", "5"});
  expect_error_naming(r, {nanfile, "h.1.mlp.c_fc.weight", "non-finite"});
  EXPECT_EQ(r.out.find('\0'), std::string::npos);
}

TEST_F(Hardening, P12_TrainFlagValues) {
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> bad = {
      {{"--grad-clip", "nan"}, {"--grad-clip"}},
      {{"--weight-decay", "-1"}, {"--weight-decay"}},
      {{"--momentum", "5", "--optimizer", "sgd"}, {"--momentum"}},
      {{"--min-lr", "1", "--lr", "0.1"}, {"--min-lr", "--lr"}},
      {{"--lr", "inf"}, {"--lr"}},
      {{"--backend", "tcp"}, {"--backend", "tcp"}},
      {{"--save-every", "-1", "--checkpoint-dir", dir_ / "ck"}, {"--save-every must be >= 0"}},
  };
  for (const auto& [flags, words] : bad) expect_error_naming(run_meshtrain(tiny(shard_, concat({"--steps", "1"}, flags))), words);
  for (const char* f : {"--n-layer", "--n-head", "--n-embd"}) {
    std::vector<std::string> a = {"train", "--data", shard_, "--seq-len", "16", "--batch-size", "4", "--steps", "1"};
    for (auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
             {"--n-layer", "2"}, {"--n-head", "2"}, {"--n-embd", "32"}, {"--vocab-size", "64"}, {"--n-positions", "32"}})
      a = concat(a, {k, k == f ? "0" : v});
    expect_error_naming(run_meshtrain(a), {f});  // explicit 0 no longer silently means the default
  }
}

TEST_F(Hardening, P12_ParseErrorsExitOne) {
  for (const auto& args : std::vector<std::vector<std::string>>{{"train", "--no-such-flag"},
                                                                {"train", "--data", shard_, "--steps", "abc"},
                                                                {"sample"},
                                                                {"frobnicate"}}) {
    RunResult r = run_meshtrain(args);
    EXPECT_EQ(r.exit_code, 1) << r.describe();
  }
  EXPECT_EQ(run_meshtrain({"train", "--help"}).exit_code, 0);
}

TEST_F(Hardening, P12_ResumeChecksStateAndWarnsOnChangedRun) {
  const std::string ck = dir_ / "ck";
  ASSERT_EQ(run_meshtrain(tiny(shard_, {"--steps", "2", "--checkpoint-dir", ck})).exit_code, 0);
  const std::string other = dir_ / "other.bin";
  make_random_shard(other, 5000, 64, 2);
  std::vector<std::string> a = {
      "train",   "--data", other,      "--seq-len", "16",     "--batch-size",        "8", "--quiet", "--seed", "7",
      "--steps", "3",      "--resume", ck,          "--save", dir_ / "w.safetensors"};
  RunResult r = run_meshtrain(concat(a, tiny_gpt_flags()));
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  for (const char* w : {"--batch-size", "--seed", "--data"})
    EXPECT_TRUE(contains(r.err, std::string("warning")) && contains(r.err, w)) << w << "\n" << r.describe();
  // A negative step in state.json.
  const std::string state = ck + "/step_00000002/state.json";
  auto j = nlohmann::json::parse(slurp(state));
  j["step"] = -5;
  write_bytes(state, j.dump());
  r = run_meshtrain(
      tiny(shard_, {"--steps", "3", "--resume", ck + "/step_00000002", "--save", dir_ / "w.safetensors"}));
  expect_error_naming(r, {"state.json", "-5", "negative"});
}

TEST_F(Hardening, P12_MlpProgressSaysExamples) {
  const std::string img = dir_ / "img", lab = dir_ / "lab";
  IdxImages im;
  im.count = 64;
  im.rows = 4;
  im.cols = 4;
  im.pixels.assign(64 * 16, 7);
  write_idx_images(img, im);
  IdxLabels lb;
  lb.labels.assign(64, 3);
  write_idx_labels(lab, lb);
  RunResult r = run_meshtrain({"train", "--model", "mlp", "--data", img, "--labels", lab, "--hidden", "8",
                               "--batch-size", "8", "--steps", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.err, " ex/s")) << r.err;
  EXPECT_FALSE(contains(r.err, "tok/s")) << r.err;
}

}  // namespace
}  // namespace mt::clitest
