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
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/partition.h"
#include "train/task.h"

namespace mt::train {

model::GptConfig gpt_shape(const TrainConfig& cfg, const SafetensorsReader* init) {
  if (init) return checkpoint::gpt_config_from_file(*init, cfg.gpt);
  model::GptConfig shape = cfg.gpt;
  if (!shape.n_layer) shape.n_layer = 4;
  if (!shape.n_head) shape.n_head = 4;
  if (!shape.n_embd) shape.n_embd = 128;
  if (!shape.vocab_size) shape.vocab_size = 256;
  if (!shape.n_positions) shape.n_positions = std::max(256, cfg.seq_len);
  shape.validate();
  return shape;
}

std::vector<int> stage_split(const TrainConfig& cfg, const model::GptConfig& shape, int stages) {
  if (!cfg.stage_layers.empty()) {
    pipeline::check_stage_layers(cfg.stage_layers, stages, shape.n_layer);
    return cfg.stage_layers;
  }
  // Forward FLOPs per token (the backward is about twice each, the same ratio everywhere): a block's four
  // weight products and attention's two T x C products; the last stage adds the logits product.
  const double C = shape.n_embd, T = cfg.seq_len;
  const double block = 2 * 12 * C * C + 4 * T * C, head = 2 * C * shape.vocab_size;
  return pipeline::balance_layers(std::vector<double>(shape.n_layer, block), stages, 0.0, head);
}

namespace {

class GptTask : public TrainTask {
 public:
  GptTask(const TrainConfig& cfg, const BatchLayout& layout, nn::TensorParallelOps* tp, const PipelineContext* pp)
      : cfg_(cfg), layout_(layout), shard_(cfg.data) {
    std::optional<SafetensorsReader> init;
    if (!cfg.init.empty()) init.emplace(cfg.init);
    model::GptConfig shape = gpt_shape(cfg, init ? &*init : nullptr);
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
    if (pp && pp->spec.stages > 1) {
      // Chunk c of pipeline rank j is global stage c*p + j; the stages hold consecutive runs of blocks.
      pp_ = *pp;
      const int P = pp->spec.stages, V = pp->spec.virtual_stages, S = P * V, j = pp->group->rank();
      split_ = stage_split(cfg, shape, S);
      std::vector<int> first(S + 1, 0);
      for (int s = 0; s < S; s++) first[s + 1] = first[s] + split_[s];
      for (int c = 0; c < V; c++) {
        int s = c * P + j;
        chunks_.push_back(std::make_unique<model::Gpt>(shape, params_, tp, model::StageRange{first[s], first[s + 1], s, S}));
        chunks_.back()->set_recompute(cfg.recompute);
        chunks_.back()->set_sequence_parallel(cfg.sequence_parallel);
      }
      model_ = chunks_.front().get();
    } else {
      chunks_.push_back(std::make_unique<model::Gpt>(shape, params_, tp));
      chunks_.back()->set_recompute(cfg.recompute);
      chunks_.back()->set_sequence_parallel(cfg.sequence_parallel);
      model_ = chunks_.front().get();
    }
    if (init) {  // against the whole model: a pipeline stage or tensor shard holds only part of it
      nn::ParamRegistry whole;
      model::Gpt(shape, whole);
      checkpoint::check_tensors(*init, whole);
    }
    init_ = std::move(init);
  }

  nn::ParamRegistry& params() override { return params_; }
  void declare_full(nn::ParamRegistry& full) const override { model::Gpt(model_->config(), full); }

  void init_param(nn::Param& p) override {
    if (init_)
      checkpoint::load_param(*init_, p);
    else
      model_->init_param(p, cfg_.seed);
  }

  void prepare() override {}

