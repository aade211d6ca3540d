// The micro-batch loop (train/step_executor.h) over a share given as a list of micro-batch sizes: an uneven
// share (3 + 1 windows) gives the gradient and loss of the even one (2 + 2) and of one micro-batch of 4, to
// float32 summation order, with the loop unchanged; the update is called once, after the last micro-batch.
#include "train/step_executor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include "data/idx.h"
#include "train/model_registry.h"

namespace {

using namespace mt::train;

struct Result {
  double loss = 0;
  std::vector<float> grad;
  int updates = 0;
};

Result run(const TrainConfig& cfg, const std::vector<int>& sizes) {
  const BatchLayout layout(cfg, 1);
  std::unique_ptr<TrainTask> task = model_entry(cfg.model).make(cfg, layout, {});
  mt::nn::ParamRegistry& params = task->params();
  params.finalize();
  for (mt::nn::Param& p : params.params()) task->init_param(p);
  task->prepare();
  params.zero_grad();
  const std::unique_ptr<StepExecutor> ex = make_step_executor(*task, nullptr, nullptr);
  EXPECT_TRUE(ex->calls_hooks());
  BatchShare share;
  share.sizes = sizes;
  Result r;
  ex->run(3, share, {}, [&](double loss_sum, UpdatePart) {
    r.loss = loss_sum;
    r.updates++;
  });
  r.grad.assign(params.grad(), params.grad() + params.size());
  return r;
}

TEST(StepExecutor, UnevenMicroBatchSharesGiveTheSameGradient) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "mt_step_executor_test";
  std::filesystem::create_directories(dir);
  mt::IdxImages im;
  im.count = 8, im.rows = 2, im.cols = 2;
  for (int i = 0; i < 32; i++) im.pixels.push_back((uint8_t)(i * 37 % 251));
  mt::write_idx_images((dir / "im.idx").string(), im);
  mt::write_idx_labels((dir / "lb.idx").string(), mt::IdxLabels{{0, 1, 2, 3, 4, 5, 6, 7}});
  TrainConfig cfg;
  cfg.model = ModelKind::mlp;
  cfg.data = (dir / "im.idx").string();
  cfg.labels = (dir / "lb.idx").string();
  cfg.val_fraction = 0;
  cfg.hidden = {6};
  cfg.batch_size = 4;
  const Result whole = run(cfg, {4}), even = run(cfg, {2, 2}), uneven = run(cfg, {3, 1});
  EXPECT_EQ(uneven.updates, 1);
  ASSERT_EQ(whole.grad.size(), uneven.grad.size());
  EXPECT_NEAR(uneven.loss, whole.loss, 1e-5 * std::abs(whole.loss));
  EXPECT_NEAR(even.loss, whole.loss, 1e-5 * std::abs(whole.loss));
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < whole.grad.size(); i++) {
    max_diff = std::max(max_diff, (double)std::abs(uneven.grad[i] - whole.grad[i]));
    max_abs = std::max(max_abs, (double)std::abs(whole.grad[i]));
  }
  EXPECT_GT(max_abs, 1e-3);                    // a gradient to compare
  EXPECT_LT(max_diff, 1e-6 + 1e-5 * max_abs);  // float32 summation order only
  // A share missing a window is another gradient (the comparison can fail).
  const Result short_share = run(cfg, {3});
  double d = 0;
  for (size_t i = 0; i < whole.grad.size(); i++) d = std::max(d, (double)std::abs(short_share.grad[i] - whole.grad[i]));
  EXPECT_GT(d, 1e-4);
  std::filesystem::remove_all(dir);
}

}  // namespace
