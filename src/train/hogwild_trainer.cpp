// `meshtrain train --async hogwild --nproc W`: W worker threads of this process train one MLP on shared
// parameters with lock-free SGD (parallel/async/hogwild.h).
//
// Worker w takes its share of every step's global batch (the examples data-parallel rank w of W would take),
// so the run sees the same examples as data parallelism, but as W x --steps small updates, each the mean
// gradient of B / W examples, applied whenever that worker is done: nobody waits for anybody. The lead
// (worker 0) reports its own steps: its loss, the learning rate, and the updates all workers have applied.
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "checkpoint/weights.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/memory.h"
#include "optim/optimizer.h"
#include "parallel/async/hogwild.h"
#include "parallel/data/data_parallel.h"
#include "tensor/blas.h"
#include "trace/metrics.h"
#include "train/model_registry.h"
#include "train/run.h"
#include "train/task.h"
#include "train/trainer.h"

namespace mt::train {

namespace {

// What the workers share: the parameters, the update counter, the stop flag, and the lead's log.
struct Shared {
  const TrainConfig& cfg;
  const BatchLayout layout;
  std::vector<std::unique_ptr<TrainTask>> tasks;
  std::vector<std::unique_ptr<parallel::DataParallel>> engines;
  AlignedBuffer params;
  std::atomic<int64_t> updates{0};
  std::atomic<bool> stop{false};
  std::chrono::steady_clock::time_point t_start;
  std::unique_ptr<RunLog> log;
  TrainSummary sum;
  Shared(const TrainConfig& c) : cfg(c), layout(c, c.nproc) {}  // worker w takes data-parallel rank w's share
};

// The lead's row of its step s; evaluation (of what the workers have made so far) on the cadence.
void report_step(Shared& sh, TrainTask& task, parallel::DataParallel& engine, int64_t s, double loss, double norm,
                 float lr, double dt, int64_t done) {
  const double elapsed = StepClock::since(sh.t_start);
  const double ips = (double)done * sh.layout.per_rank() / elapsed;  // all workers' examples per second so far
  nlohmann::json row = {{"step", s},          {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
                        {"examples_per_s", ips}, {"step_time_s", dt}, {"updates_total", done}};
  if (Cadence::from(sh.cfg, task.has_eval()).eval_after(s)) {
    nn::ParamRegistry& params = task.params();
    parallel::hogwild_read(sh.params.data(), params.data(), params.size());
    EvalSums ev = task.evaluate(sh.cfg.eval_batches, 0, 1, &engine);
    row["val_loss"] = ev.loss / ev.count;
    row["val_accuracy"] = ev.correct / ev.count;
    sh.log->message(str("step ", s + 1, ": val loss ", ev.loss / ev.count, ", val accuracy ",
                        100 * ev.correct / ev.count, "% (", done, " updates applied)"));
  }
  sh.log->step(row, s, loss, lr, ips);
  sh.sum.steps_run++;
  sh.sum.final_loss = loss;
}

// Worker w's steps: read the shared parameters, gradient of its share, the run's step tail (its own
// divergence check names the worker), a lock-free SGD update.
void work(Shared& sh, int w) {
  const TrainConfig& cfg = sh.cfg;
  set_num_threads(cfg.threads);  // OpenMP's thread count is per thread
  TrainTask& task = *sh.tasks[w];
  parallel::DataParallel& engine = *sh.engines[w];
  nn::ParamRegistry& params = task.params();
  const size_t n = params.size();
  const std::vector<optim::Segment> segs = optim::segments_of(params);
  const optim::SgdConfig sgd{(float)cfg.momentum, (float)cfg.weight_decay};
  const Straggler& straggler = cfg.straggler;
  StepTail tail(cfg.grad_clip, lr_schedule(cfg));
  tail.add_check(std::make_unique<NonFiniteCheck>([w](int64_t s) { return str("worker ", w, "'s step ", s); }));
  const int W = cfg.nproc;
  const int64_t items_per_step = (int64_t)sh.layout.global_batch() * task.items_per_window();
  AlignedBuffer momentum(n);
  StepHooks hooks;
  hooks.params = &engine;
  const std::unique_ptr<StepExecutor> executor = make_step_executor(task, nullptr, nullptr);
  for (int64_t s = 0; s < cfg.steps && !sh.stop.load(std::memory_order_relaxed); s++) {
    const auto t0 = StepClock::now();
    parallel::hogwild_read(sh.params.data(), params.data(), n);
    engine.begin_step();
    executor->run(s, sh.layout.share(w, s), hooks, [&](double loss_sum) {
      engine.finish_backward();
      straggler.pause(w);
      // The model scaled the gradient for the global batch; this update is the mean over this worker's share.
      engine.scale_grads((float)W);
      const double loss = loss_sum * W / (double)items_per_step;
      const double norm = engine.grad_norm();
      const float lr = tail.finish(s, loss, norm, [&](float f) { engine.scale_grads(f); });
      parallel::hogwild_sgd_step(sh.params.data(), params.grad(), momentum.data(), segs, sgd, lr, s);
      const int64_t done = sh.updates.fetch_add(1) + 1;
      if (w == 0) report_step(sh, task, engine, s, loss, norm, lr, StepClock::since(t0), done);
    });
  }
}

}  // namespace

TrainSummary run_hogwild(const TrainConfig& cfg) {
  cfg.validate(cfg.nproc);
  MT_CHECK_INPUT(cfg.checkpoint_dir.empty() && cfg.resume.empty() && cfg.trace.empty(),
                 "--async hogwild writes no checkpoints or traces (no --checkpoint-dir, --resume, --trace): the "
                 "shared parameters have no step at which they are consistent");
  write_resolved_config(cfg, nullptr);
  const int W = cfg.nproc;
  set_num_threads(cfg.threads);
  Shared sh(cfg);
  // Every worker's own model (activations, gradients, data reader); the parameters it computes with are a
  // snapshot of the shared ones.
  for (int w = 0; w < W; w++) {
    sh.tasks.push_back(model_entry(cfg.model).make(cfg, sh.layout, {}));
    sh.engines.push_back(std::make_unique<parallel::DataParallel>(sh.tasks[w]->params(), nullptr,
                                                                  parallel::DataParallelOptions{}));
    sh.engines[w]->initialize([&](nn::Param& p) { sh.tasks[w]->init_param(p); });
    sh.tasks[w]->prepare();
  }
  nn::ParamRegistry& p0 = sh.tasks[0]->params();
  const size_t n = p0.size();
  sh.params = AlignedBuffer(n);
  std::copy(p0.data(), p0.data() + n, sh.params.data());
  sh.log = std::make_unique<RunLog>(cfg, true, 0, "ex");
  sh.log->message(str("Hogwild: ", W, " worker threads on shared parameters (lock-free SGD), ", sh.layout.per_rank(),
                      " of ", sh.layout.global_batch(), " examples per update"));
  std::vector<std::exception_ptr> errors(W);
  sh.t_start = StepClock::now();
  auto guarded = [&](int w) {
    try {
      work(sh, w);
    } catch (...) {
      errors[w] = std::current_exception();
      sh.stop.store(true);
    }
  };
  std::vector<std::thread> threads;
  for (int w = 1; w < W; w++) threads.emplace_back(guarded, w);
  guarded(0);
  for (std::thread& t : threads) t.join();
  sh.log->finish();
  for (std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  TrainSummary& sum = sh.sum;
  sum.items_per_s = (double)sh.updates.load() * sh.layout.per_rank() / StepClock::since(sh.t_start);
  sum.params = (int64_t)n;
  sum.ranks.push_back({(double)n * 4 * W, (double)n * 4 * W, (double)n * 4 * W, 0, (double)peak_rss_bytes(), 0, 0});
  if (!cfg.save.empty()) {
    auto metadata = sh.tasks[0]->metadata();
    metadata["format"] = "pt";
    checkpoint::save_params(cfg.save, p0, metadata, sh.params.data());  // the MLP's registry holds whole tensors
  }
  if (!cfg.summary.empty()) {
    nlohmann::json j = {{"examples_per_s", sum.items_per_s}, {"async", "hogwild"}, {"workers", W},
                        {"params", sum.params},             {"steps", sum.steps_run},
                        {"updates", sh.updates.load()},     {"final_loss", sum.final_loss}};
    write_file_atomic(cfg.summary, j.dump(2) + "\n");
  }
  return sum;
}

}  // namespace mt::train
