// Issue 22, first half: outputs checked before step 1 for every kind of path, and a resume that continues
// the run it names or says why not. One test (or a few) per numbered point, each reproducing the reported
// misuse through the real CLI and asserting the wanted behaviour. Symlinks, FIFOs and the small tmpfs of
// point 14 are made inside the test's temporary directory (the tmpfs needs root: without it that test
// skips, saying so); the mount is undone in teardown.
#include <sys/mount.h>
#include <sys/stat.h>

#include "tests/cli/cli_test_util.h"

namespace mt::clitest {
namespace {

// Tiny GPT (n_head 2) on `data` (a shard of 64-token vocabulary) plus `extra`.
std::vector<std::string> tiny(const std::string& data, const std::vector<std::string>& extra) {
  return concat(concat({"train", "--data", data, "--seq-len", "16", "--batch-size", "4", "--quiet"}, tiny_gpt_flags()),
                extra);
}

// The same without any shape flag: the shape comes from the checkpoint on resume.
std::vector<std::string> tiny_shapeless(const std::string& data, const std::vector<std::string>& extra) {
  return concat({"train", "--data", data, "--seq-len", "16", "--batch-size", "4", "--quiet"}, extra);
}

void expect_error_naming(const RunResult& r, const std::vector<std::string>& words) {
  EXPECT_FALSE(r.timed_out) << r.describe();
  EXPECT_EQ(r.term_signal, 0) << r.describe();
  EXPECT_EQ(r.exit_code, 1) << r.describe();
  for (const std::string& w : words)
    EXPECT_TRUE(contains(r.err, w)) << "stderr lacks \"" << w << "\"\n" << r.describe();
}

int64_t first_step(const std::string& metrics) {
  const std::vector<std::string> rows = read_lines(metrics);
  return rows.empty() ? -1 : nlohmann::json::parse(rows.front())["step"].get<int64_t>();
}

class OutputsResume : public ::testing::Test {
 protected:
  void SetUp() override {
    shard_ = dir_ / "data.bin";
    make_random_shard(shard_, 5000, 64, 1);
  }
  // A checkpoint directory of a finished `steps`-step run that saved every `every` steps and kept them all.
  std::string make_run(const std::string& name, int steps, int every, const std::vector<std::string>& extra = {}) {
    const std::string ck = dir_ / name;
    RunResult r =
        run_meshtrain(tiny(shard_, concat({"--steps", std::to_string(steps), "--save-every", std::to_string(every),
                                           "--keep-checkpoints", "0", "--checkpoint-dir", ck},
                                          extra)));
    EXPECT_EQ(r.exit_code, 0) << r.describe();
    return ck;
  }
  TempDir dir_;
  std::string shard_;
};

// ---- 1. a --checkpoint-dir that is, or lies below, a dangling symlink: refused before step 1 (not created:
// see preflight.cpp check_no_dangling_link for why)
TEST_F(OutputsResume, P1_DanglingSymlinkCheckpointDirIsRefusedBeforeStep1) {
  const std::string link = dir_ / "dangling", target = dir_ / "unmounted_disk", metrics = dir_ / "m.jsonl";
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  for (const std::string& d : {link, link + "/sub/ck"}) {
    SCOPED_TRACE(d);
    RunResult r = run_meshtrain(tiny(shard_, {"--steps", "300", "--checkpoint-dir", d, "--metrics", metrics}));
    expect_error_naming(r, {"--checkpoint-dir", d, link, target, "does not exist"});
    EXPECT_FALSE(fs::exists(metrics)) << "a step ran before the refusal";
    EXPECT_FALSE(fs::exists(target)) << "the link's target was created";
  }
  // Once the target exists the same command line works and writes through the link.
  fs::create_directory(target);
  RunResult r = run_meshtrain(tiny(shard_, {"--steps", "2", "--checkpoint-dir", link}));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(is_complete_checkpoint(target + "/step_00000002"));
}

// ---- 2. --resume X --checkpoint-dir Y, Y holding another run's checkpoints: refused, nothing pruned
TEST_F(OutputsResume, P2_ResumeIntoAnotherRunsCheckpointDirIsRefused) {
  const std::string cx = make_run("cx", 4, 2), cy = make_run("cy", 2, 1, {"--seed", "9"});
  const std::string y_state = slurp(cy + "/step_00000002/state.json");
  RunResult r = run_meshtrain(tiny(shard_, {"--steps", "8", "--resume", cx, "--checkpoint-dir", cy, "--save-every", "1",
                                            "--keep-checkpoints", "1"}));
  expect_error_naming(r, {"--checkpoint-dir", cy, "another run", "step_00000001", "step_00000002", "--resume", cx,
                          "--overwrite-checkpoints"});
  EXPECT_TRUE(is_complete_checkpoint(cy + "/step_00000001"));
  EXPECT_TRUE(is_complete_checkpoint(cy + "/step_00000002"));
  EXPECT_EQ(slurp(cy + "/step_00000002/state.json"), y_state);
  EXPECT_EQ(trim(slurp(cy + "/latest")), "step_00000002");

  // --overwrite-checkpoints may empty another directory, never the one resumed from.
  r = run_meshtrain(tiny(shard_, {"--steps", "8", "--resume", cx, "--checkpoint-dir", cx, "--overwrite-checkpoints"}));
  expect_error_naming(r, {"--overwrite-checkpoints", cx, "would delete"});
  EXPECT_TRUE(is_complete_checkpoint(cx + "/step_00000004"));
  r = run_meshtrain(tiny(shard_, {"--steps", "6", "--resume", cx, "--checkpoint-dir", cy, "--save-every", "1",
                                  "--overwrite-checkpoints"}));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_FALSE(fs::exists(cy + "/step_00000001"));
  EXPECT_FALSE(fs::exists(cy + "/step_00000002"));
  EXPECT_TRUE(is_complete_checkpoint(cy + "/step_00000006"));

  // The same run: a step directory of cx resumed into cx itself is accepted.
  r = run_meshtrain(tiny(shard_, {"--steps", "6", "--resume", cx + "/step_00000002", "--checkpoint-dir", cx}));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(is_complete_checkpoint(cx + "/step_00000006"));
}

// ---- 3. --save, --summary, --trace (and --metrics) on a FIFO nobody reads: refused before step 1; with a
// reader the output arrives whole (the start-up check must not hand the reader an early end-of-file)
TEST_F(OutputsResume, P3_FifoOutputWithoutReaderIsRefusedBeforeStep1) {
  const std::string fifo = dir_ / "fifo", metrics = dir_ / "m.jsonl";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  for (const char* flag : {"--save", "--summary", "--trace", "--metrics"}) {
    SCOPED_TRACE(flag);
    std::vector<std::string> extra = {"--steps", "300", flag, fifo};
    if (std::string(flag) != "--metrics") extra = concat(extra, {"--metrics", metrics});
    RunResult r = run_meshtrain(tiny(shard_, extra), 20);
    expect_error_naming(r, {flag, fifo, "no process is reading the FIFO"});
    EXPECT_FALSE(fs::exists(metrics)) << "a step ran before the refusal";
  }
  const std::string got = dir_ / "got.safetensors";
  BackgroundProcess reader({"/bin/sh", "-c", "cat '" + fifo + "' > '" + got + "'"}, dir_ / "r.out", dir_ / "r.err");
  RunResult r;
  for (int i = 0; i < 50; i++) {  // until cat has opened its end
    r = run_meshtrain(tiny(shard_, {"--steps", "2", "--save", fifo}), 30);
    if (r.exit_code == 0 || !contains(r.err, "no process is reading")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  reader.wait();
  SafetensorsReader w(got);  // throws on a torn file
  EXPECT_NE(w.find("wte.weight"), nullptr);
}

// ---- 4. --resume with neither --checkpoint-dir nor --save: refused like --stop-at-step without one
TEST_F(OutputsResume, P4_ResumeThatKeepsNothingIsRefused) {
  const std::string cx = make_run("cx", 4, 2), metrics = dir_ / "m.jsonl";
  RunResult r = run_meshtrain(tiny(shard_, {"--steps", "20", "--resume", cx, "--metrics", metrics}));
  expect_error_naming(r, {"--resume", cx, "--checkpoint-dir", "--save", "lost"});
  EXPECT_FALSE(fs::exists(metrics));
  r = run_meshtrain(tiny(shard_, {"--steps", "6", "--resume", cx, "--save", dir_ / "w.safetensors"}));
  EXPECT_EQ(r.exit_code, 0) << r.describe();
}

// ---- 5. a shape flag that differs from the checkpoint: refused naming the flag and the checkpoint's value
TEST_F(OutputsResume, P5_ResumeWithAnotherModelShapeIsRefused) {
  const std::string cx = make_run("cx", 4, 2), save = dir_ / "w.safetensors";
  std::vector<std::string> args = tiny(shard_, {"--steps", "6", "--resume", cx, "--save", save});
  for (size_t i = 0; i + 1 < args.size(); i++)
    if (args[i] == "--n-head") args[i + 1] = "4";
  RunResult r = run_meshtrain(args);
  expect_error_naming(r, {"--n-head 4", "n_head=2", cx + "/step_00000004"});
  EXPECT_FALSE(fs::exists(save));
  // Several ranks: the launcher's parent says it once, before any rank starts.
  r = run_meshtrain(concat(args, {"--nproc", "2"}));
  expect_error_naming(r, {"--n-head 4", "n_head=2"});
  EXPECT_FALSE(contains(r.err, "rank 0")) << r.describe();
  EXPECT_FALSE(fs::exists(save));
  // No shape flag at all: the checkpoint's shape, written back as it was.
  r = run_meshtrain(tiny_shapeless(shard_, {"--steps", "6", "--resume", cx, "--save", save}));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  SafetensorsReader w(save);
  EXPECT_EQ(w.metadata().at("n_head"), "2");
  EXPECT_EQ(w.metadata().at("n_layer"), "2");
}

// ---- 6. every flag that changes the math compared; the data by content, not by path
TEST_F(OutputsResume, P6_ResumeComparesMathFlagsAndDataByContent) {
  const std::string cx = make_run("cx", 8, 4), save = dir_ / "w.safetensors";
  const std::string copy = dir_ / "copy.bin";
  fs::copy_file(shard_, copy);
  // An identical copy at another path, every flag as saved: no warning at all.
  RunResult r = run_meshtrain(tiny(copy, {"--steps", "8", "--resume", cx + "/step_00000004", "--save", save}));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_FALSE(contains(r.err, "warning")) << r.describe();
  // --seq-len and --lr changed: one warning each, with both values.
  std::vector<std::string> args =
      tiny(shard_, {"--steps", "8", "--resume", cx + "/step_00000004", "--save", save, "--lr", "1e-3"});
  for (size_t i = 0; i + 1 < args.size(); i++)
    if (args[i] == "--seq-len") args[i + 1] = "8";
  r = run_meshtrain(args);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.err, "warning") && contains(r.err, "--seq-len 16; resuming with 8")) << r.describe();
  EXPECT_TRUE(contains(r.err, "--lr 0.0003; resuming with 0.001")) << r.describe();
  EXPECT_FALSE(contains(r.err, "--data")) << r.describe();
  // The same path, one token changed: the data warning, naming the flag and the path.
  std::string bytes = slurp(shard_);
  bytes[bytes.size() / 2] ^= 1;
  write_bytes(shard_, bytes);
  r = run_meshtrain(tiny(shard_, {"--steps", "8", "--resume", cx + "/step_00000004", "--save", save}));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.err, "warning") && contains(r.err, "--data " + shard_) && contains(r.err, "other content"))
      << r.describe();
}

