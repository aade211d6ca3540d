// Assembling a run from its parts (run.h), in the order every rank follows: the mesh's splits and the
// engine's allocation are collective or order-sensitive.
#include "train/run.h"

#include <malloc.h>

#include <chrono>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "core/memory.h"
#include "optim/adafactor.h"
#include "optim/lamb.h"
#include "optim/dgc_adam.h"
#include "optim/onebit_adam.h"
#include "parallel/async/param_server.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/schedule_generator.h"
#include "tensor/blas.h"
#include "offload/shard_file.h"
#include "train/offload.h"
#include "train/model_registry.h"
#include "train/pipemare.h"
#include "train/ps_sync.h"
#include "train/back_to_back.h"
#include "train/micro_window_steps.h"
#include "train/no_flush_steps.h"
#include "train/sync_window_steps.h"
#include "train/weight_versions.h"

namespace mt::train {

double StepMeter::finish(int64_t s, nlohmann::json& row) {
  const double dt = StepClock::since(t0_), ips = (double)r_.items_per_step / dt;
  if (s > r_.start) {
    r_.clock.seconds += dt;
    r_.clock.steps++;
  } else if (auto* ps = r_.executor->stats()) {
    *ps = {};  // the first step allocates: time the others
  }
  const uint64_t sent = bytes_() - sent0_;
  r_.comm_bytes_total += sent;
  row[r_.log->items_key()] = ips;
  row["step_time_s"] = dt;
  row["comm_bytes"] = sent;
  row["comm_bytes_total"] = r_.comm_bytes_total;
  r_.sum.steps_run++;
  return ips;
}

void Straggler::pause(int me) const {
  if (me == rank) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& cfg, size_t n, const nn::ParamRegistry& params) {
  const optim::AdamWConfig adam{(float)cfg.beta1, (float)cfg.beta2, (float)cfg.eps, (float)cfg.weight_decay};
  switch (cfg.optimizer) {
    case OptimizerKind::sgd:  // --dgc: the momentum is applied in the exchange (dgc.h)
      return std::make_unique<optim::Sgd>(
          n, optim::SgdConfig{cfg.dgc ? 0.0f : (float)cfg.momentum, (float)cfg.weight_decay});
    case OptimizerKind::lamb:
      return std::make_unique<optim::Lamb>(
          n, optim::LambConfig{(float)cfg.beta1, (float)cfg.beta2, (float)cfg.eps, (float)cfg.weight_decay});
    case OptimizerKind::adafactor:
      return std::make_unique<optim::Adafactor>(n, params, optim::AdafactorConfig{(float)cfg.weight_decay});
    case OptimizerKind::onebit_adam:
      return std::make_unique<optim::OnebitAdam>(n, optim::OnebitAdamConfig{adam, cfg.freeze_step});
    case OptimizerKind::adamw:
      if (cfg.dgc && cfg.freeze_step >= 0)  // DGC with AdamW: AdamW, then the variance frozen (dgc_adam.h)
        return std::make_unique<optim::DgcAdam>(n, optim::DgcAdamConfig{adam, cfg.freeze_step, (float)cfg.dgc_lr_scale});
      break;
  }
  return std::make_unique<optim::AdamW>(n, adam);
}

optim::LrSchedule lr_schedule(const TrainConfig& cfg) {
  return {cfg.lr, cfg.min_lr < 0 ? cfg.lr / 10 : cfg.min_lr, cfg.warmup_steps, cfg.steps};
}

namespace {

parallel::MeshGrid grid_of(const TrainConfig& cfg, comm::Communicator* world) {
  parallel::MeshGrid g(world ? world->size() : 1, cfg.dp, cfg.tp, cfg.pp, cfg.async == AsyncMode::ps ? cfg.ps_servers() : 0,
                       cfg.moe.ep);
  // A placement that holds every stage twice (chimera's two pipelines) sums each stage's two copies over the
  // pair of ranks holding them (the placement does not depend on the micro-batch count).
  if (cfg.pp > 1 && !cfg.schedule.empty()) {
    const pipeline::ScheduleGenerator& gen = pipeline::find_schedule(cfg.schedule);
    g.set_mirrored(gen.placement({cfg.schedule, cfg.pp, 2, cfg.virtual_stages}).routes() == 2);
  }
  return g;
}

parallel::PsLayout ps_layout(const TrainConfig& cfg, const parallel::MeshGrid& g) {
  return {g.workers(), g.servers(), cfg.staleness};
}

}  // namespace

Run::~Run() {
  if (store && store->versions()) store->versions()->stop();
  if (store) store->stop_update();
}

Run::Run(const TrainConfig& c, comm::Communicator* world)
    : cfg(c),
      mesh(world, grid_of(c, world)),
      layout(c, mesh.grid().dp()),
      tail(c.dgc && c.freeze_step < 0 ? 0.0 : c.grad_clip, lr_schedule(c)),  // --dgc: each rank clips its share in the exchange
      // (--dgc --freeze-step: the global gradient before K, each rank's share after, as 1-bit Adam)
      straggler(mesh.server() ? Straggler{} : c.straggler) {  // --straggler slows a worker, never a server
  // --memory-limit: buffers of 1 MiB and more are mapped on their own and go back to the system when freed. glibc
  // otherwise raises its mmap threshold after the first large free, so later large buffers come from the heap and
  // stay resident after they are freed: the 4x run of tests/cli/test_offload_shards.py measured 82 MiB peak RSS
  // against 56 MiB with the threshold fixed, depending only on how the heap happened to lie (the length of argv).
  if (cfg.offload.memory_limit > 0) {
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 20);
  }
  // Leftovers of killed saves go; another run's checkpoints are refused unless --overwrite-checkpoints.
  if ((world ? world->rank() : 0) == 0 && !cfg.checkpoint_dir.empty())
    checkpoint::clean_checkpoint_dir(cfg.checkpoint_dir, cfg.overwrite_checkpoints);
  const parallel::MeshGrid& g = mesh.grid();
  if (g.tp() > 1) tp_ops = std::make_unique<parallel::CommTensorParallelOps>(*mesh.tp());
  if (g.pp() > 1) pipeline = {mesh.pp(), layout.schedule(), pipeline::make_schedule(layout.schedule())};
  if (g.ep() > 1) ep_ops = std::make_unique<parallel::CommExpertParallelOps>(*mesh.ep());
  task = model_entry(cfg.model).make(cfg, layout, {tp_ops.get(), g.pp() > 1 ? &pipeline : nullptr, ep_ops.get()});
  nn::ParamRegistry& params = task->params();
  task->declare_full(full);  // files hold whole tensors
  if (!cfg.trace.empty()) tracer.enable(mesh.world_rank());
  SyncOptions sync_options = SyncOptions::from(cfg);
  executor = mesh.server() ? make_server_executor()
                            : make_step_executor(*task, g.pp() > 1 ? &pipeline : nullptr,
                                                 cfg.trace.empty() ? nullptr : &tracer,
                                                 parallel::needs_hooks(sync_options.engine));
  // pipedream-2bw without a flush between steps where the run allows it (train/no_flush_steps.h).
  if (!mesh.server() && g.pp() > 1 && no_flush_applies(cfg, layout.schedule().micro_batches)) {
    NoFlushParts parts;
    parts.share = [this](int64_t s) { return layout.share(mesh.coord().dp, s); };
    parts.window_ends_after = [this](int64_t s) {
      return cadence.eval_after(s) || cadence.save_after(s) || cadence.last_after(s);
    };
    parts.swap_versions = [this] {  // (--precision bf16: the products read the mirror of the version swapped in)
      store->versions()->before_forward();
      store->refresh_mirror();
    };
    parts.params = &params;
    if (split_exchange_applies(cfg))
      parts.split = [this, reg = &params] {
        return std::make_unique<SplitExchange>(
            *reg, store->segments(),
            SplitExchange::Groups{mesh.group(parallel::MeshGroup::tie), mesh.dp(), mesh.pp(), mesh.replica()});
      };
    executor = make_no_flush_steps(*task, pipeline, cfg.trace.empty() ? nullptr : &tracer, std::move(parts));
  }
  // pipedream and pipemare without a flush between steps where the run allows it (train/micro_window_steps.h).
  if (!mesh.server() && g.pp() > 1 && micro_window_applies(cfg, layout.schedule().micro_batches)) {
    MicroWindowParts parts;
    parts.share = [this](int64_t s) { return layout.share(mesh.coord().dp, s); };
    parts.window_ends_after = [this](int64_t s) {
      return cadence.eval_after(s) || cadence.save_after(s) || cadence.last_after(s);
    };
    executor = make_micro_window_steps(*task, pipeline, cfg.trace.empty() ? nullptr : &tracer, std::move(parts));
  }
  // 1f1b / zb-h1 / zb-h2 without clipping: steps back to back, each stage updating once its own gradient (and the
  // tied copy) is in (train/sync_window_steps.h).
  if (!mesh.server() && g.pp() > 1 && sync_window_applies(cfg, sync_options)) {
    SyncWindowParts parts;
    parts.share = [this](int64_t s) { return layout.share(mesh.coord().dp, s); };
    parts.window_ends_after = [this](int64_t s) {
      return cadence.eval_after(s) || cadence.save_after(s) || cadence.last_after(s);
    };
    parts.tie_ready = [this](int64_t s) { sync->tie_ready(s); };
    executor = make_sync_window_steps(*task, pipeline, cfg.trace.empty() ? nullptr : &tracer, std::move(parts));
  }
  task->set_trace(cfg.trace.empty() ? nullptr : &tracer);
  sync_options.overlapped = executor->calls_hooks();
  const StoreGroups store_on = store_groups(sync_options, mesh);
  try {  // --offload params / grads create their files here
    store = std::make_unique<parallel::DataParallel>(params, store_on.group, sync_options.engine, store_on.experts);
  } catch (const InputError& e) {
    throw InputError(str("rank ", mesh.world_rank(), ": ", e.what()));
  }
  if (tracer.enabled()) store->set_trace(&tracer);
  std::vector<offload::ShardFile*> files = store->shard_files();
  if (cfg.offload.activations) {  // --offload-activations: the task's activation store spills to a file
    nn::ActivationStore* acts = task->activation_store();
    MT_CHECK_INPUT(acts, "--offload-activations needs a model that keeps per-block activations (--model gpt)");
    offload::ShardFile::Options fo;
    fo.dir = cfg.offload.dir;
    fo.kind = "activations";
    fo.timeout_s = cfg.comm_timeout;
    fo.record_events = tracer.enabled();
    fo.io_block = offload_io_block(cfg);
    try {
      acts->set_tier(std::make_unique<offload::ShardFile>(fo));
      files.push_back(acts->tier());
    } catch (const InputError& e) {
      throw InputError(str("rank ", mesh.world_rank(), ": ", e.what()));
    }
  }
  offload.add_shards(files);
  store->set_tensor_group(mesh.tp());  // tensors split over tp: whole-tensor statistics sum there
  const bool ps = cfg.async == AsyncMode::ps;
  if (!ps) sync = make_grad_sync(sync_options, mesh, *store, params, &tracer);
  store->initialize([&](nn::Param& p) { task->init_param(p); });
  task->prepare();
  // The delay-1 rule (--delayed-update, pipedream-2bw): a second weight version beside the store's.
  store->set_versions(make_weight_versions(cfg, g.pp() > 1 ? &pipeline.schedule : nullptr));
  executor->set_versions(store->versions());
  // A parameter server keeps the optimizer state of its slice; its workers keep none.
  const parallel::PsLayout psl = ps_layout(cfg, g);
  const size_t state_size = mesh.server() ? psl.slice(params.size(), mesh.world_rank() - psl.workers).count
                            : ps          ? 0
                                          : store->state_size();
  opt = offload.wrap(cfg, mesh.world_rank(), make_optimizer(cfg, state_size, params), tracer.enabled());
  // PipeMare's learning-rate rescheduling: this stage's step size by its delay (train/pipemare.h).
  if (cfg.pipemare_lr_anneal > 0) opt = pipemare_lr_schedule(std::move(opt), g.pp(), mesh.coord().pp, cfg.pipemare_lr_anneal);
  if (ps) {  // the exchange and the source share a server's slice
    PsParts parts = make_ps_parts(mesh, *store, params, psl, Cadence::from(cfg, false).end(), tail, &tracer);
    sync = std::move(parts.sync);
    source = std::move(parts.source);
  } else {
    source = engine_source(*store);
  }
  // Local experts (--ep > 1): files gather over the ep group too, on every rank alike.
  comm::Communicator* ep_files = local_experts(cfg) ? mesh.ep() : nullptr;
  const ReplicaPlace place{!ep_files || ep_files->rank() == 0};
  state = std::make_unique<Consolidation>(StateConsolidator(params, full, place, mesh.replica(), ep_files), *source,
                                          *opt);
  state->set_before_gather([this] { sync->before_gather(*opt); });
  items_per_step = (int64_t)layout.global_batch() * task->items_per_window();
  ckpt = std::make_unique<Checkpointer>(cfg, *state, mesh, task->metadata(), items_per_step);
  // The budget, before any optimizer state exists (allocated by resume's load or the first update) and before
  // the first step's activations.
  // The tile the update streams (the tier's: the swapper's is never larger than the state it holds).
  const optim::StateTier* tier = opt->state().tier();
  const size_t tile_bytes = tier ? tier->tile_elems() * sizeof(float) : (size_t)cfg.offload.tile_bytes;
  plan = MemoryPlan{(double)current_rss_bytes(),   (double)store->param_bytes(),
                        (double)store->grad_bytes(),   (double)opt->state().bytes(),
                        (double)opt->state().offloaded_bytes(), (double)task->activation_bytes(),
                        (double)(offload.staging_bytes() + store->offload_buffer_bytes(tile_bytes)),
                        (double)offload.staging_held()};
  plan.scratch = (double)task->backward_scratch_bytes();
  plan.products = (double)task->product_scratch_bytes();
  plan.transient = (double)zero_transient_bytes(store->buckets(), cfg.zero, cfg.offload.params);
  plan.allowance = memory_allowance(world ? world->size() : 1);
  check_memory_plan(plan, cfg.offload.memory_limit, mesh.world_rank(), cfg.offload.optimizer);
  sync->attach_optimizer(*opt);
  ckpt->set_exchange_state(dynamic_cast<ExchangeState*>(sync.get()));
  start = ckpt->resume();
  log = std::make_unique<RunLog>(cfg, mesh.lead(), start, task->item_name());
  log->set_checkpointer(ckpt.get());  // a metrics row that cannot be written names the last checkpoint
  rows = std::make_unique<RowQueue>(*log, sum);
  sync->set_outcome_sink([this](int64_t s, const StepOutcome& o) {
    if (o.fields.is_object() && !o.fields.empty()) rows->local(s, o.fields);  // before the outcome completes the row
    rows->outcome(s, o.loss, o.norm, o.lr);
  });
  evaluate = std::make_unique<Evaluator>(*task, mesh, cfg.eval_batches, store.get(), *log);
  cadence = Cadence::from(cfg, task->has_eval() && !mesh.server());  // a server holds no model to evaluate
  // Synchronous runs name the last good checkpoint (and point "latest" at it); parameter-server steps are
  // checked on the servers and as versions arrive, where no checkpoint is in step with the failure.
  if (ps) {
    tail.add_check(std::make_unique<NonFiniteCheck>());
    tail.add_check(std::make_unique<SpikeCheck>(cfg.divergence_factor, cfg.divergence_window));
  } else {
    auto advice = [this](int64_t s) {
      log->finish();
      return ckpt->diverged_advice(s);
    };
    tail.add_check(std::make_unique<NonFiniteCheck>(nullptr, advice));
    tail.add_check(std::make_unique<SpikeCheck>(cfg.divergence_factor, cfg.divergence_window, advice));
  }
  announce();
  task->set_trace(cfg.trace.empty() ? nullptr : &tracer);
}

