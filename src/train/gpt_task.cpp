// The GPT language-model task: a token shard, the global-batch rule of data/batch.h, micro-batches
// accumulated within the step.
#include <algorithm>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"
#include "core/error.h"
#include "data/batch.h"
#include "data/token_shard.h"
#include "model/gpt.h"
#include "nn/activation_store.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/schedule_generator.h"
#include "train/model_registry.h"
#include "train/replicas.h"
#include "train/task.h"

namespace mt::train {

bool local_experts(const TrainConfig& cfg) { return model_entry(cfg.model).has_router && cfg.moe.ep > 1; }

GptTaskConfig GptTaskConfig::from(const TrainConfig& cfg) {
  model::MoeOptions moe;
  moe.capacity_factor = cfg.moe.capacity_factor;
  moe.group_windows = cfg.moe.group_windows;
  moe.second = cfg.moe.second_policy;
  moe.aux_alpha = (float)cfg.moe.aux_loss;
  moe.z_beta = (float)cfg.moe.z_loss;
  moe.seed = cfg.seed;
  // Experts held by their ranks only (their own gradient group, grad_sync.h).
  moe.local_experts = local_experts(cfg);
  // A resumed run takes its shape from the checkpoint's weights the way --init does (gpt_shape), so a shape
  // flag that disagrees with them is refused by name, n_head included (no tensor shape shows it).
  const std::string init =
      cfg.resume.empty() ? cfg.init : checkpoint::resolve_checkpoint(cfg.resume) + "/model.safetensors";
  return {cfg.gpt,          cfg.data,    cfg.val_data,  init,
          cfg.batch_size,   cfg.seq_len, cfg.recompute, cfg.sequence_parallel,
          cfg.stage_layers, cfg.seed,    moe,           cfg.moe.ep, cfg.precision};
}

model::GptConfig gpt_shape(const GptTaskConfig& cfg, const SafetensorsReader* init) {
  if (init) return checkpoint::gpt_config_from_file(*init, cfg.flags);
  model::GptConfig shape = cfg.flags;
  if (!shape.n_layer) shape.n_layer = 4;
  if (!shape.n_head) shape.n_head = 4;
  if (!shape.n_embd) shape.n_embd = 128;
  if (!shape.vocab_size) shape.vocab_size = 256;
  if (!shape.n_positions) shape.n_positions = std::max(256, cfg.seq_len);
  if (shape.moe_every > 0 && !shape.moe_top_k) shape.moe_top_k = 1;
  if (shape.moe_every == 0) shape.experts = shape.moe_top_k = shape.expert_hidden = 0;
  shape.validate();
  return shape;
}

std::vector<int> stage_split(const GptTaskConfig& cfg, const model::GptConfig& shape, int stages) {
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

std::set<std::string> tied_tensors(const model::GptConfig& shape, const std::vector<int>& first) {
  const int S = (int)first.size() - 1;
  nn::ParamRegistry head, tail;
  model::Gpt(shape, head, nullptr, model::StageRange{first[0], first[1], 0, S});
  model::Gpt(shape, tail, nullptr, model::StageRange{first[S - 1], first[S], S - 1, S});
  return common_tensors(head, tail);
}

namespace {

class GptTask : public TrainTask {
 public:
  GptTask(const GptTaskConfig& cfg, const BatchLayout& layout, nn::TensorParallelOps* tp, const PipelineContext* pp,
          nn::ExpertParallelOps* ep)
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
    moe_ = cfg.moe;
    moe_.ep = ep;
    if (pp && pp->spec.stages > 1) {
      // Chunk c of pipeline rank j computes the stage the schedule's placement gives it; the stages hold
      // consecutive runs of blocks.
      pp_ = *pp;
      const pipeline::Placement& place = pp->schedule.placement;
      MT_CHECK_INPUT(place.routes() <= 2, "pipeline schedule ", pp->spec.name, " holds every stage ", place.routes(),
                     " times; training runs placements that hold each stage once or twice (chimera)");
      const int V = pp->spec.virtual_stages, S = place.stages(), j = pp->group->rank();
      split_ = stage_split(cfg, shape, S);
      std::vector<int> first(S + 1, 0);
      for (int s = 0; s < S; s++) first[s + 1] = first[s] + split_[s];
      bool holds_first = false;
      // Declared in ascending stage order (the registry's groups ascend; chimera's upper ranks hold their lower
      // stage in chunk 1), kept by chunk.
      std::vector<int> by_stage(V);
      for (int c = 0; c < V; c++) by_stage[c] = c;
      std::sort(by_stage.begin(), by_stage.end(),
                [&](int a, int b) { return place.stage_of(j, a) < place.stage_of(j, b); });
      chunks_.resize(V);
      for (int c : by_stage) {
        const int s = place.stage_of(j, c);
        holds_first = holds_first || s == 0;
        chunks_[c] =
            std::make_unique<model::Gpt>(shape, params_, tp, model::StageRange{first[s], first[s + 1], s, S}, moe_);
        chunks_[c]->set_recompute(cfg.recompute);
        chunks_[c]->set_sequence_parallel(cfg.sequence_parallel);
        chunks_[c]->set_precision(cfg.precision);
      }
      model_ = chunks_.front().get();
      // The tied wte is two copies summed over the tie group when the first and the last stage are on two ranks;
      // one tensor when they are on one (a V-shaped placement: both chunks use the registry's one wte).
      const bool ends_apart = place.slot(0, 0).rank != place.slot(0, S - 1).rank;
      if (place.routes() == 2) {
        // Two pipelines (chimera): rank j's chunk 0 is the down pipeline's stage j, whose tensors count here;
        // the tied wte counts on rank 0 only (rank p - 1's chunk 0 holds it for the logits).
        nn::ParamRegistry down;
        const int s0 = place.stage_of(j, 0);
        model::Gpt(shape, down, tp, model::StageRange{first[s0], first[s0 + 1], s0, S}, moe_);
        std::set<std::string> mine;
        const std::set<std::string> tied = tied_tensors(shape, first);
        for (const nn::Param& x : down.params())
          if (s0 == 0 || !tied.count(x.name)) mine.insert(x.name);
        set_mirror_facts(params_, tp ? tp->rank() : 0, tp ? tp->size() : 1, mine);
      } else {
        set_replica_facts(params_, tp ? tp->rank() : 0, tp ? tp->size() : 1,
                          ends_apart ? tied_tensors(shape, first) : std::set<std::string>{}, holds_first);
      }
    } else {
      chunks_.push_back(std::make_unique<model::Gpt>(shape, params_, tp, model::StageRange{}, moe_));
      chunks_.back()->set_recompute(cfg.recompute);
      chunks_.back()->set_sequence_parallel(cfg.sequence_parallel);
      chunks_.back()->set_precision(cfg.precision);
      model_ = chunks_.front().get();
      set_replica_facts(params_, tp ? tp->rank() : 0, tp ? tp->size() : 1, {}, true);
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

  // One pipeline rank's chunks for one training step, as the executor sees them; hooks (may be null) are the
  // parameter store's, called around each group's use in every forward and backward (ZeRO 2 and 3).
  struct Runner : TaskStageRunner {
    GptTask& t;
    int64_t step;
    int first, mbs;
    float dscale;
    nn::ParamHooks* hooks;
    Runner(GptTask& task, int64_t s, int f, int m, float d, nn::ParamHooks* h)
        : t(task), step(s), first(f), mbs(m), dscale(d), hooks(h) {}
    size_t activation_count() const override {
      return (size_t)t.model_->rows_here(mbs * t.T_) * t.model_->config().n_embd;
    }
    const float* forward(int c, int i, const float* input) override {
      run_forward(c, i, input, nullptr);
      model::Gpt& g = *t.chunks_[c];
      return g.last_stage() ? nullptr : g.stage_output(t.store_, i * t.pp_.spec.virtual_stages + c, mbs, t.T_);
    }
    // The stage's output written straight into the executor's message buffer (model::Gpt::forward's output_into).
    bool forward_into(int c, int i, const float* input, float* out) override {
      if (!t.chunks_[c]->output_into_applies()) return false;
      run_forward(c, i, input, out);
      return true;
    }
    void run_forward(int c, int i, const float* input, float* out) {
      model::Gpt& g = *t.chunks_[c];
      const int key = i * t.pp_.spec.virtual_stages + c;
      t.inputs_.resize((size_t)mbs * t.T_);
      t.targets_.resize((size_t)mbs * t.T_);
      data::gpt_batch(t.shard_, step, t.B_, t.T_, first + i * mbs, mbs, t.inputs_.data(), t.targets_.data());
      g.set_moe_position(step, first + i * mbs);
      loss += g.forward(t.store_, key, t.inputs_.data(), t.targets_.data(), mbs, t.T_, dscale, hooks, input, out);
    }
    const float* backward(int c, int i, const float* dout) override {
      model::Gpt& g = *t.chunks_[c];
      const int key = i * t.pp_.spec.virtual_stages + c;
      g.backward(t.store_, key, mbs, t.T_, hooks, dout);
      t.store_.release(key);  // the executor copied this micro-batch's output when it sent it
      return g.first_stage() ? nullptr : g.stage_input_grad(t.store_, mbs, t.T_);
    }
    // The split backward (zero-bubble schedules): the input half keeps what the weight half reads under the
    // micro-batch's key, which the weight half releases.
    const float* backward_input(int c, int i, const float* dout) override {
      model::Gpt& g = *t.chunks_[c];
      const int key = i * t.pp_.spec.virtual_stages + c;
      g.backward_input(t.store_, key, mbs, t.T_, hooks, dout);
      return g.first_stage() ? nullptr : g.stage_input_grad(t.store_, mbs, t.T_);
    }
    void backward_weight(int c, int i) override {
      model::Gpt& g = *t.chunks_[c];
      const int key = i * t.pp_.spec.virtual_stages + c;
      g.backward_weight(t.store_, key, mbs, t.T_, hooks);
      t.store_.release(key);
    }
  };

  std::unique_ptr<TaskStageRunner> stage_runner(int64_t step, const BatchShare& share, nn::ParamHooks* hooks) override {
    if (!pp_.group) return nullptr;
    return std::make_unique<Runner>(*this, step, share.first, share.micro_size(), dscale(), hooks);
  }

  void begin_step(int64_t) override {
    for (auto& c : chunks_)
      for (auto& m : c->moe_layers())
        if (m) m->stats().reset(m->experts());
  }

  double micro_batch(int64_t step, int first, int count, nn::ParamHooks* hooks) override {
    inputs_.resize((size_t)count * T_);
    targets_.resize((size_t)count * T_);
    data::gpt_batch(shard_, step, B_, T_, first, count, inputs_.data(), targets_.data());
    model_->set_moe_position(step, first);
    const double loss = model_->forward(store_, 0, inputs_.data(), targets_.data(), count, T_, dscale(), hooks);
    model_->backward(store_, 0, count, T_, hooks);
    return loss;
  }

  // 1 / tokens in the global batch: the gradient of the global mean.
  float dscale() const { return 1.0f / (float)((int64_t)B_ * T_); }

  bool has_eval() const override { return val_.has_value(); }

  // Batch k of the held-out shard follows the training rule with step k; windows split across ranks. Under a
  // pipeline the executor runs a forward-only schedule (pipeline::forward_only); the loss is on the rank of
  // the last stage.
  EvalSums evaluate(int batches, int rank, int nranks, nn::ParamHooks* hooks) override {
    EvalSums r;
    if (!val_) return r;
    MT_ASSERT(nranks == layout_.dp_ranks(), "evaluation over ", nranks, " ranks, layout of ", layout_.dp_ranks());
    const BatchShare sh = layout_.eval_share(rank);
    MoeRecording off(chunks_);  // held-out routing is not the step's
    for (int k = 0; k < batches; k++) {
      if (pp_.group) {
        const auto [loss, count] = pipeline_evaluate(k, sh, hooks);
        r.loss += loss;
        r.count += count;
        continue;
      }
      inputs_.resize((size_t)sh.micro_size() * T_);
      targets_.resize((size_t)sh.micro_size() * T_);
      for (int i = 0; i < sh.micro_count(); i++) {
        const int j0 = sh.micro_first(i), nb = sh.micro_len(i);
        data::gpt_batch(*val_, k, B_, T_, j0, nb, inputs_.data(), targets_.data());
        model_->set_moe_position(k, j0);
        r.loss += model_->forward(store_, 0, inputs_.data(), targets_.data(), nb, T_, 0.0f, hooks);
        r.count += (double)nb * T_;
      }
    }
    return r;
  }

  // One pipeline rank's chunks running evaluation batch k forward only. Store keys kEvalKey - (i V + c); a
  // chunk's previous micro-batch is released when the next one starts (the executor copied its output into
  // the message when it sent it). hooks: the parameter store's (ZeRO 3 gathers each group around its use).
  struct EvalRunner : pipeline::StageRunner {
    GptTask& t;
    int64_t batch;
    BatchShare sh;
    nn::ParamHooks* hooks;
    double loss = 0, count = 0;
    EvalRunner(GptTask& task, int64_t k, const BatchShare& share, nn::ParamHooks* h)
        : t(task), batch(k), sh(share), hooks(h) {}
    int key(int c, int i) const { return kEvalKey - (i * t.pp_.spec.virtual_stages + c); }
    size_t activation_count() const override {
      return (size_t)t.model_->rows_here(sh.micro_size() * t.T_) * t.model_->config().n_embd;
    }
    const float* forward(int c, int i, const float* input) override {
      if (i > 0) t.store_.release(key(c, i - 1));
      model::Gpt& g = *t.chunks_[c];
      const int nb = sh.micro_len(i);
      t.inputs_.resize((size_t)nb * t.T_);
      t.targets_.resize((size_t)nb * t.T_);
      data::gpt_batch(*t.val_, batch, t.B_, t.T_, sh.micro_first(i), nb, t.inputs_.data(), t.targets_.data());
      g.set_moe_position(batch, sh.micro_first(i));
      loss += g.forward(t.store_, key(c, i), t.inputs_.data(), t.targets_.data(), nb, t.T_, 0.0f, hooks, input);
      if (g.last_stage()) count += (double)nb * t.T_;  // the rank ending micro-batch i's route holds its loss
      return g.last_stage() ? nullptr : g.stage_output(t.store_, key(c, i), nb, t.T_);
    }
    const float* backward(int, int, const float*) override {
      MT_ASSERT(false, "an evaluation schedule has no backward");
      return nullptr;
    }
  };

  // The loss summed over the micro-batches whose last stage is on this rank, and their token count.
  std::pair<double, double> pipeline_evaluate(int64_t k, const BatchShare& sh, nn::ParamHooks* hooks) {
    if (sh.micro_count() == 0) return {0.0, 0.0};
    // Messages have one shape per schedule: every micro-batch is whole (the layout's even split).
    MT_ASSERT(sh.micro_len(sh.micro_count() - 1) == sh.micro_size(), "evaluation micro-batches of unequal size");
    pipeline::ScheduleSpec spec = pp_.spec;
    spec.micro_batches = sh.micro_count();
    if (eval_lists_.size() == 0) eval_lists_ = pipeline::forward_only(pp_.schedule.placement, spec.micro_batches);
    EvalRunner r(*this, k, sh, hooks);
    executor_.run(spec, eval_lists_, *pp_.group, r);
    for (int c = 0; c < spec.virtual_stages; c++) store_.release(r.key(c, sh.micro_count() - 1));
    return {r.loss, r.count};
  }

  bool is_classifier() const override { return false; }
  int global_batch() const override { return B_; }
  int64_t items_per_window() const override { return T_; }
  const char* item_name() const override { return "tok"; }
  double flops_per_step() const override { return model_->config().flops_per_token(T_) * (double)B_ * T_; }
  size_t activation_bytes() const override { return model_->activation_bytes(layout_.micro_size(), T_); }
  size_t backward_scratch_bytes() const override { return model_->backward_scratch_bytes(layout_.micro_size(), T_); }
  size_t product_scratch_bytes() const override { return model_->product_scratch_bytes(layout_.micro_size(), T_); }
  std::map<std::string, std::string> metadata() const override { return model_->config().to_metadata(); }
  size_t activation_peak_bytes() const override { return store_.peak_live_bytes(); }
  int activation_peak_micro_batches() const override { return store_.peak_live_keys(); }
  size_t activation_peak_micro_batch_bytes() const override { return store_.peak_key_bytes(); }
  nn::ActivationStore* activation_store() override { return &store_; }
  std::vector<int> stage_layers() const override { return split_; }
  void set_trace(trace::ChromeTrace* t) override {
    for (auto& c : chunks_)
      for (auto& m : c->moe_layers())
        if (m) m->set_trace(t);
  }
  void annotate(nlohmann::json& row, const parallel::Mesh& mesh) override;
  nlohmann::json summary_section(const parallel::Mesh& mesh) override;

 private:
  // Turns the MoE layers' statistics off for a scope (evaluation).
  struct MoeRecording {
    std::vector<std::unique_ptr<model::Gpt>>& chunks;
    explicit MoeRecording(std::vector<std::unique_ptr<model::Gpt>>& c) : chunks(c) { set(false); }
    ~MoeRecording() { set(true); }
    void set(bool on) {
      for (auto& c : chunks)
        for (auto& m : c->moe_layers())
          if (m) m->set_recording(on);
    }
  };
  // Per MoE layer of the whole model, this step's routing summed over the ranks that split the batch.
  std::vector<std::vector<double>> moe_step_totals(const parallel::Mesh& mesh);
  model::MoeOptions moe_;
  std::vector<std::vector<double>> moe_run_;  // per layer: the step totals summed over the run
  int64_t moe_steps_ = 0;
  GptTaskConfig cfg_;
  BatchLayout layout_;
  TokenShard shard_;
  std::optional<TokenShard> val_;
  int B_ = 0, T_ = 0;
  std::optional<SafetensorsReader> init_;
  nn::ParamRegistry params_;
  std::vector<std::unique_ptr<model::Gpt>> chunks_;  // one, or this pipeline rank's V chunks
  model::Gpt* model_ = nullptr;
  PipelineContext pp_;  // group null: no pipeline
  nn::ActivationStore store_;
  std::vector<int32_t> inputs_, targets_;
  static constexpr int kEvalKey = -1000;  // store keys of evaluation micro-batches (see EvalRunner)
  pipeline::Schedule eval_lists_;
  std::vector<int> split_;  // blocks per global stage (pipeline only)
  pipeline::PipelineExecutor executor_;  // evaluation's forward-only lists
};

// Layout of one MoE layer's numbers: aux_sum, z_sum, choices, dropped, exchange bytes, exchange seconds,
// then admitted[E] and first[E]. Layers without experts (or on other stages) are zeros.
constexpr int kMoeFixed = 6;

std::vector<std::vector<double>> GptTask::moe_step_totals(const parallel::Mesh& mesh) {
  const model::GptConfig& g = model_->config();
  const int L = g.n_layer, E = g.experts, W = kMoeFixed + 2 * E;
  std::vector<float> v((size_t)L * W, 0.0f);
  const bool counts = mesh.coord().tp == 0;  // replicated over tp: one copy counts
  for (auto& c : chunks_)
    for (int l = 0; l < L; l++) {
      nn::MoeMlp* m = c->moe_layers().empty() ? nullptr : c->moe_layers()[l].get();
      if (!m || !counts) continue;
      const nn::MoeStats& st = m->stats();
      float* o = &v[(size_t)l * W];
      o[0] = (float)st.aux_sum, o[1] = (float)st.z_sum, o[2] = (float)st.choices, o[3] = (float)st.dropped;
      o[4] = (float)st.exchange_bytes, o[5] = (float)st.exchange_s;
      for (int e = 0; e < E; e++) o[kMoeFixed + e] = (float)st.admitted[e], o[kMoeFixed + E + e] = (float)st.first[e];
    }
  for (comm::Communicator* grp : {mesh.replica(), mesh.dp()})
    if (grp && grp->size() > 1) grp->all_reduce(v.data(), v.data(), v.size(), comm::DType::f32, comm::ReduceOp::sum);
  std::vector<std::vector<double>> out;
  for (int l = 0; l < L; l++)
    if (g.is_moe(l)) out.emplace_back(v.begin() + (size_t)l * W, v.begin() + (size_t)(l + 1) * W);
  return out;
}

namespace {
// Metrics of one layer's (or a run's) totals: groups and tokens of the batches they cover.
nlohmann::json moe_layer_json(int layer, const std::vector<double>& t, int E, double groups, double tokens) {
  double admitted = 0;
  for (int e = 0; e < E; e++) admitted += t[kMoeFixed + e];
  std::vector<double> frac(E), first(E);
  for (int e = 0; e < E; e++) {
    frac[e] = admitted > 0 ? t[kMoeFixed + e] / admitted : 0.0;
    first[e] = tokens > 0 ? t[kMoeFixed + E + e] / tokens : 0.0;
  }
  return {{"layer", layer},
          {"aux_loss", t[0] / groups},
          {"z_loss", t[1] / tokens},
          {"dropped", t[2] > 0 ? t[3] / t[2] : 0.0},
          {"expert_fraction", frac},
          {"first_choice_fraction", first},
          {"all_to_all_bytes", t[4]},
          {"all_to_all_s", t[5]}};
}
}  // namespace

void GptTask::annotate(nlohmann::json& row, const parallel::Mesh& mesh) {
  const model::GptConfig& g = model_->config();
  if (g.moe_every == 0) return;
  const std::vector<std::vector<double>> t = moe_step_totals(mesh);
  const double tokens = (double)B_ * T_, groups = (double)B_ / moe_.group_windows;
  double aux = 0, z = 0, choices = 0, dropped = 0;
  nlohmann::json layers = nlohmann::json::array();
  int i = 0;
  if (moe_run_.empty()) moe_run_.assign(t.size(), std::vector<double>(t.empty() ? 0 : t[0].size(), 0.0));
  for (int l = 0; l < g.n_layer; l++) {
    if (!g.is_moe(l)) continue;
    const std::vector<double>& x = t[i];
    aux += x[0] / groups, z += x[1] / tokens, choices += x[2], dropped += x[3];
    layers.push_back(moe_layer_json(l, x, g.experts, groups, tokens));
    for (size_t k = 0; k < x.size(); k++) moe_run_[i][k] += x[k];
    i++;
  }
  row["aux_loss"] = aux;  // summed over MoE layers, before the coefficients
  row["z_loss"] = z;
  row["moe_dropped"] = choices > 0 ? dropped / choices : 0.0;
  row["moe"] = layers;
  moe_steps_++;
  for (auto& c : chunks_)  // the next step's record starts empty
    for (auto& m : c->moe_layers())
      if (m) m->stats().reset(m->experts());
}

nlohmann::json GptTask::summary_section(const parallel::Mesh& mesh) {
  const model::GptConfig& g = model_->config();
  if (g.moe_every == 0 || moe_steps_ == 0) return nullptr;
  const double tokens = (double)B_ * T_ * moe_steps_, groups = (double)B_ / moe_.group_windows * moe_steps_;
  nlohmann::json layers = nlohmann::json::array();
  int i = 0;
  for (int l = 0; l < g.n_layer; l++)
    if (g.is_moe(l)) layers.push_back(moe_layer_json(l, moe_run_[i++], g.experts, groups, tokens));
  return {{"experts", g.experts},
          {"top_k", g.moe_top_k},
          {"capacity_factor", moe_.capacity_factor},
          {"ep", cfg_.ep},
          {"steps", moe_steps_},
          {"layers", layers}};
}

}  // namespace

std::unique_ptr<TrainTask> make_gpt_task(const GptTaskConfig& cfg, const BatchLayout& layout,
                                         nn::TensorParallelOps* tp, const PipelineContext* pp,
                                         nn::ExpertParallelOps* ep) {
  return std::make_unique<GptTask>(cfg, layout, tp, pp, ep);
}

std::unique_ptr<TrainTask> make_gpt_task(const TrainConfig& cfg, const BatchLayout& layout, const TaskGroups& g) {
  const PipelineContext* pp = g.pp && g.pp->spec.stages > 1 ? g.pp : nullptr;
  return make_gpt_task(GptTaskConfig::from(cfg), layout, g.tp, pp, g.ep);
}

// The parent's checks of what needs the model's shape (one message, not one per rank); on resume, the shape
// flags against the checkpoint's.
void check_gpt_shape(const TrainConfig& cfg) {
  if (cfg.tp == 1 && cfg.stage_layers.empty() && cfg.resume.empty()) return;
  const GptTaskConfig task = GptTaskConfig::from(cfg);  // its init: --init, or the checkpoint --resume names
  std::optional<SafetensorsReader> init;
  if (!task.init.empty()) init.emplace(task.init);
  const model::GptConfig shape = gpt_shape(task, init ? &*init : nullptr);
  MT_CHECK_INPUT(shape.n_head % cfg.tp == 0, "n_head (", shape.n_head, ") is not divisible by --tp (", cfg.tp,
                 "): tensor parallelism splits attention by whole heads");
  if (!cfg.stage_layers.empty()) {
    // The placement's stages: p V, or p under chimera (every stage held twice).
    const std::string name = cfg.schedule.empty() ? pipeline::kDefaultSchedule : cfg.schedule;
    const int stages = pipeline::find_schedule(name).placement({name, cfg.pp, 2, cfg.virtual_stages}).stages();
    pipeline::check_stage_layers(cfg.stage_layers, stages, shape.n_layer);
  }
}

}  // namespace mt::train
