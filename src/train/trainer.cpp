#include "train/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <memory>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/weights.h"
#include "core/error.h"
#include "optim/optimizer.h"
#include "tensor/blas.h"
#include "trace/metrics.h"
#include "train/task.h"

namespace mt::train {

void TrainConfig::validate() const {
  MT_CHECK_INPUT(model == "gpt" || model == "mlp", "--model must be gpt or mlp, got '", model, "'");
  MT_CHECK_INPUT(!data.empty(), "--data is required");
  MT_CHECK_INPUT(batch_size > 0, "--batch-size must be positive, got ", batch_size);
  MT_CHECK_INPUT(seq_len > 0, "--seq-len must be positive, got ", seq_len);
  MT_CHECK_INPUT(steps > 0, "--steps must be positive, got ", steps);
  MT_CHECK_INPUT(micro_batch_size >= 0 && (micro_batch_size == 0 || batch_size % micro_batch_size == 0),
                 "--batch-size ", batch_size, " is not divisible by --micro-batch-size ", micro_batch_size);
  MT_CHECK_INPUT(optimizer == "adamw" || optimizer == "sgd", "--optimizer must be adamw or sgd, got '", optimizer,
                 "'");
  MT_CHECK_INPUT(lr >= 0, "--lr must be >= 0, got ", lr);
  MT_CHECK_INPUT(warmup_steps >= 0, "--warmup-steps must be >= 0, got ", warmup_steps);
  MT_CHECK_INPUT(beta1 >= 0 && beta1 < 1, "--beta1 must be in [0, 1), got ", beta1);
  MT_CHECK_INPUT(beta2 >= 0 && beta2 < 1, "--beta2 must be in [0, 1), got ", beta2);
  MT_CHECK_INPUT(eps > 0, "--eps must be positive, got ", eps);
  MT_CHECK_INPUT(threads >= 1, "--threads must be >= 1, got ", threads);
  MT_CHECK_INPUT(save_every >= 0 && (save_every == 0 || !checkpoint_dir.empty()),
                 "--save-every needs --checkpoint-dir");
  MT_CHECK_INPUT(stop_at_step >= 0, "--stop-at-step must be >= 0, got ", stop_at_step);
  MT_CHECK_INPUT(eval_every >= 0 && eval_batches >= 1, "--eval-every must be >= 0 and --eval-batches >= 1");
  MT_CHECK_INPUT(eval_every == 0 || model == "mlp" || !val_data.empty(), "--eval-every needs --val-data");
  // Layouts whose features arrive in later work.
  auto not_yet = [](bool ok, const char* what) {
    MT_CHECK_INPUT(ok, what, " is not supported yet (this build trains in a single process)");
  };
  not_yet(nproc == 1, "--nproc > 1");
  not_yet(dp == 1, "--dp > 1");
  not_yet(tp == 1, "--tp > 1");
  not_yet(pp == 1, "--pp > 1");
  not_yet(zero == 0, "--zero > 0");
  not_yet(schedule.empty(), "--schedule");
}

namespace {

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& cfg, size_t n) {
  if (cfg.optimizer == "sgd")
    return std::make_unique<optim::Sgd>(n, optim::SgdConfig{(float)cfg.momentum, (float)cfg.weight_decay});
  return std::make_unique<optim::AdamW>(
      n, optim::AdamWConfig{(float)cfg.beta1, (float)cfg.beta2, (float)cfg.eps, (float)cfg.weight_decay});
}

}  // namespace

