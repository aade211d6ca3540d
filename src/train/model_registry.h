// The models a run can train: one table from the model (--model, ModelKind) to what differs between them:
// how its task is built, what its throughput counts, whether MoE flags apply, and the launcher's checks that
// need its shape. The run, the summary line, the flag checks and Hogwild read the table instead of
// switching on the model; a new model (a CNN next) is one task file and one row in model_registry.cpp.
#pragma once

#include <memory>

#include "nn/expert_parallel.h"
#include "nn/tensor_parallel.h"
#include "train/layout.h"
#include "train/task.h"
#include "train/train_config.h"

namespace mt::train {

// The groups a task may split its model over (null: none).
struct TaskGroups {
  nn::TensorParallelOps* tp = nullptr;
  const PipelineContext* pp = nullptr;  // null or one stage: no pipeline
  nn::ExpertParallelOps* ep = nullptr;
};

struct ModelEntry {
  ModelKind kind;
  const char* name;   // the --model spelling (flag_values(ModelKind) lists the rows')
  const char* items;  // what one item of the throughput is: "tokens", "examples"
  bool has_router;    // MoE blocks possible (--moe-every, --experts, --ep and the routing flags apply)
  std::unique_ptr<TrainTask> (*make)(const TrainConfig& cfg, const BatchLayout& layout, const TaskGroups& groups);
  // Before ranks start: the checks that need the model's shape (one message, not one per rank); may be null.
  void (*check_shape)(const TrainConfig& cfg);
};

// The row of kind (every ModelKind has one).
const ModelEntry& model_entry(ModelKind kind);

// The rows' builders and checks (gpt_task.cpp, mlp_task.cpp).
std::unique_ptr<TrainTask> make_gpt_task(const TrainConfig& cfg, const BatchLayout& layout, const TaskGroups& groups);
std::unique_ptr<TrainTask> make_mlp_task(const TrainConfig& cfg, const BatchLayout& layout, const TaskGroups& groups);
void check_gpt_shape(const TrainConfig& cfg);

}  // namespace mt::train
