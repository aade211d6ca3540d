// report/run_data.h: finding and reading a run's files for meshtrain report, and the errors for bad ones.
#include <gtest/gtest.h>

#include <fstream>

#include "io_test_util.h"
#include "report/run_data.h"

namespace {

using mt::testing_io::ScratchDir;
using namespace mt::report;

void put(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// The InputError's message, or "" when none was thrown.
std::string error_of(const std::string& path) {
  try {
    load_run(path);
  } catch (const mt::InputError& e) {
    return e.what();
  }
  return "";
}

TEST(ReportRunData, DirectoryWithMetricsSummaryTraceAndConfig) {
  ScratchDir dir;
  put(dir.file("metrics.jsonl"),
      "{\"step\":0,\"loss\":5.5,\"comm_bytes\":7}\n\n{\"step\":1,\"loss\":null}\n"
      "{\"step\":2,\"loss\":5.25,\"val_loss\":5.0,\"comm_bytes\":9}\n");
  put(dir.file("summary.json"), "{\"dp\": 2}");
  put(dir.file("trace.json"), "{\"traceEvents\": []}");
  put(dir.file("metrics.toml"), "steps = 3\n");
  const RunData r = load_run(dir.path().string());
  EXPECT_EQ(r.name, dir.path().filename().string());
  EXPECT_EQ(r.rows.size(), 3u);
  EXPECT_EQ(r.summary["dp"], 2);
  EXPECT_TRUE(r.trace.is_object());
  EXPECT_EQ(r.config_text, "steps = 3\n");
  const auto loss = column(r, "loss");  // the null loss (a non-finite value) is left out
  ASSERT_EQ(loss.size(), 2u);
  EXPECT_EQ(loss[1], (std::pair<double, double>{2, 5.25}));
  EXPECT_EQ(column(r, "val_loss").size(), 1u);
}

TEST(ReportRunData, MetricsFileNamesTheRunAndFindsItsSiblings) {
  ScratchDir dir;
  put(dir.file("a.jsonl"), "{\"step\":0,\"loss\":1}\n");
  put(dir.file("b.jsonl"), "{\"step\":0,\"loss\":2}\n");
  put(dir.file("a.summary.json"), "{\"pp\": 2}");
  put(dir.file("summary.json"), "{\"pp\": 1}");
  put(dir.file("a.toml"), "x = 1\n");
  RunData a = load_run(dir.file("a.jsonl"));
  EXPECT_EQ(a.name, "a");
  EXPECT_EQ(a.summary["pp"], 2);
  EXPECT_EQ(a.config_path, dir.file("a.toml"));
  RunData b = load_run(dir.file("b.jsonl"));
  EXPECT_EQ(b.summary["pp"], 1);  // no b.summary.json: the directory's
  EXPECT_TRUE(b.config_path.empty());
  std::vector<RunData> runs = {a, a, b};
  make_names_unique(runs);
  EXPECT_EQ(runs[1].name, "a (2)");
  // Two metrics files and no metrics.jsonl: which one is meant is not guessed.
  const std::string e = error_of(dir.path().string());
  EXPECT_NE(e.find("several metrics files"), std::string::npos) << e;
  EXPECT_NE(e.find(dir.file("a.jsonl")), std::string::npos) << e;
}

TEST(ReportRunData, BadFilesNameFileLineAndKey) {
  ScratchDir dir;
  put(dir.file("m.jsonl"), "{\"step\":0,\"loss\":1}\n{\"step\":1,\"loss\"\n");
  EXPECT_NE(error_of(dir.file("m.jsonl")).find(dir.file("m.jsonl") + ":2: not a JSON object"), std::string::npos)
      << error_of(dir.file("m.jsonl"));
  put(dir.file("m.jsonl"), "{\"step\":0,\"loss\":1}\n{\"step\":1}\n");
  EXPECT_NE(error_of(dir.file("m.jsonl")).find(dir.file("m.jsonl") + ":2: the row has no \"loss\""), std::string::npos)
      << error_of(dir.file("m.jsonl"));
  put(dir.file("m.jsonl"), "[1, 2]\n");
  EXPECT_NE(error_of(dir.file("m.jsonl")).find(":1: not a JSON object"), std::string::npos);
  put(dir.file("m.jsonl"), "\n");
  EXPECT_NE(error_of(dir.file("m.jsonl")).find("holds no metrics rows"), std::string::npos);
  put(dir.file("m.jsonl"), "{\"step\":0,\"loss\":1}\n");
  put(dir.file("summary.json"), "{\n\"dp\": 1,\n\"tp\": }\n");
  EXPECT_NE(error_of(dir.file("m.jsonl")).find(dir.file("summary.json") + ":3: not valid JSON"), std::string::npos)
      << error_of(dir.file("m.jsonl"));
  put(dir.file("summary.json"), "{}");
  put(dir.file("trace.json"), "{\"events\": []}");
  EXPECT_NE(error_of(dir.file("m.jsonl")).find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(error_of(dir.file("missing")).find(dir.file("missing") + ": no such file or directory"), std::string::npos);
  ScratchDir empty;
  EXPECT_NE(error_of(empty.path().string()).find("no metrics file"), std::string::npos);
}

}  // namespace