// The MLP's inputs are two files: the labels are compared by content too, and --val-fraction (which splits
// --data into training and held-out examples) is a flag that changes the math.
TEST_F(OutputsResume, P6_MlpResumeComparesLabelsByContentAndValFraction) {
  const std::string img = dir_ / "img", lab = dir_ / "lab", lab_copy = dir_ / "lab_copy", ck = dir_ / "ck";
  IdxImages im;
  im.count = 64;
  im.rows = 4;
  im.cols = 4;
  for (int i = 0; i < 64 * 16; i++) im.pixels.push_back((uint8_t)(i * 7));
  write_idx_images(img, im);
  IdxLabels lb;
  for (int i = 0; i < 64; i++) lb.labels.push_back((uint8_t)(i % 3));
  write_idx_labels(lab, lb);
  fs::copy_file(lab, lab_copy);
  auto mlp = [&](const std::string& labels, const std::vector<std::string>& extra) {
    return concat(
        {"train", "--model", "mlp", "--data", img, "--labels", labels, "--hidden", "8", "--batch-size", "8", "--quiet"},
        extra);
  };
  ASSERT_EQ(run_meshtrain(mlp(lab, {"--steps", "4", "--save-every", "2", "--checkpoint-dir", ck})).exit_code, 0);
  const std::vector<std::string> resume = {
      "--steps", "4", "--resume", ck + "/step_00000002", "--save", dir_ / "w.safetensors"};
  RunResult r = run_meshtrain(mlp(lab_copy, resume));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_FALSE(contains(r.err, "warning")) << r.describe();
  r = run_meshtrain(mlp(lab_copy, concat(resume, {"--val-fraction", "0.5"})));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.err, "--val-fraction 0.2; resuming with 0.5")) << r.describe();
  lb.labels[10] = 2;  // one label changed at the same path
  write_idx_labels(lab, lb);
  r = run_meshtrain(mlp(lab, resume));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.err, "--labels " + lab) && contains(r.err, "other content")) << r.describe();
  EXPECT_FALSE(contains(r.err, "--data")) << r.describe();
}

