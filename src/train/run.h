// One training run as composed parts (internal to src/train): built once by Run's constructor in a fixed
// order, then driven by the one step loop (trainer.cpp run_steps), whatever the method.
//
//   mesh -> layout -> task (model + data) -> step executor (micro-batch loop or pipeline schedule) ->
//   parameter store (flat buffers, ZeRO stage, hooks) -> gradient exchange (method) -> optimizer ->
//   consolidation (whole tensors) -> checkpointer (resume) -> log, rows, evaluator, cadence, step tail
//
// A parameter-server rank gets the same parts, cut for its side (ps_sync.h): a server's step executor
// computes nothing and its exchange applies the step to its slice; a worker's exchange pushes the gradient
// and learns the step's outcome when the servers publish it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "optim/optimizer.h"
#include "parallel/expert/ep_ops.h"
#include "parallel/mesh/mesh.h"
#include "parallel/tensor/tp_ops.h"
#include "trace/chrome_trace.h"
#include "train/consolidate.h"
#include "train/grad_sync.h"
#include "train/layout.h"
#include "train/observers.h"
#include "train/offload.h"
#include "train/step_executor.h"
#include "train/step_tail.h"
#include "train/task.h"
#include "train/trainer.h"

namespace mt::train {

// n: this rank's flat state size; params: the registry the store's pieces index (Adafactor's factored state).
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& cfg, size_t n, const nn::ParamRegistry& params);
optim::LrSchedule lr_schedule(const TrainConfig& cfg);

// Wall time of the timed steps (every step after the first of this process: the first allocates).
struct StepClock {
  double seconds = 0;
  int64_t steps = 0;
  static std::chrono::steady_clock::time_point now() { return std::chrono::steady_clock::now(); }
  static double since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(now() - t0).count();
  }
};

struct Run {
  Run(const TrainConfig& cfg, comm::Communicator* world);
  ~Run();  // stops the store's update thread (if any) before the optimizer it uses goes
  const TrainConfig& cfg;
  parallel::Mesh mesh;
  BatchLayout layout;
  std::unique_ptr<parallel::CommTensorParallelOps> tp_ops;
  std::unique_ptr<parallel::CommExpertParallelOps> ep_ops;
  PipelineContext pipeline;
  std::unique_ptr<TrainTask> task;
  trace::ChromeTrace tracer;
  std::unique_ptr<StepExecutor> executor;
  std::unique_ptr<parallel::DataParallel> store;  // the parameter store
  std::unique_ptr<GradSync> sync;                 // the gradient exchange, over the store
  std::unique_ptr<optim::Optimizer> opt;
  OffloadTiers offload;  // where opt's state streams from (--offload optimizer)
  MemoryPlan plan;       // the memory plan checked against --memory-limit before the first step
  nn::ParamRegistry full;
  std::unique_ptr<FlatSource> source;
  std::unique_ptr<Consolidation> state;
  std::unique_ptr<Checkpointer> ckpt;
  int64_t start = 0;
  int64_t items_per_step = 0;
  std::unique_ptr<RunLog> log;
  std::unique_ptr<RowQueue> rows;  // the exchange's outcomes and the loop's parts of each step's row
  std::unique_ptr<Evaluator> evaluate;
  Cadence cadence;
  StepTail tail;
  Straggler straggler;
  StepClock clock;
  TrainSummary sum;
  uint64_t comm_bytes_total = 0;

 private:
  void announce();
};

// A step's wall time and bytes, measured the same way for every method: start() before the step's work,
// finish() after it, which writes them into the step's row (items per second, step time, bytes this step
// and so far) and counts the step in the run's throughput (every step after the first of this process: the
// first allocates; a pipeline's timings start over after it too). bytes: the counter the method is judged by.
class StepMeter {
 public:
  StepMeter(Run& r, std::function<uint64_t()> bytes) : r_(r), bytes_(std::move(bytes)) {}
  void start() {
    t0_ = StepClock::now();
    sent0_ = bytes_();
  }
  // Returns the step's items per second.
  double finish(int64_t s, nlohmann::json& row);

 private:
  Run& r_;
  std::function<uint64_t()> bytes_;
  std::chrono::steady_clock::time_point t0_;
  uint64_t sent0_ = 0;
};

}  // namespace mt::train
