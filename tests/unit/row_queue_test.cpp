// A step's metrics row from its two parts (train/observers.h RowQueue): the loop's part when the step is over
// and the exchange's outcome when it is known, which for a parameter-server worker can be steps later or
// before the loop's part. Rows are written whole and in step order, each once, and the summary's final
// loss is the last written row's.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "train/observers.h"

namespace {

using namespace mt::train;

std::vector<nlohmann::json> read_rows(const std::string& path) {
  std::vector<nlohmann::json> rows;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

TEST(RowQueue, WritesWholeRowsInStepOrderWhicheverPartComesFirst) {
  const std::string path = (std::filesystem::temp_directory_path() / "meshtrain_row_queue_test.jsonl").string();
  TrainConfig cfg;
  cfg.metrics = path;
  cfg.progress = false;
  cfg.steps = 3;
  TrainSummary sum;
  {
    RunLog log(cfg, true, 0, "tok");
    RowQueue rows(log, sum);
    auto local = [&](int64_t s) { rows.local(s, {{"step", s}, {"tokens_per_s", 100.0 + s}}); };
    rows.outcome(1, 2.5, 0.25, 0.5f);  // step 1's outcome before its own part and before step 0's
    local(0);
    local(1);
    EXPECT_EQ(rows.pending(), 2u);  // step 0 still lacks its outcome, so nothing is written yet
    EXPECT_TRUE(read_rows(path).empty());
    rows.outcome(0, 3.5, 0.75, 1.0f);  // completes 0, then 1
    EXPECT_EQ(rows.pending(), 0u);
    EXPECT_EQ(sum.final_loss, 2.5);
    local(2);  // the synchronous order: outcome during the step, the loop's part after it
    rows.outcome(2, 1.5, 0.125, 0.25f);
    EXPECT_EQ(sum.final_loss, 1.5);
  }
  const std::vector<nlohmann::json> got = read_rows(path);
  ASSERT_EQ(got.size(), 3u);
  const double loss[] = {3.5, 2.5, 1.5}, norm[] = {0.75, 0.25, 0.125}, lr[] = {1.0, 0.5, 0.25};
  for (int s = 0; s < 3; s++) {
    EXPECT_EQ(got[s]["step"], s);
    EXPECT_EQ(got[s]["loss"], loss[s]);
    EXPECT_EQ(got[s]["grad_norm"], norm[s]);
    EXPECT_EQ(got[s]["lr"], lr[s]);
    EXPECT_EQ(got[s]["tokens_per_s"], 100.0 + s);
  }
  std::filesystem::remove(path);
}

}  // namespace