// ---- 12. latest missing, or naming a deleted or damaged step: the newest complete step, with a message
TEST_F(OutputsResume, P12_BadLatestFallsBackToNewestCompleteStep) {
  const std::string ck = make_run("ck", 6, 2), metrics = dir_ / "m.jsonl";
  auto resume = [&] {
    fs::remove(metrics);
    return run_meshtrain(tiny(shard_, {"--steps", "8", "--resume", ck, "--checkpoint-dir", ck, "--metrics", metrics,
                                       "--keep-checkpoints", "0"}));
  };
  fs::remove(ck + "/latest");
  RunResult r = resume();
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.err, ck + "/latest does not exist") && contains(r.err, ck + "/step_00000006")) << r.err;
  EXPECT_EQ(first_step(metrics), 6);

  fs::remove_all(ck + "/step_00000008");
  write_bytes(ck + "/latest", "step_00000008\n");  // deleted
  r = resume();
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.err, "points at step_00000008, which does not exist")) << r.err;
  EXPECT_EQ(first_step(metrics), 6);

  fs::remove_all(ck + "/step_00000008");
  write_bytes(ck + "/step_00000006/state.json", "{\"step\": 6,");  // damaged
  write_bytes(ck + "/latest", "step_00000006\n");
  r = resume();
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.err, "step_00000006, which has a state.json that is not valid JSON") &&
              contains(r.err, ck + "/step_00000004"))
      << r.err;
  EXPECT_EQ(first_step(metrics), 4);

  // Nothing complete left: an error naming each step directory's problem.
  for (const char* s : {"step_00000002", "step_00000004", "step_00000008"})
    fs::remove(ck + "/" + s + "/model.safetensors");
  r = resume();
  expect_error_naming(r, {"--resume", ck, "no complete checkpoint", "step_00000002 lacks model.safetensors",
                          "step_00000006 has a state.json that is not valid JSON"});
}