  // One pipeline rank's chunks, as the executor sees them.
  struct Runner : pipeline::StageRunner {
    GptTask& t;
    int64_t step;
    int first, mbs;
    float dscale;
    double loss = 0;
    Runner(GptTask& task, int64_t s, int f, int m, float d) : t(task), step(s), first(f), mbs(m), dscale(d) {}
    size_t activation_count() const override {
      return (size_t)t.model_->rows_here(mbs * t.T_) * t.model_->config().n_embd;
    }
    const float* forward(int c, int i, const float* input) override {
      model::Gpt& g = *t.chunks_[c];
      const int key = i * t.pp_.spec.virtual_stages + c;
      t.inputs_.resize((size_t)mbs * t.T_);
      t.targets_.resize((size_t)mbs * t.T_);
      data::gpt_batch(t.shard_, step, t.B_, t.T_, first + i * mbs, mbs, t.inputs_.data(), t.targets_.data());
      loss += g.forward(t.store_, key, t.inputs_.data(), t.targets_.data(), mbs, t.T_, dscale, nullptr, input);
      return g.last_stage() ? nullptr : g.stage_output(t.store_, key, mbs, t.T_);
    }
    const float* backward(int c, int i, const float* dout) override {
      model::Gpt& g = *t.chunks_[c];
      const int key = i * t.pp_.spec.virtual_stages + c;
      g.backward(t.store_, key, mbs, t.T_, nullptr, dout);
      t.store_.release(key);  // the executor copied this micro-batch's output when it sent it
      return g.first_stage() ? nullptr : g.stage_input_grad(t.store_, mbs, t.T_);
    }
  };

  double forward_backward(int64_t step, const BatchShare& share, const StepHooks& hooks) override {
    const float dscale = 1.0f / (float)((int64_t)B_ * T_);
    if (pp_.group) {
      if (lists_.empty()) lists_ = pipeline::make_schedule(pp_.spec);
      Runner r(*this, step, share.first, share.micro_size, dscale);
      executor_.run(pp_.spec, lists_[pp_.group->rank()], *pp_.group, r, &stats_, trace_);
      return r.loss;
    }
    inputs_.resize((size_t)share.micro_size * T_);
    targets_.resize((size_t)share.micro_size * T_);
    double loss = 0.0;
    for (int i = 0; i < share.micro_count; i++) {
      const int j0 = share.micro_first(i), nb = share.micro_len(i);
      if (hooks.micro_batch) hooks.micro_batch(i, share.micro_count);
      data::gpt_batch(shard_, step, B_, T_, j0, nb, inputs_.data(), targets_.data());
      loss += model_->forward(store_, 0, inputs_.data(), targets_.data(), nb, T_, dscale, hooks.params);
      model_->backward(store_, 0, nb, T_, hooks.params);
    }
    return loss;
  }

  bool has_eval() const override { return val_.has_value(); }

  // Batch k of the held-out shard follows the training rule with step k; windows split across ranks. Under a
  // pipeline each micro-batch flows through the stages forward only; the loss is on the last stage's rank.
  EvalSums evaluate(int batches, int rank, int nranks, nn::ParamHooks* hooks) override {
    EvalSums r;
    if (!val_) return r;
    MT_ASSERT(nranks == layout_.dp_ranks(), "evaluation over ", nranks, " ranks, layout of ", layout_.dp_ranks());
    const BatchShare sh = layout_.eval_share(rank);
    inputs_.resize((size_t)sh.micro_size * T_);
    targets_.resize((size_t)sh.micro_size * T_);
    for (int k = 0; k < batches; k++) {
      for (int i = 0; i < sh.micro_count; i++) {
        const int j0 = sh.micro_first(i), nb = sh.micro_len(i);
        data::gpt_batch(*val_, k, B_, T_, j0, nb, inputs_.data(), targets_.data());
        if (pp_.group) {
          r.loss += pipeline_forward(nb);
          if (chunks_.back()->last_stage()) r.count += (double)nb * T_;
        } else {
          r.loss += model_->forward(store_, 0, inputs_.data(), targets_.data(), nb, T_, 0.0f, hooks);
          r.count += (double)nb * T_;
        }
      }
    }
    return r;
  }

