// The MLP classification task on labeled images (data/labeled_images.h: IDX files, pixels in [0, 1], the
// batch rule); evaluation uses the held-out split: --val-data, or the last --val-fraction of --data.
#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"
#include "core/error.h"
#include "data/labeled_images.h"
#include "model/mlp.h"
#include "nn/activation_store.h"
#include "train/model_registry.h"
#include "train/task.h"

namespace mt::train {

namespace {

class MlpTask : public TrainTask {
 public:
  MlpTask(const MlpTaskConfig& cfg, const BatchLayout& layout) : cfg_(cfg), layout_(layout) {
    const int K = 10;
    data::LabeledImages all = data::load_labeled_images(cfg.data, cfg.labels, K);
    if (!cfg.val_data.empty()) {
      train_ = std::move(all);
      val_ = data::load_labeled_images(cfg.val_data, cfg.val_labels, K);
      MT_CHECK_INPUT(val_.D == train_.D, cfg.val_data, " images have ", val_.D, " pixels, training images ", train_.D);
    } else {
      MT_CHECK_INPUT(cfg.val_fraction >= 0 && cfg.val_fraction < 1, "--val-fraction must be in [0, 1), got ",
                     cfg.val_fraction);
      int64_t nval = (int64_t)(all.count * cfg.val_fraction);
      train_ = std::move(all);
      val_ = train_.split_tail(train_.count - nval);
    }
    MT_CHECK_INPUT(train_.count >= 1, cfg.data, ": no training examples left after the validation split");
    B_ = cfg.batch_size;
    model::MlpConfig mc{train_.D, cfg.hidden, K};
    model_ = std::make_unique<model::Mlp>(mc, params_);
    model_->set_precision(cfg.precision);
    if (!cfg.init.empty()) {
      init_.emplace(cfg.init);
      checkpoint::check_tensors(*init_, params_);
    }
  }

  nn::ParamRegistry& params() override { return params_; }
  void declare_full(nn::ParamRegistry& full) const override { model::Mlp(model_->config(), full); }

  void init_param(nn::Param& p) override {
    if (init_)
      checkpoint::load_param(*init_, p);
    else
      model_->init_param(p, cfg_.seed);
  }

  void prepare() override {}

  double micro_batch(int64_t step, int first, int count, nn::ParamHooks* hooks) override {
    const float dscale = 1.0f / (float)B_;
    xb_.resize((size_t)count * train_.D);
    yb_.resize(count);
    train_.batch(step, B_, first, count, xb_.data(), yb_.data());
    const double loss = model_->forward(store_, 0, xb_.data(), yb_.data(), count, dscale, hooks);
    model_->backward(store_, 0, count, hooks);
    return loss;
  }

  bool has_eval() const override { return val_.count > 0; }

  // The whole held-out split (`batches` does not limit it: MNIST-sized splits are cheap), in chunks of
  // 1024 examples dealt round-robin to the ranks. Every rank runs the same number of forward passes (ZeRO-3
  // gathers are collective), the surplus ones on an empty range.
  EvalSums evaluate(int, int rank, int nranks, nn::ParamHooks* hooks) override {
    EvalSums r;
    const int64_t chunk = 1024;
    const int64_t chunks = (val_.count + chunk - 1) / chunk;
    for (int64_t c = 0; c < (chunks + nranks - 1) / nranks * nranks; c += nranks) {
      int64_t i = (c + rank) * chunk;
      int n = i < val_.count ? (int)std::min(chunk, val_.count - i) : 0;
      int64_t correct = 0;
      if (n > 0) {
        r.loss += model_->evaluate(store_, &val_.x[(size_t)i * val_.D], &val_.y[i], n, &correct, hooks);
      } else {
        model_->evaluate(store_, val_.x.data(), val_.y.data(), 1, &correct, hooks);  // keeps collectives in step
        correct = 0;
      }
      r.correct += (double)correct;
      r.count += n;
    }
    return r;
  }

  bool is_classifier() const override { return true; }
  int global_batch() const override { return B_; }
  int64_t items_per_window() const override { return 1; }
  const char* item_name() const override { return "ex"; }
  double flops_per_step() const override { return 6.0 * (double)model_->config().num_params() * B_; }
  size_t activation_bytes() const override {
    size_t w = train_.D;
    for (int h : cfg_.hidden) w += h;
    return (w + 10) * layout_.micro_size() * sizeof(float);
  }
  std::map<std::string, std::string> metadata() const override { return model_->config().to_metadata(); }

 private:
  MlpTaskConfig cfg_;
  BatchLayout layout_;
  data::LabeledImages train_, val_;
  int B_ = 0;
  std::optional<SafetensorsReader> init_;
  nn::ParamRegistry params_;
  std::unique_ptr<model::Mlp> model_;
  nn::ActivationStore store_;
  std::vector<float> xb_;
  std::vector<int32_t> yb_;
};

}  // namespace

MlpTaskConfig MlpTaskConfig::from(const TrainConfig& cfg) {
  return {cfg.hidden,         cfg.data, cfg.labels,     cfg.val_data, cfg.val_labels,
          cfg.init,           cfg.val_fraction, cfg.batch_size, cfg.seed, cfg.precision};
}

std::unique_ptr<TrainTask> make_mlp_task(const MlpTaskConfig& cfg, const BatchLayout& layout) {
  return std::make_unique<MlpTask>(cfg, layout);
}

std::unique_ptr<TrainTask> make_mlp_task(const TrainConfig& cfg, const BatchLayout& layout, const TaskGroups&) {
  return make_mlp_task(MlpTaskConfig::from(cfg), layout);
}

}  // namespace mt::train
