// `meshtrain train --async hogwild --nproc W`: W worker threads of this process train one model on shared
// parameters with lock-free SGD (parallel/async/hogwild.h).
//
// Worker w takes its share of every step's global batch (the examples data-parallel rank w of W would take),
// so the run sees the same examples as data parallelism, but as W x --steps small updates, each the mean
// gradient of B / W examples, applied whenever that worker is done: nobody waits for anybody. The lead
// (worker 0) reports its own steps: its loss, the learning rate, and the updates all workers have applied.
//
// A threaded trainer, not the step loop (its workers share one buffer instead of exchanging gradients), built
// from the run's parts: the model from the registry (which models Hogwild takes is train_config.cpp's
// check_async), the step executor and StepTail per worker, and the lead's RunLog, Evaluator, Checkpointer
// (the final --save through Consolidation) and the summary writer (summary.h) on a one-process mesh.
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "optim/optimizer.h"
#include "parallel/async/hogwild.h"
#include "parallel/data/data_parallel.h"
#include "tensor/blas.h"
#include "train/consolidate.h"
#include "train/model_registry.h"
#include "train/observers.h"
#include "train/run.h"
#include "train/summary.h"
#include "train/task.h"
#include "train/trainer.h"

namespace mt::train {

namespace {

// One worker thread's own model (activations, gradients, data reader), a snapshot of the shared parameters
// in its registry, and its SGD momentum (the optimizer's state; the update itself is hogwild_sgd_step).
struct Worker {
  std::unique_ptr<TrainTask> task;
  std::unique_ptr<parallel::DataParallel> engine;
  std::unique_ptr<optim::Optimizer> opt;
};

// What the workers share: the parameters, the update counter, the stop flag, and the lead's observers.
struct Shared {
  const TrainConfig& cfg;
  const BatchLayout layout;
  parallel::Mesh mesh;  // one process: evaluation and files need no groups
  std::vector<Worker> workers;
  AlignedBuffer params;
  std::atomic<int64_t> updates{0};
  std::atomic<bool> stop{false};
  std::chrono::steady_clock::time_point t_start;
  Cadence cadence;
  std::unique_ptr<RunLog> log;
  std::unique_ptr<Evaluator> evaluate;  // worker 0's model, on a snapshot of the shared parameters
  TrainSummary sum;
  // Worker w takes data-parallel rank w's share.
  explicit Shared(const TrainConfig& c) : cfg(c), layout(c, c.nproc), mesh(nullptr, parallel::MeshGrid(1, 1, 1, 1)) {}
};

// The lead's row of its step s; evaluation (of what the workers have made so far) on the cadence.
void report_step(Shared& sh, int64_t s, double loss, double norm, float lr, double dt, int64_t done) {
  TrainTask& task = *sh.workers[0].task;
  const double elapsed = StepClock::since(sh.t_start);
  // All workers' items per second so far.
  const double ips = (double)done * sh.layout.per_rank() * task.items_per_window() / elapsed;
  nlohmann::json row = {
      {"step", s},         {"loss", loss},         {"lr", lr}, {"grad_norm", norm}, {sh.log->items_key(), ips},
      {"step_time_s", dt}, {"updates_total", done}};
  if (sh.cadence.eval_after(s)) {
    nn::ParamRegistry& params = task.params();
    parallel::hogwild_read(sh.params.data(), params.data(), params.size());
    (*sh.evaluate)(s, row);
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
  TrainTask& task = *sh.workers[w].task;
  parallel::DataParallel& engine = *sh.workers[w].engine;
  float* momentum = sh.workers[w].opt->state().data(0);
  nn::ParamRegistry& params = task.params();
  const size_t n = params.size();
  const std::vector<optim::Segment> segs = optim::segments_of(params);
  const optim::SgdConfig sgd{(float)cfg.momentum, (float)cfg.weight_decay};
  StepTail tail(cfg.grad_clip, lr_schedule(cfg));
  tail.add_check(std::make_unique<NonFiniteCheck>([w](int64_t s) { return str("worker ", w, "'s step ", s); }));
  const int W = cfg.nproc;
  const int64_t items_per_step = (int64_t)sh.layout.global_batch() * task.items_per_window();
  StepHooks hooks;
  hooks.params = &engine;
  const std::unique_ptr<StepExecutor> executor = make_step_executor(task, nullptr, nullptr);
  for (int64_t s = 0; s < cfg.steps && !sh.stop.load(std::memory_order_relaxed); s++) {
    const auto t0 = StepClock::now();
    parallel::hogwild_read(sh.params.data(), params.data(), n);
    engine.begin_step();
    executor->run(s, sh.layout.share(w, s), hooks, [&](double loss_sum, UpdatePart) {
      engine.finish_backward();
      cfg.straggler.pause(w);
      // The model scaled the gradient for the global batch; this update is the mean over this worker's share.
      engine.scale_grads((float)W);
      const double loss = loss_sum * W / (double)items_per_step;
      const double norm = engine.grad_norm();
      const float lr = tail.finish(s, loss, norm, [&](float f) { engine.scale_grads(f); });
      parallel::hogwild_sgd_step(sh.params.data(), params.grad(), momentum, segs, sgd, lr, s);
      const int64_t done = sh.updates.fetch_add(1) + 1;
      if (w == 0) report_step(sh, s, loss, norm, lr, StepClock::since(t0), done);
    });
  }
}

// Runs the W workers (worker 0 on this thread); the first error stops them all and is rethrown.
void run_workers(Shared& sh) {
  const int W = sh.cfg.nproc;
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
}

// After the workers: the final --save of the shared parameters and the summary, through the run's parts.
void finish_hogwild(Shared& sh) {
  const TrainConfig& cfg = sh.cfg;
  const int W = cfg.nproc;
  Worker& lead = sh.workers[0];
  nn::ParamRegistry& p0 = lead.task->params();
  parallel::hogwild_read(sh.params.data(), p0.data(), p0.size());  // what the workers made
  nn::ParamRegistry full;
  lead.task->declare_full(full);
  std::unique_ptr<FlatSource> source = engine_source(*lead.engine);
  Consolidation state(StateConsolidator(p0, full, ReplicaPlace{}, nullptr), *source, *lead.opt);
  const int64_t items_per_step = (int64_t)sh.layout.global_batch() * lead.task->items_per_window();
  Checkpointer(cfg, state, sh.mesh, lead.task->metadata(), items_per_step).save_final();
  TrainSummary& sum = sh.sum;
  const int64_t updates = sh.updates.load();
  sum.items_per_s =
      (double)updates * sh.layout.per_rank() * lead.task->items_per_window() / StepClock::since(sh.t_start);
  sum.params = (int64_t)full.size();
  gather_memory(sh.mesh, *lead.engine, *lead.opt, *lead.task, {}, sum);
  RankMemory& m = sum.ranks[0];  // every worker thread holds its own parameters, gradients and momentum
  m.param_bytes *= W, m.grad_bytes *= W, m.optimizer_bytes *= W;
  const nlohmann::json sections = {
      {"async", "hogwild"}, {"workers", W}, {"updates", updates}, {sh.log->items_key(), sum.items_per_s}};
  write_summary(cfg.summary, sum, sh.mesh, 0, sections);
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
  for (int w = 0; w < W; w++) {
    Worker x;
    x.task = model_entry(cfg.model).make(cfg, sh.layout, {});
    x.engine = std::make_unique<parallel::DataParallel>(x.task->params(), nullptr, parallel::DataParallelOptions{});
    x.engine->initialize([&](nn::Param& p) { x.task->init_param(p); });
    x.task->prepare();
    x.opt = make_optimizer(cfg, x.task->params().size(), x.task->params());  // SGD (check_async): its state is the momentum
    sh.workers.push_back(std::move(x));
  }
  TrainTask& task0 = *sh.workers[0].task;
  nn::ParamRegistry& p0 = task0.params();
  sh.params = AlignedBuffer(p0.size());
  std::copy(p0.data(), p0.data() + p0.size(), sh.params.data());
  sh.cadence = Cadence::from(cfg, task0.has_eval());
  sh.log = std::make_unique<RunLog>(cfg, true, 0, task0.item_name());
  sh.evaluate = std::make_unique<Evaluator>(task0, sh.mesh, cfg.eval_batches, sh.workers[0].engine.get(), *sh.log);
  sh.log->message(str("Hogwild: ", W, " worker threads on shared parameters (lock-free SGD), ", sh.layout.per_rank(),
                      " of ", sh.layout.global_batch(), " windows per update"));
  run_workers(sh);
  finish_hogwild(sh);
  return sh.sum;
}

}  // namespace mt::train
