// A training task: a model plus its data, seen by the trainer as "the gradient of windows [first,
// first+count) of the global batch of step s". Data parallelism hands each rank its windows; the trainer
// (optimizer, clipping, schedule, metrics, checkpoints, reductions) is the same for every task.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "comm/communicator.h"
#include "nn/expert_parallel.h"
#include "nn/param_hooks.h"
#include "nn/params.h"
#include "nn/tensor_parallel.h"
#include "parallel/mesh/mesh.h"
#include "parallel/pipeline/executor.h"
#include "trace/chrome_trace.h"
#include "train/layout.h"
#include "train/train_config.h"

namespace mt {
class SafetensorsReader;
}

namespace mt::train {

// Sums over the evaluated items (the trainer adds them across ranks, then divides).
struct EvalSums {
  double loss = 0;
  double correct = 0;
  double count = 0;
};

// A pipeline stage runner that sums the loss of the forwards it ran (the last stage's).
struct TaskStageRunner : pipeline::StageRunner {
  double loss = 0;
};

struct StepHooks {
  nn::ParamHooks* params = nullptr;                         // around every parameter group's use
  std::function<void(int index, int count)> micro_batch;    // before each micro-batch
  // Instead of micro_batch, before a pipeline schedule's step of `count` micro-batches (their passes
  // interleave): gradients accumulate over all of them and are reduced once (DataParallel::begin_accumulation).
  std::function<void(int count)> accumulate;
};

class TrainTask {
 public:
  virtual ~TrainTask() = default;
  // Declared parameters; the caller finalizes the registry (DataParallel does, per ZeRO stage).
  virtual nn::ParamRegistry& params() = 0;
  // Declares the same model unsharded into `full` (for consolidating tensor-parallel shards into files).
  virtual void declare_full(nn::ParamRegistry& full) const = 0;
  // Writes p's initial tensor (from --init, else the seeded initializer; a shard its part) into p.data.
  virtual void init_param(nn::Param& p) = 0;
  // Allocates what the steps need; call after the registry is finalized.
  virtual void prepare() = 0;
  // Forward and backward of one micro-batch, windows [first, first + count) of step's global batch:
  // accumulates the gradient of the global-batch mean loss; returns the micro-batch's summed per-item loss.
  virtual double micro_batch(int64_t step, int first, int count, nn::ParamHooks* hooks) = 0;
  // Pipeline runs: this rank's chunks as the pipeline executor sees them, for the share of step `step`
  // (null for tasks without pipeline stages). The runner sums the loss it computes (last stage only) and calls
  // hooks (may be null) around every parameter group's use in its chunks' forward and backward.
  virtual std::unique_ptr<TaskStageRunner> stage_runner(int64_t step, const BatchShare& share, nn::ParamHooks* hooks) {
    return nullptr;
  }
  virtual bool has_eval() const = 0;
  // Evaluation sums over this rank's part (rank of nranks) of the held-out data.
  virtual EvalSums evaluate(int batches, int rank, int nranks, nn::ParamHooks* hooks) = 0;
  virtual bool is_classifier() const = 0;
  virtual int global_batch() const = 0;         // windows (GPT) or examples (MLP) per step
  virtual int64_t items_per_window() const = 0; // tokens per window (T) or 1
  virtual const char* item_name() const = 0;    // "tok" / "ex"
  virtual double flops_per_step() const = 0;
  virtual size_t activation_bytes() const = 0;  // one micro-batch of the layout
  // The backward's scratch beside the saved activations (running gradients and per-layer temporaries, shared by
  // the micro-batches): what the store holds above activation_bytes() while a backward runs.
  virtual size_t backward_scratch_bytes() const { return 0; }
  // The products' own copies of their operands (under --precision bf16: each thread's packed bf16 or emulated
  // float32 operands, grown to the largest product and kept): what a step holds outside the activation store.
  virtual size_t product_scratch_bytes() const { return 0; }
  virtual std::map<std::string, std::string> metadata() const = 0;
  // Measured: the most activation bytes held at once (the activation store's peak).
  virtual size_t activation_peak_bytes() const { return 0; }
  // Measured: the most micro-batches (per chunk) holding activations at once, and the most bytes one of them
  // held (the activation store's live keys); -1 / 0 when the task does not count them.
  virtual int activation_peak_micro_batches() const { return -1; }
  virtual size_t activation_peak_micro_batch_bytes() const { return 0; }
  // The store a model keeps its activations in (--offload-activations gives it a tier); null: none to offload.
  virtual nn::ActivationStore* activation_store() { return nullptr; }
  // Pipeline runs: blocks per global stage.
  virtual std::vector<int> stage_layers() const { return {}; }
  // The task's own events (MoE dispatch and combine) go here; the pipeline's go to the step executor.
  virtual void set_trace(trace::ChromeTrace*) {}
  // Before the first micro-batch of a step (the step executor calls it): per-step statistics start over.
  virtual void begin_step(int64_t step) {}
  // Task-specific fields of the step's metrics row from what its micro-batches recorded (MoE routing:
  // auxiliary losses, drops, tokens per expert), then the record starts over. Collective over the mesh's
  // replica and dp groups.
  virtual void annotate(nlohmann::json& row, const parallel::Mesh& mesh) {}
  // Task-specific section of the run summary (collective like annotate); null: none.
  virtual nlohmann::json summary_section(const parallel::Mesh& mesh) { return nullptr; }
};

// What the tasks take from the flags (parsed once by from(); a task never sees the whole TrainConfig).
struct GptTaskConfig {
  model::GptConfig flags;                 // shape flags; 0 = from --init, else a default (gpt_shape)
  std::string data, val_data, init;       // token shards, safetensors weights (--resume: its model file)
  int batch_size = 0, seq_len = 0;        // B windows of T tokens
  bool recompute = false, sequence_parallel = false;
  std::vector<int> stage_layers;          // blocks per global stage; empty: balanced by cost
  uint64_t seed = 0;
  model::MoeOptions moe;                  // MoE routing while training (its ep group: make_gpt_task's)
  int ep = 1;                             // the expert-parallel degree (for the summary)
  Precision precision = Precision::fp32;  // the model's products (--precision)
  static GptTaskConfig from(const TrainConfig& cfg);
};
struct MlpTaskConfig {
  std::vector<int> hidden;
  std::string data, labels, val_data, val_labels, init;
  double val_fraction = 0;
  int batch_size = 0;
  uint64_t seed = 0;
  Precision precision = Precision::fp32;  // the model's products (--precision)
  static MlpTaskConfig from(const TrainConfig& cfg);
};

// Whether a rank registers only its experts (model::MoeOptions::local_experts): --ep > 1.
// The same on every rank (pipeline stages without MoE blocks included), so files gather over ep everywhere.
bool local_experts(const TrainConfig& cfg);

// The GPT shape training uses: from --init's metadata and tensors (init non-null), else the flags with
// defaults L=4, H=4, C=128, V=256, n_positions max(256, T). Throws InputError on a bad shape.
model::GptConfig gpt_shape(const GptTaskConfig& cfg, const SafetensorsReader* init);
// The pipeline this rank is part of: its group (rank = pipeline position); stages, chunks and schedule are
// the layout's; the schedule (made once when the run starts) says which stage each chunk computes.
struct PipelineContext {
  comm::Communicator* group = nullptr;
  pipeline::ScheduleSpec spec;
  pipeline::Schedule schedule;
};

// tp: the tensor-parallel group (null: none). pp: the pipeline (null or 1 stage: none); with a pipeline the
// task holds this rank's chunks and hands the step executor (step_executor.h) a stage runner per step.
// Blocks per global stage: --stage-layers if given (checked), else balance_layers over estimated FLOPs.
std::vector<int> stage_split(const GptTaskConfig& cfg, const model::GptConfig& shape, int stages);

// The tensors the first and the last of the S stages both declare (the tied embedding), found by declaring
// both stages' parameters (no allocation) and comparing. first: S + 1 entries, stage s holds blocks
// [first[s], first[s + 1]). The replica facts (replicas.h) of a pipeline rank's tensors use it.
std::set<std::string> tied_tensors(const model::GptConfig& shape, const std::vector<int>& first);

// ep: the expert-parallel group of MoE blocks (null: every expert computed here).
std::unique_ptr<TrainTask> make_gpt_task(const GptTaskConfig& cfg, const BatchLayout& layout,
                                         nn::TensorParallelOps* tp = nullptr, const PipelineContext* pp = nullptr,
                                         nn::ExpertParallelOps* ep = nullptr);
std::unique_ptr<TrainTask> make_mlp_task(const MlpTaskConfig& cfg, const BatchLayout& layout);

}  // namespace mt::train
