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
#include <thread>

#include <nlohmann/json.hpp>

#include "checkpoint/weights.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/memory.h"
#include "optim/optimizer.h"
#include "parallel/async/hogwild.h"
#include "parallel/data/data_parallel.h"
#include "tensor/blas.h"
#include "trace/metrics.h"
#include "train/task.h"
#include "train/trainer.h"

namespace mt::train {

TrainSummary run_hogwild(const TrainConfig& cfg) {
  cfg.validate(cfg.nproc);
  MT_CHECK_INPUT(cfg.checkpoint_dir.empty() && cfg.resume.empty() && cfg.trace.empty(),
                 "--async hogwild writes no checkpoints or traces (no --checkpoint-dir, --resume, --trace): the "
                 "shared parameters have no step at which they are consistent");
  const int W = cfg.nproc;
  set_num_threads(cfg.threads);
  // Every worker's own model (activations, gradients, data reader); the parameters it computes with are a
  // snapshot of `shared`.
  std::vector<std::unique_ptr<TrainTask>> tasks;
  std::vector<std::unique_ptr<parallel::DataParallel>> engines;
  for (int w = 0; w < W; w++) {
    tasks.push_back(make_mlp_task(cfg));
    engines.push_back(std::make_unique<parallel::DataParallel>(tasks[w]->params(), nullptr,
                                                               parallel::DataParallelOptions{}));
    engines[w]->initialize([&](nn::Param& p) { tasks[w]->init_param(p); });
    tasks[w]->prepare();
  }
  nn::ParamRegistry& p0 = tasks[0]->params();
  const size_t n = p0.size();
  AlignedBuffer shared(n);
  std::copy(p0.data(), p0.data() + n, shared.data());

  const int B = tasks[0]->global_batch(), per_worker = B / W;
  const int64_t items_per_step = (int64_t)B * tasks[0]->items_per_window();
  const optim::SgdConfig sgd{(float)cfg.momentum, (float)cfg.weight_decay};
  const optim::LrSchedule sched{cfg.lr, cfg.min_lr < 0 ? cfg.lr / 10 : cfg.min_lr, cfg.warmup_steps, cfg.steps};
  const int straggler = cfg.straggler.empty() ? -1 : std::stoi(cfg.straggler);
  const int straggler_ms = cfg.straggler.empty() ? 0 : std::stoi(cfg.straggler.substr(cfg.straggler.find(':') + 1));

  trace::MetricsWriter metrics;
  if (!cfg.metrics.empty()) metrics = trace::MetricsWriter(cfg.metrics, false);
  trace::Progress progress(0, cfg.steps, cfg.log_every, cfg.progress, "ex");
  progress.message(str("Hogwild: ", W, " worker threads on shared parameters (lock-free SGD), ", per_worker,
                       " of ", B, " examples per update"));
  std::atomic<int64_t> updates{0};
  std::atomic<bool> stop{false};
  std::vector<std::exception_ptr> errors(W);
  TrainSummary sum;
  const auto t_start = std::chrono::steady_clock::now();

  auto worker = [&](int w) {
    try {
      set_num_threads(cfg.threads);  // OpenMP's thread count is per thread
      TrainTask& task = *tasks[w];
      parallel::DataParallel& engine = *engines[w];
      nn::ParamRegistry& params = task.params();
      const std::vector<optim::Segment> segs = optim::segments_of(params);
      AlignedBuffer momentum(n);
      StepHooks hooks;
      hooks.params = &engine;
      for (int64_t s = 0; s < cfg.steps && !stop.load(std::memory_order_relaxed); s++) {
        const auto t0 = std::chrono::steady_clock::now();
        parallel::hogwild_read(shared.data(), params.data(), n);
        engine.begin_step();
        const double loss_sum = task.forward_backward(s, w * per_worker, per_worker, hooks);
        engine.finish_backward();
        if (w == straggler) std::this_thread::sleep_for(std::chrono::milliseconds(straggler_ms));
        // The model scaled the gradient for the global batch; this update is the mean over this worker's share.
        engine.scale_grads((float)W);
        const double loss = loss_sum * W / (double)items_per_step;
        const double norm = engine.grad_norm();
        if (!std::isfinite(loss) || !std::isfinite(norm))
          throw DivergedError(str(!std::isfinite(loss) ? "loss" : "gradient norm", " is ",
                                  !std::isfinite(loss) ? loss : norm, " at worker ", w, "'s step ", s,
                                  "; training stopped (try a lower --lr or --grad-clip)"));
        if (cfg.grad_clip > 0 && norm + 1e-6 > cfg.grad_clip)
          engine.scale_grads((float)(cfg.grad_clip / (norm + 1e-6)));
        const float lr = sched.at(s);
        parallel::hogwild_sgd_step(shared.data(), params.grad(), momentum.data(), segs, sgd, lr, s);
        const int64_t done = updates.fetch_add(1) + 1;
        if (w != 0) continue;
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
        const double ips = (double)done * per_worker / elapsed;  // all workers' examples per second so far
        nlohmann::json row = {{"step", s},          {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
                              {"examples_per_s", ips}, {"step_time_s", dt}, {"updates_total", done}};
        if (task.has_eval() && cfg.eval_every > 0 && ((s + 1) % cfg.eval_every == 0 || s + 1 == cfg.steps)) {
          parallel::hogwild_read(shared.data(), params.data(), n);  // what the workers have made so far
          EvalSums ev = task.evaluate(cfg.eval_batches, 0, 1, &engine);
          row["val_loss"] = ev.loss / ev.count;
          row["val_accuracy"] = ev.correct / ev.count;
          progress.message(str("step ", s + 1, ": val loss ", ev.loss / ev.count, ", val accuracy ",
                               100 * ev.correct / ev.count, "% (", done, " updates applied)"));
        }
        metrics.write(row);
        progress.step(s, loss, lr, ips);
        sum.steps_run++;
        sum.final_loss = loss;
      }
    } catch (...) {
      errors[w] = std::current_exception();
      stop.store(true);
    }
  };
  std::vector<std::thread> threads;
  for (int w = 1; w < W; w++) threads.emplace_back(worker, w);
  worker(0);
  for (std::thread& t : threads) t.join();
  progress.finish();
  for (std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  sum.items_per_s = (double)updates.load() * per_worker / wall;
  sum.params = (int64_t)n;
  sum.ranks.push_back({(double)n * 4 * W, (double)n * 4 * W, (double)n * 4 * W, 0, (double)peak_rss_bytes(), 0, 0});
  if (!cfg.save.empty()) {
    auto metadata = tasks[0]->metadata();
    metadata["format"] = "pt";
    checkpoint::save_params(cfg.save, p0, metadata, shared.data());  // the MLP's registry holds whole tensors
  }
  if (!cfg.summary.empty()) {
    nlohmann::json j = {{"examples_per_s", sum.items_per_s}, {"async", "hogwild"}, {"workers", W},
                        {"params", sum.params},             {"steps", sum.steps_run},
                        {"updates", updates.load()},        {"final_loss", sum.final_loss}};
    write_file_atomic(cfg.summary, j.dump(2) + "\n");
  }
  return sum;
}

}  // namespace mt::train
