// The step loop and the run around it. The loop reads top to bottom and is the same for every method
// (synchronous ones, the parameter server's workers and servers): what differs is which parts run.h
// assembled (mesh, layout, step executor, gradient exchange, observers). Hogwild's threads
// (hogwild_trainer.cpp) end their steps with the same StepTail and use the same observers.
#include "train/trainer.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>

#include "checkpoint/safetensors.h"
#include "comm/launch.h"
#include "core/error.h"
#include "core/fs.h"
#include "parallel/pipeline/partition.h"
#include "tensor/blas.h"
#include "train/elastic.h"
#include "train/model_registry.h"
#include "train/micro_window_steps.h"
#include "train/no_flush_steps.h"
#include "train/sync_window_steps.h"
#include "train/preflight.h"
#include "train/run.h"
#include "train/summary.h"
#include "train/overlapped_update.h"
#include "train/weight_stash.h"
#include "train/weight_versions.h"

namespace mt::train {

namespace {

// One optimizer step after another, whatever the method: the parameters the step uses (the exchange's
// begin_step), data and gradient (the task, through the exchange's hooks), the update (the exchange's step,
// called by the executor), then the observers: the row (written once the exchange has given the step's
// outcome), evaluation and checkpoints (on parameters the exchange has settled), stop.
void run_steps(Run& r) {
  GradSync& sync = *r.sync;
  const StepHooks hooks = sync.hooks();
  // Bytes the method sends: what communication-efficient methods are judged by.
  StepMeter meter(r, [&] { return sync.bytes_sent(); });
  const double items = (double)r.items_per_step;
  const RankPeerReads reads0 = peer_reads_now();  // the steps' single-copy reads, not the setup's or final save's
  sync.begin_run(r.start);
  for (int64_t s = r.start; s < r.cfg.steps; s++) {
    meter.start();
    sync.begin_step(s);
    r.executor->run(s, r.layout.share(r.mesh.coord().dp, s), hooks, [&](double loss_sum, UpdatePart part) {
      r.straggler.pause(r.mesh.world_rank());
      sync.update_part(s, loss_sum, items, part, r.tail, *r.opt);
    });
    nlohmann::json row = {{"step", s}};
    meter.finish(s, row);
    sync.annotate(row);
    r.task->annotate(row, r.mesh);
    const bool eval_now = r.cadence.eval_after(s), save_now = r.cadence.save_after(s);
    if (eval_now || save_now || r.cadence.last_after(s)) sync.settle(s);
    if (eval_now) (*r.evaluate)(s, row);
    r.rows->local(s, row);
    if (save_now) r.ckpt->save(s + 1);
    if (r.cadence.stop_after(s)) {
      r.log->message("stopped after step " + std::to_string(s + 1) + " (--stop-at-step)");
      break;
    }
  }
  sync.end_run();
  r.sum.step_reads = peer_reads_now() - reads0;
  MT_ASSERT(r.rows->pending() == 0, "rows of ", r.rows->pending(), " steps left without their outcome");
}

// After the last step: the final save, the trace, and the summary (collective over the world).
TrainSummary finish_run(Run& r) {
  r.log->finish();
  const ExchangeReport method = r.sync->report(r.start, r.sum.steps_run);
  if (!method.line.empty()) r.log->message(method.line);
  r.ckpt->save_final();
  r.offload.drain();
  r.offload.trace_into(r.tracer);
  write_trace(r.cfg.trace, r.tracer, r.mesh);
  TrainSummary& sum = r.sum;
  sum.items_per_s = r.clock.steps ? (double)r.items_per_step * r.clock.steps / r.clock.seconds : 0;
  sum.flops_per_step = r.task->flops_per_step();
  sum.params = (int64_t)r.full.size();
  sum.memory_limit = (double)r.cfg.offload.memory_limit;
  gather_memory(r.mesh, *r.store, *r.opt, *r.task, r.offload.counters(), sum);
  gather_peer_reads(r.mesh, sum);
  nlohmann::json sections = nlohmann::json::object();
  if (!method.key.empty()) sections[method.key] = method.section;
  if (r.mesh.grid().pp() > 1) sections["pipeline"] = pipeline_report(r.mesh, r.layout, *r.task, r.executor->stats(), sum);
  // pipedream-2bw without a flush (train/no_flush_steps.h): its bubble is measured over windows of steps; the
  // simulated figures are still the flushed one-step list's.
  // 1f1b / zb-h1 / zb-h2 back to back (below) have no flush either.
  if (sections["pipeline"].is_object())
    sections["pipeline"]["flush_between_steps"] = !no_flush_applies(r.cfg, r.layout.schedule().micro_batches) &&
                                                  !micro_window_applies(r.cfg, r.layout.schedule().micro_batches) &&
                                                  !sync_window_applies(r.cfg, SyncOptions::from(r.cfg));
  // pipedream/pipemare without a flush: the window simulated with its updates as blocking collectives, at the
  // measured costs (the bubble_simulated above is the flushed one-step list's).
  if (sections["pipeline"].is_object() && micro_window_applies(r.cfg, r.layout.schedule().micro_batches)) {
    const nlohmann::json& pl = sections["pipeline"];
    sections["pipeline"]["bubble_simulated_window"] = micro_window_simulated_bubble(
        r.layout.schedule(), r.sum.steps_run, pl["stage_forward_ms"].get<std::vector<double>>(),
        pl["stage_backward_ms"].get<std::vector<double>>(), pl["message_latency_ms"].get<double>());
  }
  // 1f1b / zb-h1 / zb-h2 without clipping (train/sync_window_steps.h): no barrier between steps.
  if (sections["pipeline"].is_object())
    sections["pipeline"]["back_to_back"] = sync_window_applies(r.cfg, SyncOptions::from(r.cfg));
  if (micro_updates(r.cfg)) {  // the most weight versions each pipeline rank held (train/weight_stash.h)
    const std::vector<int> peaks = gather_stash_peaks(r.mesh, r.store->versions());
    if (sections["pipeline"].is_object()) sections["pipeline"]["stash_versions"] = peaks;
  }
  if (nlohmann::json t = r.task->summary_section(r.mesh); !t.is_null()) sections["moe"] = t;
  sections["offload"] = r.offload.report();  // the lead rank's tier (null without one)
  if (r.cfg.offload.memory_limit > 0 || r.cfg.offload.any()) sections["memory_plan"] = r.plan.json();  // the lead rank's
  if (const auto* o = dynamic_cast<const OverlappedDelayOne*>(r.store->versions()))  // the lead rank's counts
    sections["overlap_update"] = {{"deferred", o->deferred()}, {"overlapped", o->overlapped()}, {"waited_s", o->waited_s()}};
  if (const auto c = r.store->overlap_counts(); c.deferred >= 0)  // ZeRO 3's exact overlapped update (lead rank)
    sections["overlap_update"] = {{"deferred", c.deferred}, {"overlapped", c.overlapped}, {"waited_s", c.waited_s},
                                  {"fresh_taken", c.fresh_taken}, {"waited_group_s", c.waited_group_s},
                                  {"waited_first_s", c.waited_first_s}, {"kept_copied", c.kept_copied}};
  write_summary(r.cfg.summary, sum, r.mesh, r.cfg.zero, sections);
  return sum;
}

void report(const TrainConfig& cfg, const TrainSummary& s) {
  if (!cfg.progress || s.steps_run == 0) return;
  const char* items = model_entry(cfg.model).items;
  if (s.items_per_s > 0)
    std::fprintf(stderr, "done: %lld steps, final loss %.4f, %.0f %s/s\n", (long long)s.steps_run, s.final_loss,
                 s.items_per_s, items);
  else  // the first step allocates and is not timed: with one step there is no rate to give
    std::fprintf(stderr, "done: %lld steps, final loss %.4f (%s/s not measured: the first step is not timed)\n",
                 (long long)s.steps_run, s.final_loss, items);
  if (s.ranks.size() > 1 || cfg.zero > 0) {
    std::fprintf(stderr, "%6s %12s %12s %12s %12s %12s %12s  (MiB; activations: measured peak)\n", "rank", "params",
                 "grads", "optimizer", "transient", "activations", "peak RSS");
    for (size_t r = 0; r < s.ranks.size(); r++) {
      const RankMemory& m = s.ranks[r];
      std::fprintf(stderr, "%6zu %12.1f %12.1f %12.1f %12.1f %12.1f %12.1f\n", r, m.param_bytes / 1048576.0,
                   m.grad_bytes / 1048576.0, m.optimizer_bytes / 1048576.0, m.transient_bytes / 1048576.0,
                   m.activation_peak_bytes / 1048576.0, m.peak_rss_bytes / 1048576.0);
    }
  }
  if (s.memory_limit > 0) {
    double peak = 0;
    for (const RankMemory& m : s.ranks) peak = std::max(peak, m.peak_rss_bytes);
    std::fprintf(stderr, "memory: highest peak RSS %.1f MiB of --memory-limit %.1f MiB per rank (%s)\n",
                 peak / 1048576.0, s.memory_limit / 1048576.0, peak <= s.memory_limit ? "within" : "OVER THE LIMIT");
  }
  for (size_t r = 0; r < s.ranks.size(); r++) {
    const RankMemory& m = s.ranks[r];
    if (m.optimizer_offloaded_bytes + m.param_offloaded_bytes + m.grad_offloaded_bytes > 0)
      std::fprintf(stderr,
                   "offload: rank %zu on disk: optimizer state %.1f MiB, parameters %.1f MiB, gradients %.1f MiB; "
                   "%.1f MiB read and %.1f MiB written per step\n",
                   r, m.optimizer_offloaded_bytes / 1048576.0, m.param_offloaded_bytes / 1048576.0,
                   m.grad_offloaded_bytes / 1048576.0, m.io_read_bytes / 1048576.0 / (double)s.steps_run,
                   m.io_written_bytes / 1048576.0 / (double)s.steps_run);
  }
  if (s.bubble_simulated >= 0)
    std::fprintf(stderr,
                 "pipeline bubble: measured %.1f%%, simulated %.1f%% (same schedule, each stage's measured times "
                 "and message latency), ideal %.1f%%\n",
                 100 * s.bubble_measured, 100 * s.bubble_simulated, 100 * s.bubble_ideal);
}

}  // namespace

// MESHTRAIN_FAULT=RANK:K:KIND: a fault injected into the first attempt (tests; comm/flight_recorder.h).
static std::string env_fault() {
  const char* v = std::getenv("MESHTRAIN_FAULT");
  return v ? v : "";
}

void write_resolved_config(const TrainConfig& cfg, const comm::Communicator* world) {
  if (!cfg.resolved_config_path.empty() && (!world || world->rank() == 0))
    write_file_atomic(cfg.resolved_config_path, cfg.resolved_config);
}

TrainSummary run_training(const TrainConfig& cfg, comm::Communicator* world) {
  cfg.validate(world ? world->size() : 1);
  write_resolved_config(cfg, world);
  set_num_threads(cfg.threads);
  Run run(cfg, world);
  run_steps(run);
  return finish_run(run);
}

int train_main(const TrainConfig& cfg) {
  check_outputs(cfg);  // before any work: a bad --save fails now, not after the last step
  if (cfg.async == AsyncMode::hogwild) {  // threads of this process, not ranks
    MT_CHECK_INPUT(!comm::under_mpirun(), "--async hogwild runs threads of one process: do not start it under mpirun");
    report(cfg, run_hogwild(cfg));
    return 0;
  }
  if (cfg.nproc == 1 && cfg.max_restarts == 0 && !comm::under_mpirun() && cfg.backend != BackendKind::mpi) {
    report(cfg, run_training(cfg, nullptr));
    return 0;
  }
  MT_CHECK_INPUT(cfg.max_restarts == 0 || !comm::under_mpirun(), "--max-restarts ", cfg.max_restarts,
                 " under mpirun: restarts are the shm launcher's (--nproc); under mpirun the job is mpirun's");
  // One attempt: the launcher over cfg's ranks; train/elastic.h restarts failed ones (--max-restarts).
  auto attempt = [&](const TrainConfig& c, bool first) {
    comm::LaunchOptions lo;
    lo.nproc = c.nproc;
    lo.backend = flag_name(c.backend);
    lo.timeout_s = c.comm_timeout;
    lo.threads_per_rank = c.threads;
    if (first) lo.fault = env_fault();
    lo.flight_file = flight_file(c);
    if (!comm::under_mpirun()) {
      c.validate(c.nproc);
      if (auto check = model_entry(c.model).check_shape) check(c);
    }
    return comm::launch_result(lo, [&](comm::Communicator& world) {
      TrainSummary s = run_training(c, &world);
      if (world.rank() == 0) report(c, s);
    });
  };
  return run_elastic(cfg, attempt);
}

}  // namespace mt::train