// The lines a run opens with: resume point, layout, pipeline split.
void Run::announce() {
  const parallel::MeshGrid& g = mesh.grid();
  const int B = layout.global_batch(), b = layout.per_rank(), W = g.world();
  const char* backend = mesh.world() ? mesh.world()->backend() : "";
  {
    // Ranks of a shared-memory job share this machine's cores: more threads than cores slows every rank.
    const int cores = (int)std::thread::hardware_concurrency();
    const int here = std::string(backend) == "shm" ? W : 1;
    log->message(str("compute: ", cfg.threads, " thread(s) per rank, GEMM ", gemm_kernel_line(),
                     cores > 0 && here * cfg.threads > cores
                         ? str("; warning: ", here, " rank(s) x ", cfg.threads, " thread(s) > ", cores,
                               " cores, lower --threads")
                         : std::string()));
  }
  if (!ckpt->written().empty())
    log->message("resumed from " + ckpt->written().back().second + " at step " + std::to_string(start));
  if (g.servers() > 0)
    log->message(str("training on ", W, " ranks (", backend, "): parameter server, ", g.workers(),
                     " workers (ranks 0-", g.workers() - 1, ", ", b, " of ", B, " windows each) and ", g.servers(),
                     " servers (ranks ", g.workers(), "-", W - 1, ", about ", task->params().size() / g.servers(),
                     " parameters each), staleness bound ", cfg.staleness));
  else if (W > 1)
    log->message(str("training on ", W, " ranks (", backend, "): ",
                     g.describe(cfg.sequence_parallel ? " (sequence-parallel)" : "",
                                g.pp() > 1 ? " (" + layout.schedule().name + ")" : ""),
                     ", ZeRO stage ", cfg.zero, ", ", b, " of ", B, " windows per data-parallel rank"));
  if (g.pp() > 1)
    log->message(str("pipeline stages (blocks): ", pipeline::describe_split(task->stage_layers()),
                     cfg.stage_layers.empty() ? " (balanced by estimated cost)" : " (--stage-layers)"));
  if (const std::string note = back_to_back_note(cfg); !note.empty()) log->message(note);
  if (g.pp() > 1 && !mesh.server()) {
    const std::string name = layout.schedule().name;
    std::string why;
    if (sync_window_applies(cfg, SyncOptions::from(cfg), &why))
      log->message(str(name, " back to back: each stage updates once its own gradient and the tied wte's other copy "
                             "are in, with no barrier between steps (the loss and gradient norm of a row are "
                             "reduced when its window ends: every evaluation, checkpoint and the last step)"));
    else if (name == "1f1b" || name == "zb-h1" || name == "zb-h2")
      log->message(str(name, ": every step ends with the update's reductions over all stages (not back to back: ",
                       why, ")"));
  }
  if (store->versions() && !delay_one(cfg)) {
    log->message(str("per-micro-batch updates (changes the math): --schedule ", layout.schedule().name,
                     " updates each stage after every micro-batch's backward; ",
                     cfg.vertical_sync ? "--vertical-sync: micro-batch i reads stage 0's version on every stage"
                                       : "each backward reads the version its forward read (stashed)"));
    std::string why;
    if (micro_window_applies(cfg, layout.schedule().micro_batches, &why))
      log->message("no flush between steps: step t+1's forwards run while step t's last backwards and updates "
                   "drain (windows of steps end at every evaluation, checkpoint and the last step)");
    else
      log->message("--schedule " + layout.schedule().name + " flushes between steps here: " + why);
  } else if (store->versions()) {
    log->message("delay-1 update (changes the math): step t's gradient is taken at W(t-1) and applied to W(t); "
                 "two weight versions kept");
    std::string why;
    if (g.pp() > 1 && no_flush_applies(cfg, layout.schedule().micro_batches, &why)) {
      log->message("pipedream-2bw without a flush: step t+1's forwards run while step t's last backwards drain "
                   "(windows of steps end at every evaluation, checkpoint and the last step)");
      std::string no_split;
      log->message(split_exchange_applies(cfg, &no_split)
                       ? "pipedream-2bw: step t's reductions start after each rank's last backward of t and finish "
                         "at its update (no blocking collective inside the window)"
                       : "pipedream-2bw: the updates run blocking collectives inside the window: " + no_split);
    } else if (g.pp() > 1 && cfg.schedule == "pipedream-2bw")
      log->message("pipedream-2bw flushes between steps here: " + why);
  }
}

}  // namespace mt::train