  // One micro-batch (inputs_/targets_, nb windows) forward through every stage in order; returns the loss
  // sum on the rank holding the last stage, 0 elsewhere. Each rank runs its chunks in stage order: receive
  // the input from the previous stage's rank, forward, send the output on (non-blocking; waited before the
  // next micro-batch reuses the buffers).
  double pipeline_forward(int nb) {
    comm::Communicator& g = *pp_.group;
    const int P = pp_.spec.stages, S = P * pp_.spec.virtual_stages, j = g.rank();
    const size_t n = (size_t)model_->rows_here(nb * T_) * model_->config().n_embd;
    constexpr int kEvalTag = 1 << 24;  // above every training tag (kind, micro-batch, stage)
    double loss = 0;
    std::vector<comm::Request> sends;
    eval_in_.resize(n);
    for (int s = j; s < S; s += P) {
      model::Gpt& m = *chunks_[s / P];
      const int key = kEvalKey - s;
      if (s > 0) g.recv(eval_in_.data(), n, comm::DType::f32, (s - 1) % P, kEvalTag + s);
      loss += m.forward(store_, key, inputs_.data(), targets_.data(), nb, T_, 0.0f, nullptr,
                        s > 0 ? eval_in_.data() : nullptr);
      if (s < S - 1) sends.push_back(g.isend(m.stage_output(store_, key, nb, T_), n, comm::DType::f32, (s + 1) % P,
                                             kEvalTag + s + 1));
    }
    comm::wait_all(sends);
    for (int s = j; s < S; s += P) store_.release(kEvalKey - s);
    return loss;
  }

  bool is_classifier() const override { return false; }
  int global_batch() const override { return B_; }
  int64_t items_per_window() const override { return T_; }
  const char* item_name() const override { return "tok"; }
  double flops_per_step() const override { return model_->config().flops_per_token(T_) * (double)B_ * T_; }
  size_t activation_bytes() const override { return model_->activation_bytes(layout_.micro_size(), T_); }
  std::map<std::string, std::string> metadata() const override { return model_->config().to_metadata(); }
  size_t activation_peak_bytes() const override { return store_.peak_live_bytes(); }
  pipeline::PipelineStats* pipeline_stats() override { return pp_.group ? &stats_ : nullptr; }
  std::vector<int> stage_layers() const override { return split_; }
  void set_trace(trace::ChromeTrace* t) override { trace_ = t; }

 private:
  TrainConfig cfg_;
  BatchLayout layout_;
  TokenShard shard_;
  std::optional<TokenShard> val_;
  int B_ = 0, T_ = 0;
  std::optional<SafetensorsReader> init_;
  nn::ParamRegistry params_;
  std::vector<std::unique_ptr<model::Gpt>> chunks_;  // one, or this pipeline rank's V chunks
  model::Gpt* model_ = nullptr;
  PipelineContext pp_;  // group null: no pipeline
  std::vector<std::vector<pipeline::Action>> lists_;
  nn::ActivationStore store_;
  std::vector<int32_t> inputs_, targets_;
  static constexpr int kEvalKey = -1000;  // store keys of evaluation micro-batches (per stage: kEvalKey - s)
  std::vector<float> eval_in_;
  std::vector<int> split_;  // blocks per global stage (pipeline only)
  pipeline::PipelineStats stats_;
  pipeline::PipelineExecutor executor_;
  trace::ChromeTrace* trace_ = nullptr;
};

}  // namespace

std::unique_ptr<TrainTask> make_gpt_task(const TrainConfig& cfg, const BatchLayout& layout,
                                         nn::TensorParallelOps* tp, const PipelineContext* pp) {
  return std::make_unique<GptTask>(cfg, layout, tp, pp);
}

}  // namespace mt::train
