// A training task: a model plus its data, seen by the trainer as "compute the gradient of the global
// batch of step s". The trainer (optimizer, clipping, schedule, metrics, checkpoints) is the same for
// every task.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "nn/params.h"
#include "train/train_config.h"

namespace mt::train {

struct EvalResult {
  double loss = NAN;
  double accuracy = NAN;  // classification tasks only
};

class TrainTask {
 public:
  virtual ~TrainTask() = default;
  virtual nn::ParamRegistry& params() = 0;
  // Zeroes gradients, then accumulates the gradient of the mean loss over the global batch of `step`
  // into params().grad(); returns that mean loss.
  virtual double forward_backward(int64_t step) = 0;
  virtual bool has_eval() const = 0;
  virtual EvalResult evaluate(int batches) = 0;
  virtual int64_t items_per_step() const = 0;  // tokens (GPT) or examples (MLP)
  virtual const char* item_name() const = 0;   // "tok" / "ex"
  virtual double flops_per_step() const = 0;
  virtual size_t activation_bytes() const = 0;
  virtual std::map<std::string, std::string> metadata() const = 0;
};

// Builds the model (loading --init or initializing from --seed) and opens the data; throws InputError on
// any bad input.
std::unique_ptr<TrainTask> make_gpt_task(const TrainConfig& cfg);
std::unique_ptr<TrainTask> make_mlp_task(const TrainConfig& cfg);

}  // namespace mt::train
