// The model registry (train/model_registry.h): every --model value has one row, the rows say what differs
// between the models, and a task comes out of the table (the MLP's, from IDX files written here).
#include "train/model_registry.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "data/idx.h"

namespace {

using namespace mt::train;

TEST(ModelRegistry, EveryModelFlagValueHasItsRow) {
  // --model's spellings are the rows' names, one per row.
  std::vector<std::string> names;
  for (const auto& v : flag_values(ModelKind{})) {
    EXPECT_EQ(model_entry(v.value).kind, v.value) << v.name;
    EXPECT_STREQ(model_entry(v.value).name, v.name);
    names.push_back(v.name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"gpt", "mlp"}));
  EXPECT_STREQ(flag_name(ModelKind::mlp), "mlp");
  EXPECT_STREQ(model_entry(ModelKind::gpt).items, "tokens");
  EXPECT_STREQ(model_entry(ModelKind::mlp).items, "examples");
  EXPECT_TRUE(model_entry(ModelKind::gpt).has_router);
  EXPECT_FALSE(model_entry(ModelKind::mlp).has_router);
  EXPECT_NE(model_entry(ModelKind::gpt).check_shape, nullptr);
  EXPECT_EQ(model_entry(ModelKind::mlp).check_shape, nullptr);
}

TEST(ModelRegistry, BuildsTheMlpTaskFromItsRow) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "mt_model_registry_test";
  std::filesystem::create_directories(dir);
  mt::IdxImages im;
  im.count = 4, im.rows = 2, im.cols = 3;
  im.pixels.assign(24, 7);
  mt::write_idx_images((dir / "im.idx").string(), im);
  mt::write_idx_labels((dir / "lb.idx").string(), mt::IdxLabels{{0, 1, 2, 3}});
  TrainConfig cfg;
  cfg.model = ModelKind::mlp;
  cfg.data = (dir / "im.idx").string();
  cfg.labels = (dir / "lb.idx").string();
  cfg.hidden = {5};
  cfg.batch_size = 2;
  const BatchLayout layout(cfg, 1);
  const std::unique_ptr<TrainTask> task = model_entry(cfg.model).make(cfg, layout, {});
  EXPECT_TRUE(task->is_classifier());
  EXPECT_STREQ(task->item_name(), "ex");
  EXPECT_EQ(task->global_batch(), 2);
  // 6 pixels -> 5 hidden -> 10 classes: weights and biases.
  EXPECT_EQ(task->params().params().size(), 4u);
  std::filesystem::remove_all(dir);
}

}  // namespace