// ---- 14 (part). a metrics disk that fills mid-run: whole rows only, and the step and last checkpoint named
class SmallDisk : public OutputsResume {
 protected:
  void SetUp() override {
    OutputsResume::SetUp();
    if (geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
    mnt_ = dir_ / "small";
    fs::create_directory(mnt_);
    ASSERT_EQ(mount("tmpfs", mnt_.c_str(), "tmpfs", 0, "size=16k"), 0) << std::strerror(errno);
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) {
      EXPECT_EQ(umount2(mnt_.c_str(), MNT_DETACH), 0) << std::strerror(errno);
    }
  }
  std::string mnt_;
  bool mounted_ = false;
};

TEST_F(SmallDisk, P14_FullMetricsDiskKeepsWholeRowsAndNamesStepAndCheckpoint) {
  const std::string metrics = mnt_ + "/m.jsonl", ck = dir_ / "ck";
  RunResult r = run_meshtrain(
      tiny(shard_, {"--steps", "2000", "--metrics", metrics, "--checkpoint-dir", ck, "--save-every", "10"}), 120);
  expect_error_naming(r, {"cannot write metrics file", metrics, "No space left on device", "at the row of step",
                          "the last checkpoint is " + ck + "/step_"});
  const std::string text = slurp(metrics);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n') << "a row was cut mid-line";
  const std::vector<std::string> rows = read_lines(metrics);
  int64_t last = -1;
  for (const std::string& row : rows) {
    auto j = nlohmann::json::parse(row);  // throws on a torn row
    EXPECT_EQ(j["step"].get<int64_t>(), last + 1);
    last = j["step"].get<int64_t>();
  }
  EXPECT_TRUE(contains(r.err, "at the row of step " + std::to_string(last + 1) + ";")) << r.err;
  const int64_t saved = (last + 1) / 10 * 10;  // the checkpoint after the last whole row's step
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", (long long)saved);
  EXPECT_TRUE(contains(r.err, ck + "/" + name + " (step " + std::to_string(saved) + ")")) << r.err;
  EXPECT_TRUE(is_complete_checkpoint(ck + "/" + name));
}

