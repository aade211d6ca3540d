// The GPT language-model task: a token shard, the global-batch rule of data/batch.h, micro-batches
// accumulated within the step.
#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"
#include "core/error.h"
#include "data/batch.h"
#include "data/token_shard.h"
#include "model/gpt.h"
#include "nn/activation_store.h"
#include "train/task.h"

namespace mt::train {

namespace {

class GptTask : public TrainTask {
 public:
  explicit GptTask(const TrainConfig& cfg) : cfg_(cfg), shard_(cfg.data) {
    model::GptConfig shape = cfg.gpt;
    std::optional<SafetensorsReader> init;
    if (!cfg.init.empty()) {
      init.emplace(cfg.init);
      shape = checkpoint::gpt_config_from_file(*init, cfg.gpt);
    } else {
      if (!shape.n_layer) shape.n_layer = 4;
      if (!shape.n_head) shape.n_head = 4;
      if (!shape.n_embd) shape.n_embd = 128;
      if (!shape.vocab_size) shape.vocab_size = 256;
      if (!shape.n_positions) shape.n_positions = std::max(256, cfg.seq_len);
      shape.validate();
    }
    B_ = cfg.batch_size;
    T_ = cfg.seq_len;
    MT_CHECK_INPUT(T_ <= shape.n_positions, "--seq-len ", T_, " exceeds the model's n_positions ",
                   shape.n_positions);
    shard_.check_vocab(shape.vocab_size);
    MT_CHECK_INPUT(shard_.size() >= (int64_t)B_ * T_ + 1, cfg.data, " has ", shard_.size(),
                   " tokens; a batch of --batch-size ", B_, " x --seq-len ", T_, " needs at least ",
                   (int64_t)B_ * T_ + 1);
    if (!cfg.val_data.empty()) {
      val_.emplace(cfg.val_data);
      val_->check_vocab(shape.vocab_size);
      MT_CHECK_INPUT(val_->size() >= (int64_t)T_ + 1, cfg.val_data, " has ", val_->size(),
                     " tokens; one evaluation window of --seq-len ", T_, " needs ", T_ + 1);
    }
    mbs_ = cfg.micro_batch_size > 0 ? cfg.micro_batch_size : B_;
    model_ = std::make_unique<model::Gpt>(shape, params_);
    params_.finalize();
    if (init)
      checkpoint::load_params(*init, params_);
    else
      model_->init_gpt2(cfg.seed);
    inputs_.resize((size_t)mbs_ * T_);
    targets_.resize((size_t)mbs_ * T_);
  }

  nn::ParamRegistry& params() override { return params_; }

  double forward_backward(int64_t step) override {
    params_.zero_grad();
    const float dscale = 1.0f / (float)((int64_t)B_ * T_);
    double loss = 0.0;
    for (int j0 = 0; j0 < B_; j0 += mbs_) {
      int nb = std::min(mbs_, B_ - j0);
      data::gpt_batch(shard_, step, B_, T_, j0, nb, inputs_.data(), targets_.data());
      loss += model_->forward(store_, 0, inputs_.data(), targets_.data(), nb, T_, dscale);
      model_->backward(store_, 0, nb, T_);
    }
    return loss / ((double)B_ * T_);
  }

  bool has_eval() const override { return val_.has_value(); }

  EvalResult evaluate(int batches) override {
    EvalResult r;
    if (!val_) return r;
    double total = 0.0;
    int64_t count = 0;
    for (int k = 0; k < batches; k++) {
      for (int j0 = 0; j0 < B_; j0 += mbs_) {
        int nb = std::min(mbs_, B_ - j0);
        data::gpt_batch(*val_, k, B_, T_, j0, nb, inputs_.data(), targets_.data());
        total += model_->forward(store_, 0, inputs_.data(), targets_.data(), nb, T_, 0.0f);
        count += (int64_t)nb * T_;
      }
    }
    r.loss = total / (double)count;
    return r;
  }

  int64_t items_per_step() const override { return (int64_t)B_ * T_; }
  const char* item_name() const override { return "tok"; }
  double flops_per_step() const override { return model_->config().flops_per_token(T_) * (double)B_ * T_; }
  size_t activation_bytes() const override { return model_->activation_bytes(mbs_, T_); }
  std::map<std::string, std::string> metadata() const override { return model_->config().to_metadata(); }

 private:
  TrainConfig cfg_;
  TokenShard shard_;
  std::optional<TokenShard> val_;
  int B_ = 0, T_ = 0, mbs_ = 0;
  nn::ParamRegistry params_;
  std::unique_ptr<model::Gpt> model_;
  nn::ActivationStore store_;
  std::vector<int32_t> inputs_, targets_;
};

}  // namespace

std::unique_ptr<TrainTask> make_gpt_task(const TrainConfig& cfg) { return std::make_unique<GptTask>(cfg); }

}  // namespace mt::train