TrainSummary run_training(const TrainConfig& cfg) {
  cfg.validate();
  set_num_threads(cfg.threads);
  std::unique_ptr<TrainTask> task = cfg.model == "gpt" ? make_gpt_task(cfg) : make_mlp_task(cfg);
  nn::ParamRegistry& params = task->params();
  auto opt = make_optimizer(cfg, params.size());
  const auto segments = optim::segments_of(params);
  optim::LrSchedule sched{cfg.lr, cfg.min_lr < 0 ? cfg.lr / 10 : cfg.min_lr, cfg.warmup_steps, cfg.steps};
  auto metadata = task->metadata();

  int64_t start = 0;
  std::string last_checkpoint;
  if (!cfg.resume.empty()) {
    last_checkpoint = checkpoint::resolve_checkpoint(cfg.resume);
    nlohmann::json st = checkpoint::load_checkpoint(last_checkpoint, params, *opt);
    start = st["step"].get<int64_t>();
    MT_CHECK_INPUT(st.value("model", cfg.model) == cfg.model, last_checkpoint, " holds a ", st.value("model", ""),
                   " model but --model is ", cfg.model);
    MT_CHECK_INPUT(st.value("optimizer", cfg.optimizer) == cfg.optimizer, last_checkpoint, " was trained with ",
                   st.value("optimizer", ""), " but --optimizer is ", cfg.optimizer);
    MT_CHECK_INPUT(start <= cfg.steps, last_checkpoint, " is at step ", start, ", beyond --steps ", cfg.steps);
  }

  trace::MetricsWriter metrics;
  if (!cfg.metrics.empty()) metrics = trace::MetricsWriter(cfg.metrics, !cfg.resume.empty());
  trace::Progress progress(start, cfg.steps, cfg.log_every, cfg.progress);
  if (!cfg.resume.empty()) progress.message("resumed from " + last_checkpoint + " at step " + std::to_string(start));

  auto save_ckpt = [&](int64_t next_step) {
    nlohmann::json st = {{"step", next_step},        {"model", cfg.model},      {"optimizer", cfg.optimizer},
                         {"seed", cfg.seed},         {"batch_size", cfg.batch_size},
                         {"seq_len", cfg.seq_len},   {"data", cfg.data},
                         {"data_position", next_step * task->items_per_step()},
                         {"rng", {{"seed", cfg.seed}, {"counter", 0}}}};
    last_checkpoint = checkpoint::save_checkpoint(cfg.checkpoint_dir, next_step, params, *opt, metadata, st,
                                                  cfg.keep_checkpoints);
  };

  TrainSummary sum;
  double timed_s = 0;
  int64_t timed_steps = 0;
  for (int64_t s = start; s < cfg.steps; s++) {
    auto t0 = std::chrono::steady_clock::now();
    double loss = task->forward_backward(s);
    double norm = optim::global_norm(params.grad(), params.size());
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      progress.finish();
      throw DivergedError(str(!std::isfinite(loss) ? "loss" : "gradient norm", " is ",
                              !std::isfinite(loss) ? loss : norm, " at step ", s, "; training stopped. ",
                              last_checkpoint.empty() ? std::string("No checkpoint was written")
                                                      : "The last good checkpoint is " + last_checkpoint,
                              " (try a lower --lr or --grad-clip)"));
    }
    optim::clip_by_global_norm(params.grad(), params.size(), norm, cfg.grad_clip);
    float lr = sched.at(s);
    opt->step(params.data(), params.grad(), segments, lr, s);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double ips = (double)task->items_per_step() / dt;
    if (s > start) {
      timed_s += dt;
      timed_steps++;
    }

    nlohmann::json row = {{"step", s}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
                          {std::string(task->item_name()) == "tok" ? "tokens_per_s" : "examples_per_s", ips},
                          {"step_time_s", dt}};
    std::string extra;
    bool last = s + 1 == cfg.steps;
    if (task->has_eval() && ((cfg.eval_every > 0 && (s + 1) % cfg.eval_every == 0) || (last && cfg.eval_every > 0))) {
      EvalResult ev = task->evaluate(cfg.eval_batches);
      row["val_loss"] = ev.loss;
      char buf[96];
      if (!std::isnan(ev.accuracy)) {
        row["val_accuracy"] = ev.accuracy;
        std::snprintf(buf, sizeof buf, "step %lld: val loss %.4f, val accuracy %.2f%%", (long long)s + 1, ev.loss,
                      100 * ev.accuracy);
      } else {
        std::snprintf(buf, sizeof buf, "step %lld: val loss %.4f", (long long)s + 1, ev.loss);
      }
      progress.message(buf);
    }
    metrics.write(row);
    progress.step(s, loss, lr, ips, extra);
    sum.steps_run++;
    sum.final_loss = loss;

    bool stop_here = cfg.stop_at_step > 0 && s + 1 == cfg.stop_at_step;
    if (!cfg.checkpoint_dir.empty() &&
        ((cfg.save_every > 0 && (s + 1) % cfg.save_every == 0) || stop_here || (last && cfg.save_every > 0))) {
      save_ckpt(s + 1);
    }
    if (stop_here) {
      progress.message("stopped after step " + std::to_string(s + 1) + " (--stop-at-step)");
      break;
    }
  }
  progress.finish();
  if (!cfg.save.empty()) {
    metadata["format"] = "pt";
    checkpoint::save_params(cfg.save, params, metadata);
  }
  sum.items_per_s = timed_steps ? (double)task->items_per_step() * timed_steps / timed_s : 0;
  sum.flops_per_step = task->flops_per_step();
  sum.param_bytes = params.size() * sizeof(float);
  sum.grad_bytes = params.size() * sizeof(float);
  size_t opt_bytes = 0;
  for (auto& [n, b] : opt->state()) opt_bytes += b->bytes();
  sum.optimizer_bytes = opt_bytes;
  sum.activation_bytes = task->activation_bytes();
  return sum;
}

}  // namespace mt::train