// ---- 16 (part). lm_head.weight equal to wte is the tied copy; a state.json disagreeing with its directory
TEST_F(OutputsResume, P16_TiedLmHeadCopyIsAcceptedAndAnotherIsRefused) {
  const std::string plain = dir_ / "plain.safetensors";
  GptShape shape;
  shape.vocab_size = 64;
  write_gpt_init(plain, shape);
  auto tensors = read_all_f32(plain);
  SafetensorsReader meta(plain);
  auto with_head = [&](const std::string& path, bool tied) {
    SafetensorsWriter w;
    for (auto& [k, v] : meta.metadata()) w.set_metadata(k, v);
    for (auto& [name, _] : gpt_tensor_shapes(shape)) w.add_f32(name, meta.get(name).shape, tensors[name].data());
    std::vector<float> head = tensors["wte.weight"];
    if (!tied) head[5] += 1.0f;
    w.add_f32("lm_head.weight", meta.get("wte.weight").shape, head.data());
    w.write(path);
  };
  const std::string tied = dir_ / "tied.safetensors", untied = dir_ / "untied.safetensors";
  with_head(tied, true);
  with_head(untied, false);
  RunResult r = run_meshtrain(
      {"train", "--data", shard_, "--seq-len", "16", "--batch-size", "4", "--quiet", "--steps", "1", "--init", tied});
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  r = run_meshtrain(
      {"train", "--data", shard_, "--seq-len", "16", "--batch-size", "4", "--quiet", "--steps", "1", "--init", untied});
  expect_error_naming(r, {untied, "lm_head.weight", "differs from wte.weight"});
  // sample reads weights the same way.
  r = run_meshtrain({"sample", "--init", tied, "--prompt", "!", "--max-new-tokens", "2"});  // byte 33 < 64
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  r = run_meshtrain({"sample", "--init", untied, "--prompt", "!", "--max-new-tokens", "2"});
  expect_error_naming(r, {untied, "lm_head.weight", "differs from wte.weight"});
}

TEST_F(OutputsResume, P16_StateStepDisagreeingWithDirectoryIsRefused) {
  const std::string ck = make_run("ck", 4, 2);
  const std::string state = ck + "/step_00000004/state.json";
  auto j = nlohmann::json::parse(slurp(state));
  j["step"] = 3;
  write_bytes(state, j.dump());
  RunResult r =
      run_meshtrain(tiny(shard_, {"--steps", "6", "--resume", ck + "/step_00000004", "--save", dir_ / "w.st"}));
  expect_error_naming(r, {state, "says step 3", "step_00000004"});
  // Through latest it is not complete: the step before it is used, and the message says why.
  r = run_meshtrain(tiny(shard_, {"--steps", "6", "--resume", ck, "--save", dir_ / "w.st"}));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.err, "says step 3 in directory step_00000004") && contains(r.err, ck + "/step_00000002"))
      << r.err;
}

}  // namespace
}  // namespace mt::clitest
