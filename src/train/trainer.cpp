#include "train/trainer.h"

#include <sys/sysinfo.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <limits>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"
#include "comm/launch.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/fs.h"
#include "optim/optimizer.h"
#include "parallel/async/param_server.h"
#include "parallel/compress/exchange.h"
#include "parallel/data/data_parallel.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/schedule.h"
#include "plan/bubble.h"
#include "parallel/tensor/tp_ops.h"
#include "tensor/blas.h"
#include "trace/chrome_trace.h"
#include "trace/metrics.h"
#include "train/divergence_guard.h"
#include "train/preflight.h"
#include "train/task.h"

namespace mt::train {

namespace {
double host_memory_bytes() {
  struct sysinfo si {};
  if (::sysinfo(&si) != 0) return 1e300;  // unknown: no limit
  return ((double)si.totalram + (double)si.totalswap) * si.mem_unit;
}
}  // namespace

void TrainConfig::validate(int world_size) const {
  MT_CHECK_INPUT(model == "gpt" || model == "mlp", "--model must be gpt or mlp, got '", model, "'");
  MT_CHECK_INPUT(!data.empty(), "--data is required");
  MT_CHECK_INPUT(batch_size > 0, "--batch-size must be positive, got ", batch_size);
  MT_CHECK_INPUT(seq_len > 0, "--seq-len must be positive, got ", seq_len);
  MT_CHECK_INPUT(steps > 0, "--steps must be positive, got ", steps);
  MT_CHECK_INPUT(optimizer == "adamw" || optimizer == "sgd", "--optimizer must be adamw or sgd, got '", optimizer,
                 "'");
  MT_CHECK_INPUT(lr >= 0 && std::isfinite(lr), "--lr must be finite and >= 0, got ", lr);
  MT_CHECK_INPUT(min_lr == -1 || (min_lr >= 0 && min_lr <= lr), "--min-lr must be in [0, --lr ", lr, "], got ", min_lr);
  MT_CHECK_INPUT(weight_decay >= 0 && weight_decay * lr <= 1, "--weight-decay must be >= 0 with --weight-decay x --lr <= 1 (the decay would overshoot zero), got ", weight_decay, " (--lr ", lr, ")");
  MT_CHECK_INPUT(momentum >= 0 && momentum < 1, "--momentum must be in [0, 1), got ", momentum);
  MT_CHECK_INPUT(!std::isnan(grad_clip), "--grad-clip must be a number (<= 0: off), got ", grad_clip);
  MT_CHECK_INPUT(comm_timeout > 0, "--comm-timeout must be > 0 seconds (inf: wait forever), got ", comm_timeout);
  MT_CHECK_INPUT(bucket_mb > 0 && bucket_mb <= 1048576, "--bucket-mb must be in (0, 1048576], got ", bucket_mb);
  MT_CHECK_INPUT(val_fraction > 0 && val_fraction < 1, "--val-fraction must be in (0, 1), got ", val_fraction);
  MT_CHECK_INPUT(keep_checkpoints >= 0, "--keep-checkpoints must be >= 0 (0: all), got ", keep_checkpoints);
  MT_CHECK_INPUT(log_every >= 1, "--log-every must be >= 1, got ", log_every);
  MT_CHECK_INPUT(virtual_stages >= 1, "--virtual-stages must be >= 1, got ", virtual_stages);
  MT_CHECK_INPUT(warmup_steps >= 0, "--warmup-steps must be >= 0, got ", warmup_steps);
  MT_CHECK_INPUT(beta1 >= 0 && beta1 < 1, "--beta1 must be in [0, 1), got ", beta1);
  MT_CHECK_INPUT(beta2 >= 0 && beta2 < 1, "--beta2 must be in [0, 1), got ", beta2);
  MT_CHECK_INPUT(eps > 0 && std::isfinite(eps), "--eps must be finite and positive, got ", eps);
  MT_CHECK_INPUT(threads >= 1, "--threads must be >= 1, got ", threads);
  // Shape sizes in double (no integer wrap); a flag left at 0 (taken from --init) counts as 1 here.
  const double gC = std::max(gpt.n_embd, 1), gV = std::max(gpt.vocab_size, 1), gP = std::max(gpt.n_positions, 1), gL = std::max(gpt.n_layer, 1);
  MT_CHECK_INPUT(model != "gpt" || std::max({gV, gP, 4 * gC}) * gC < 2147483648.0, "the GPT shape (--n-embd ", gpt.n_embd, " --vocab-size ", gpt.vocab_size, " --n-positions ", gpt.n_positions, ") gives a tensor of ", std::max({gV, gP, 4 * gC}) * gC, " elements (", std::max({gV, gP, 4 * gC}) * gC * 4, " bytes); one tensor is limited to 2^31 elements");
  const double gpt_weight_bytes = 4 * ((gV + gP) * gC + gL * (12 * gC * gC + 13 * gC)), host_bytes = host_memory_bytes();
  MT_CHECK_INPUT(model != "gpt" || gpt_weight_bytes <= host_bytes, "the GPT shape (--n-layer ", gpt.n_layer, " --n-embd ", gpt.n_embd, " --vocab-size ", gpt.vocab_size, " --n-positions ", gpt.n_positions, ") needs ", gpt_weight_bytes, " bytes for its weights alone (every rank gathers them whole to save) but this host has ", host_bytes, " bytes of memory and swap; reduce it");
  MT_CHECK_INPUT(save_every >= 0, "--save-every must be >= 0, got ", save_every);
  MT_CHECK_INPUT(save_every == 0 || !checkpoint_dir.empty(), "--save-every needs --checkpoint-dir");
  MT_CHECK_INPUT(stop_at_step >= 0, "--stop-at-step must be >= 0, got ", stop_at_step);
  MT_CHECK_INPUT(stop_at_step == 0 || !checkpoint_dir.empty(), "--stop-at-step ", stop_at_step, " ends the run early to be resumed: it needs --checkpoint-dir (else the work is lost)");
  MT_CHECK_INPUT(!overwrite_checkpoints || (resume.empty() && !checkpoint_dir.empty()), "--overwrite-checkpoints needs --checkpoint-dir and a fresh run (not --resume)");
  MT_CHECK_INPUT(divergence_factor == 0 || (divergence_factor > 1 && std::isfinite(divergence_factor)), "--divergence-factor must be 0 (off) or finite and > 1, got ", divergence_factor);
  MT_CHECK_INPUT(divergence_window >= 1, "--divergence-window must be >= 1, got ", divergence_window);
  MT_CHECK_INPUT(eval_every >= 0 && eval_batches >= 1, "--eval-every must be >= 0 and --eval-batches >= 1");
  MT_CHECK_INPUT(eval_every == 0 || model == "mlp" || !val_data.empty(), "--eval-every needs --val-data");
  MT_CHECK_INPUT(nproc >= 1, "--nproc must be >= 1, got ", nproc);
  MT_CHECK_INPUT(grad_comm_dtype == "f32" || grad_comm_dtype == "bf16", "--grad-comm-dtype must be f32 or bf16, got '",
                 grad_comm_dtype, "'");
  MT_CHECK_INPUT(tp >= 1, "--tp must be >= 1, got ", tp);
  MT_CHECK_INPUT(pp >= 1, "--pp must be >= 1, got ", pp);
  MT_CHECK_INPUT(schedule.empty() || pp > 1, "--schedule ", schedule, " needs --pp > 1");
  MT_CHECK_INPUT(stage_layers.empty() || pp > 1, "--stage-layers needs --pp > 1");
  MT_CHECK_INPUT(zero >= 0 && zero <= 3, "--zero must be 0, 1, 2 or 3, got ", zero);
  if (pp > 1) {
    MT_CHECK_INPUT(model == "gpt", "--pp ", pp, " needs --model gpt");
    // ZeRO 2 and 3 shard gradients and parameters layer by layer inside the backward pass; under a pipeline
    // the schedule owns that pass, and stage 1 already shards the optimizer state, the largest part.
    MT_CHECK_INPUT(zero <= 1, "--zero ", zero, " with --pp is not supported: use --zero 1 (optimizer state ",
                   "sharded over the data-parallel group) or 0");
  }
  if (tp > 1) {
    MT_CHECK_INPUT(model == "gpt", "--tp ", tp, " needs --model gpt (the MLP has no tensor-parallel layers)");
  }
  MT_CHECK_INPUT(async.empty() || async == "ps" || async == "hogwild", "--async must be ps or hogwild, got '", async,
                 "'");
  MT_CHECK_INPUT(async == "ps" || (servers == -1 && staleness == 0), "--servers and --staleness need --async ps");
  if (!async.empty()) {
    MT_CHECK_INPUT(zero == 0 && tp == 1 && pp == 1 && compress.empty() && local_sgd == 0, "--async ", async,
                   " works with plain data parallelism only (no --zero, --tp, --pp, --compress, --local-sgd)");
  }
  if (async == "ps") {
    MT_CHECK_INPUT(servers == -1 || servers >= 1, "--servers must be >= 1, got ", servers);
    MT_CHECK_INPUT(staleness >= 0, "--staleness must be >= 0, got ", staleness);
    MT_CHECK_INPUT(world_size > ps_servers(), "--async ps needs at least one worker besides the ",
                   ps_servers(), " server(s) of --servers: --nproc (or mpirun -np) ", world_size, " is too few");
  }
  if (async == "hogwild") {
    MT_CHECK_INPUT(model == "mlp" && optimizer == "sgd", "--async hogwild is lock-free SGD on shared parameters: ",
                   "it needs --model mlp and --optimizer sgd");
    MT_CHECK_INPUT(backend != "mpi", "--async hogwild runs threads of one process (shared memory), not --backend mpi");
  }
  if (!straggler.empty()) {
    const size_t colon = straggler.find(':');
    MT_CHECK_INPUT(colon != std::string::npos && colon > 0 && colon + 1 < straggler.size() &&
                       straggler.find_first_not_of("0123456789:") == std::string::npos,
                   "--straggler must be RANK:MS (e.g. 1:50), got '", straggler, "'");
    MT_CHECK_INPUT(std::stoi(straggler.substr(0, colon)) < world_size, "--straggler rank ",
                   straggler.substr(0, colon), " does not exist: there are ", world_size, " ranks");
  }
  const int workers_n = workers(world_size);
  MT_CHECK_INPUT(workers_n % (tp * pp) == 0, "the number of ranks (", world_size, ": --nproc or mpirun -np) is ",
                 "not divisible by --tp ", tp, " x --pp ", pp);
  const int d = dp == 0 ? workers_n / (tp * pp) : dp;
  MT_CHECK_INPUT(d * tp * pp == workers_n, "--dp ", d, " x --tp ", tp, " x --pp ", pp, " must equal the number of ",
                 async == "ps" ? "workers (ranks minus --servers): " : "ranks (--nproc or mpirun -np): ", workers_n);
  const int mbs = micro_batch_size;
  MT_CHECK_INPUT(mbs >= 0, "--micro-batch-size must be >= 0, got ", mbs);
  MT_CHECK_INPUT(batch_size % (d * (mbs > 0 ? mbs : 1)) == 0, "--batch-size ", batch_size,
                 " is not divisible by --dp ", d, " x --micro-batch-size ", mbs > 0 ? mbs : 1);
  const compress::CompressSpec cspec = compress::parse_compress_spec(compress);
  if (cspec.enabled() || local_sgd > 0) {
    const char* what = cspec.enabled() ? "--compress" : "--local-sgd";
    MT_CHECK_INPUT(d > 1, what, " needs data parallelism (--nproc > 1): with one rank nothing is exchanged");
    MT_CHECK_INPUT(zero == 0 && tp == 1 && pp == 1, what, " works with plain data parallelism only (--zero 0, no ",
                   "--tp/--pp), got --zero ", zero, " --tp ", tp, " --pp ", pp);
    MT_CHECK_INPUT(!(cspec.enabled() && local_sgd > 0), "--compress and --local-sgd are alternatives: choose one");
  }
  MT_CHECK_INPUT(local_sgd >= 0 && local_sgd_warmup >= 0, "--local-sgd and --local-sgd-warmup must be >= 0");
  MT_CHECK_INPUT(local_sgd > 0 || (local_sgd_warmup == 0 && !local_sgd_state),
                 "--local-sgd-warmup and --local-sgd-state need --local-sgd H");
  MT_CHECK_INPUT(cspec.enabled() || !compress_adaptive, "--compress-adaptive needs --compress METHOD");
  MT_CHECK_INPUT(compress_adaptive_every >= 1 && compress_adaptive_eta > 0,
                 "--compress-adaptive-every must be >= 1 and --compress-adaptive-eta > 0");
  if (sequence_parallel) {
    MT_CHECK_INPUT(tp > 1, "--sequence-parallel needs --tp > 1");
    const int64_t rows = (int64_t)(mbs > 0 ? mbs : batch_size / d) * seq_len;  // token rows per micro-batch
    MT_CHECK_INPUT(rows % tp == 0, "--sequence-parallel splits the ", rows, " token rows of a micro-batch (",
                   mbs > 0 ? "--micro-batch-size" : "--batch-size / --dp", " x --seq-len ", seq_len,
                   ") over --tp ", tp, ": they must be divisible");
  }
  if (pp > 1) {
    const int micro = mbs > 0 ? batch_size / d / mbs : 1;  // micro-batches per data-parallel rank
    pipeline::validate({schedule.empty() ? "1f1b" : schedule, pp, micro, virtual_stages});
  }
}

namespace {

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& cfg, size_t n) {
  if (cfg.optimizer == "sgd")
    return std::make_unique<optim::Sgd>(n, optim::SgdConfig{(float)cfg.momentum, (float)cfg.weight_decay});
  return std::make_unique<optim::AdamW>(
      n, optim::AdamWConfig{(float)cfg.beta1, (float)cfg.beta2, (float)cfg.eps, (float)cfg.weight_decay});
}

// Sums a few doubles across ranks (as float32, which is what comm reduces).
void sum_across(comm::Communicator* world, double* v, int n) {
  if (!world || world->size() == 1) return;
  std::vector<float> in(v, v + n), out(n);
  world->all_reduce(in.data(), out.data(), n, comm::DType::f32, comm::ReduceOp::sum);
  for (int i = 0; i < n; i++) v[i] = out[i];
}

}  // namespace

TrainSummary run_training(const TrainConfig& cfg, comm::Communicator* world) {
  const int world_size = world ? world->size() : 1, world_rank = world ? world->rank() : 0;
  const bool lead = world_rank == 0;
  cfg.validate(world_size);
  if (lead && !cfg.checkpoint_dir.empty()) checkpoint::clean_checkpoint_dir(cfg.checkpoint_dir, cfg.overwrite_checkpoints);
  set_num_threads(cfg.threads);
  // The mesh: tensor-parallel ranks adjacent (world rank = dp index * tp + tp index), then data-parallel.
  // world rank = (pp_rank * dp + rank) * tp + tp_rank; `rank` is the data-parallel index.
  // Parameter server: ranks 0..W-1 are the workers (the data-parallel ranks), the last S hold the parameters.
  const bool ps = cfg.async == "ps";
  const parallel::PsLayout psl{cfg.workers(world_size), cfg.ps_servers(), cfg.staleness};
  const bool server = ps && psl.is_server(world_rank);
  const int tp = cfg.tp, pp = cfg.pp, nranks = cfg.workers(world_size) / (tp * pp);
  const int tp_rank = world_rank % tp, rank = server ? 0 : (world_rank / tp) % nranks,
            pp_rank = server ? 0 : world_rank / (tp * nranks);
  comm::Communicator* dp_group = world;
  std::unique_ptr<comm::Communicator> tp_group, dp_split, pp_group, tie_group, mp_group, ps_split;
  if (ps) {
    ps_split = world->split(server ? 1 : 0, world_rank, server ? "ps.servers" : "ps.workers");
    dp_group = server ? nullptr : ps_split.get();
  }
  const int straggler_rank = cfg.straggler.empty() ? -1 : std::stoi(cfg.straggler);
  const int straggler_ms = cfg.straggler.empty() ? 0 : std::stoi(cfg.straggler.substr(cfg.straggler.find(':') + 1));
  std::unique_ptr<parallel::CommTensorParallelOps> tp_ops;
  if (tp > 1) {
    tp_group = world->split(world_rank / tp, tp_rank, "tp");
    tp_ops = std::make_unique<parallel::CommTensorParallelOps>(*tp_group);
  }
  if (tp * pp > 1) {
    dp_split = world->split(pp_rank * tp + tp_rank, rank, "dp");
    dp_group = dp_split.get();
    // Everything that holds one model replica: files are assembled over it.
    mp_group = world->split(rank, pp_rank * tp + tp_rank, "mp");
  }
  PipelineContext pctx;
  if (pp > 1) {
    pp_group = world->split(rank * tp + tp_rank, pp_rank, "pp");
    // First and last stage of a replica hold the tied wte: their gradients are summed.
    tie_group = world->split(pp_rank == 0 || pp_rank == pp - 1 ? rank * tp + tp_rank : -1, pp_rank, "tie");
    pctx = {pp_group.get(), pp, cfg.virtual_stages, cfg.schedule.empty() ? "1f1b" : cfg.schedule};
  }
  std::unique_ptr<TrainTask> task =
      cfg.model == "gpt" ? make_gpt_task(cfg, tp_ops.get(), pp > 1 ? &pctx : nullptr) : make_mlp_task(cfg);
  nn::ParamRegistry& params = task->params();
  // Files hold whole tensors: `full` lays them out unsharded; to_full/from_full convert this rank's flat
  // buffers (collective over the tensor-parallel group).
  nn::ParamRegistry full;
  task->declare_full(full);
  auto to_full = [&](const float* local, std::vector<float>& out) {
    out.assign(full.size(), 0.0f);
    for (const nn::Param& p : params.params()) {
      const nn::Param& f = full.get(p.name);
      if (p.name == "wte.weight" && pp_rank != 0) continue;  // the last stage's tied copy
      if (p.shard.axis < 0) {
        if (tp_rank == 0) std::memcpy(out.data() + f.offset, local + p.offset, sizeof(float) * p.numel);
      } else {
        for (size_t i = 0; i < p.numel; i++) out[f.offset + (size_t)p.full_index(i)] = local[p.offset + i];
      }
    }
    if (mp_group) mp_group->all_reduce(out.data(), out.data(), out.size(), comm::DType::f32, comm::ReduceOp::sum);
  };
  auto from_full = [&](const float* in, float* local) {
    for (const nn::Param& p : params.params()) {
      const nn::Param& f = full.get(p.name);
      for (size_t i = 0; i < p.numel; i++)
        local[p.offset + i] = in[f.offset + (p.shard.axis < 0 ? i : (size_t)p.full_index(i))];
    }
  };
  parallel::DataParallelOptions dpo;
  dpo.zero = cfg.zero;
  dpo.bucket_mb = cfg.bucket_mb;
  dpo.grad_dtype = cfg.grad_comm_dtype == "bf16" ? comm::DType::bf16 : comm::DType::f32;
  // Compression and Local SGD exchange what they choose themselves: the engine then reduces nothing.
  const compress::CompressSpec cspec = compress::parse_compress_spec(cfg.compress);
  const bool own_exchange = cspec.enabled() || cfg.local_sgd > 0 || ps;
  parallel::DataParallel engine(params, own_exchange ? nullptr : dp_group, dpo);
  std::unique_ptr<compress::GradientExchange> exchange;
  if (cspec.enabled())
    exchange = std::make_unique<compress::GradientExchange>(
        params, dp_group, cspec,
        compress::AdaptiveOptions{cfg.compress_adaptive, cfg.compress_adaptive_every, cfg.compress_adaptive_eta},
        cfg.seed);
  trace::ChromeTrace tracer;
  if (!cfg.trace.empty()) {
    tracer.enable(world_rank);
    engine.set_trace(&tracer);
  }
  engine.initialize([&](nn::Param& p) { task->init_param(p); });
  task->prepare();
  // A parameter server keeps the optimizer state of its slice; its workers keep none.
  const comm::Shard ps_slice = server ? psl.slice(params.size(), world_rank - psl.workers) : comm::Shard{};
  auto opt = make_optimizer(cfg, server ? ps_slice.count : ps ? 0 : engine.state_size());
  // Local SGD: every rank's parameters (and optionally optimizer state) replaced by their mean over the group.
  auto average_replicas = [&]() {
    if (nranks == 1) return;
    auto average = [&](float* v, size_t n) {
      dp_group->all_reduce(v, v, n, comm::DType::f32, comm::ReduceOp::sum);
      const float inv = 1.0f / (float)nranks;
      for (size_t i = 0; i < n; i++) v[i] *= inv;
    };
    average(params.data(), params.size());
    if (cfg.local_sgd_state)
      for (auto& [name, buf] : opt->state()) average(buf->data(), buf->size());
  };
  optim::LrSchedule sched{cfg.lr, cfg.min_lr < 0 ? cfg.lr / 10 : cfg.min_lr, cfg.warmup_steps, cfg.steps};
  auto metadata = task->metadata();
  const int B = task->global_batch(), per_rank = B / nranks, first = rank * per_rank;
  const int64_t items_per_step = (int64_t)B * task->items_per_window();

  // Checkpoints written or resumed by this run, oldest first: (step, path).
  std::vector<std::pair<int64_t, std::string>> checkpoints;
  int64_t start = 0;
  if (!cfg.resume.empty()) {
    std::string path = checkpoint::resolve_checkpoint(cfg.resume);
    std::vector<float> whole(full.size()), local(params.size());
    std::vector<std::vector<float>> whole_states;
    checkpoint::NamedFlatOut outs;
    auto state = opt->state();
    whole_states.resize(state.size(), std::vector<float>(full.size()));
    for (size_t k = 0; k < state.size(); k++) outs.push_back({state[k].first, whole_states[k].data()});
    nlohmann::json st = checkpoint::load_checkpoint(path, full, whole.data(), outs);
    from_full(whole.data(), local.data());
    engine.load_full_params(local.data());
    for (size_t k = 0; k < state.size(); k++) {
      from_full(whole_states[k].data(), local.data());
      if (server)
        std::memcpy(state[k].second->data(), local.data() + ps_slice.offset, ps_slice.count * sizeof(float));
      else if (!ps)
        engine.load_full_state(local.data(), state[k].second->data());
    }
    start = st["step"].get<int64_t>();
    // A different batch, seed or data file continues the run, but not as the one saved: say so.
    auto warn_if_changed = [&](const char* key, const char* flag, const nlohmann::json& now) {
      if (lead && st.contains(key) && st[key] != now)
        std::fprintf(stderr, "meshtrain: warning: %s was saved with %s %s; resuming with %s\n", path.c_str(), flag,
                     st[key].dump().c_str(), now.dump().c_str());
    };
    warn_if_changed("batch_size", "--batch-size", cfg.batch_size);
    warn_if_changed("seed", "--seed", cfg.seed);
    warn_if_changed("data", "--data", cfg.data);
    MT_CHECK_INPUT(st.value("model", cfg.model) == cfg.model, path, " holds a ", st.value("model", ""),
                   " model but --model is ", cfg.model);
    MT_CHECK_INPUT(st.value("optimizer", cfg.optimizer) == cfg.optimizer, path, " was trained with ",
                   st.value("optimizer", ""), " but --optimizer is ", cfg.optimizer);
    MT_CHECK_INPUT(start <= cfg.steps, path, " is at step ", start, ", beyond --steps ", cfg.steps);
    checkpoints.push_back({start, path});
  }

  trace::MetricsWriter metrics;
  if (lead && !cfg.metrics.empty())
    metrics = cfg.resume.empty() ? trace::MetricsWriter(cfg.metrics, false) : trace::MetricsWriter::resume_at(cfg.metrics, start);
  trace::Progress progress(start, cfg.steps, cfg.log_every, cfg.progress && lead, task->item_name());
  if (!checkpoints.empty())
    progress.message("resumed from " + checkpoints.back().second + " at step " + std::to_string(start));
  if (ps)
    progress.message(str("training on ", world_size, " ranks (", world->backend(), "): parameter server, ",
                         psl.workers, " workers (ranks 0-", psl.workers - 1, ", ", per_rank, " of ", B,
                         " windows each) and ", psl.servers, " servers (ranks ", psl.workers, "-", world_size - 1,
                         ", about ", params.size() / psl.servers, " parameters each), staleness bound ",
                         psl.staleness));
  else if (world_size > 1)
    progress.message(str("training on ", world_size, " ranks (", world->backend(), "): data-parallel ", nranks,
                         " x tensor-parallel ", tp, cfg.sequence_parallel ? " (sequence-parallel)" : "",
                         " x pipeline ", pp,
                         pp > 1 ? " (" + pctx.schedule + ")" : std::string(), ", ZeRO stage ", cfg.zero, ", ",
                         per_rank, " of ", B, " windows per data-parallel rank"));

  // Collective: every rank gathers what it shards; rank 0 writes.
  std::vector<float> full_params, scratch;
  std::unique_ptr<parallel::PsServer> ps_server;
  // Parameter server: the servers' slices (parameters, or optimizer state buffer k) summed into one flat
  // buffer over the world; everyone else adds zeros.
  auto from_servers = [&](const float* slice, std::vector<float>& out) {
    out.assign(params.size(), 0.0f);
    if (server) std::memcpy(out.data() + ps_slice.offset, slice, ps_slice.count * sizeof(float));
    world->all_reduce(out.data(), out.data(), out.size(), comm::DType::f32, comm::ReduceOp::sum);
  };
  auto gather_params = [&]() {
    // Local SGD: replicas differ between syncs; what is saved is their average (a sync, which the run keeps).
    if (cfg.local_sgd > 0) average_replicas();
    if (ps)
      from_servers(server ? ps_server->slice() : nullptr, scratch);
    else
      engine.full_params(scratch);
    to_full(scratch.data(), full_params);
  };
  auto gather_state = [&](std::vector<std::vector<float>>& states, checkpoint::NamedFlat& named) {
    auto st = opt->state();  // a parameter-server worker's buffers are empty, but named the same
    states.resize(st.size());
    for (size_t k = 0; k < st.size(); k++) {
      if (ps)
        from_servers(st[k].second->data(), scratch);
      else
        engine.full_state(st[k].second->data(), scratch);
      to_full(scratch.data(), states[k]);
      named.push_back({st[k].first, states[k].data()});
    }
  };
  auto save_ckpt = [&](int64_t next_step) {
    gather_params();
    std::vector<std::vector<float>> states;
    checkpoint::NamedFlat named;
    gather_state(states, named);
    if (!lead) return;
    nlohmann::json st = {{"step", next_step},         {"model", cfg.model},      {"optimizer", cfg.optimizer},
                         {"seed", cfg.seed},          {"batch_size", cfg.batch_size},
                         {"seq_len", cfg.seq_len},    {"data", cfg.data},
                         {"data_position", next_step * items_per_step},
                         {"dp", nranks},              {"tp", tp}, {"pp", pp},    {"zero", cfg.zero},
                         {"rng", {{"seed", cfg.seed}, {"counter", 0}}}};
    std::string path = checkpoint::save_checkpoint(cfg.checkpoint_dir, next_step, full, full_params.data(), named,
                                                   metadata, st, cfg.keep_checkpoints);
    checkpoints.push_back({next_step, path});
  };

  // Each element of the model counted once in the gradient norm: tensors replicated over the tensor-parallel
  // group count on its rank 0 only, and the last pipeline stage's copy of the tied wte not at all (the first
  // stage's holds the same summed gradient).
  std::vector<bool> not_counted;
  for (const nn::Param& p : params.params())
    not_counted.push_back((p.shard.axis < 0 && tp_rank != 0) || (pp > 1 && pp_rank == pp - 1 && p.name == "wte.weight"));
  nn::Param* tied = pp > 1 && (pp_rank == 0 || pp_rank == pp - 1) ? params.find("wte.weight") : nullptr;
  task->set_trace(cfg.trace.empty() ? nullptr : &tracer);
  if (pp > 1)
    progress.message(str("pipeline stages (blocks): ", pipeline::describe_split(task->stage_layers()),
                         cfg.stage_layers.empty() ? " (balanced by estimated cost)" : " (--stage-layers)"));

  StepHooks hooks;
  if (pp == 1) {  // the pipeline reduces gradients after its schedule instead of bucket by bucket
    hooks.params = &engine;
    hooks.micro_batch = [&](int i, int n) { engine.begin_micro_batch(i, n); };
  }

  // What happens after step s: evaluation, a checkpoint, the end of the run (--stop-at-step).
  auto stop_after = [&](int64_t s) { return cfg.stop_at_step > 0 && s + 1 == cfg.stop_at_step; };
  auto eval_after = [&](int64_t s) {
    return task->has_eval() && cfg.eval_every > 0 && ((s + 1) % cfg.eval_every == 0 || s + 1 == cfg.steps);
  };
  auto save_after = [&](int64_t s) {
    return !cfg.checkpoint_dir.empty() &&
           ((cfg.save_every > 0 && (s + 1) % cfg.save_every == 0) || stop_after(s) ||
            s + 1 == cfg.steps);  // --checkpoint-dir alone: one checkpoint at the end
  };
  // Evaluates the parameters after step s (collective over the data-parallel group) into the step's row.
  auto evaluate = [&](int64_t s, nlohmann::json& row) {
    EvalSums ev = task->evaluate(cfg.eval_batches, rank, nranks, pp > 1 ? nullptr : &engine);
    double v[3] = {ev.loss, ev.correct, ev.count};
    if (pp > 1) sum_across(pp_group.get(), v, 3);  // only the last stage has them
    sum_across(dp_group, v, 3);
    double vloss = v[0] / v[2];
    row["val_loss"] = vloss;
    char buf[96];
    if (task->is_classifier()) {
      row["val_accuracy"] = v[1] / v[2];
      std::snprintf(buf, sizeof buf, "step %lld: val loss %.4f, val accuracy %.2f%%", (long long)s + 1, vloss,
                    100 * v[1] / v[2]);
    } else {
      std::snprintf(buf, sizeof buf, "step %lld: val loss %.4f", (long long)s + 1, vloss);
    }
    progress.message(buf);
  };
  auto straggle = [&]() {
    if (world_rank == straggler_rank) std::this_thread::sleep_for(std::chrono::milliseconds(straggler_ms));
  };

  // Stops a diverged run: steps from `bad_from` (0-based) on computed on bad weights, so the last good
  // checkpoint is the newest one saved before that step; `latest` is pointed at it. `what` names the step as
  // the progress line does (1-based).
  DivergenceGuard guard(cfg.divergence_factor, cfg.divergence_window);
  auto stop_diverged = [&](int64_t bad_from, const std::string& what) {
    progress.finish();
    std::string good;
    for (auto it = checkpoints.rbegin(); it != checkpoints.rend(); ++it) {
      if (it->first < bad_from && std::filesystem::exists(it->second + "/state.json")) {
        good = it->second;
        break;
      }
    }
    if (lead && !cfg.checkpoint_dir.empty() && !good.empty() && good != checkpoints.back().second)
      checkpoint::set_latest(cfg.checkpoint_dir, std::filesystem::path(good).filename().string());
    throw DivergedError(str(what, "; training stopped. ",
                            checkpoints.empty() ? std::string("No checkpoint was written")
                            : good.empty()      ? "No good checkpoint exists (" + checkpoints.back().second +
                                                 " holds the weights that diverge)"
                                                : "The last good checkpoint is " + good,
                            " (try a lower --lr or --grad-clip)"));
  };

  uint64_t comm_bytes_total = 0;
  TrainSummary sum;
  double timed_s = 0;
  int64_t timed_steps = 0;
  const std::string items_key = std::string(task->item_name()) == "tok" ? "tokens_per_s" : "examples_per_s";
  // Parameter server (parallel/async/param_server.h): servers apply the steps, workers compute them on
  // parameters at most --staleness versions old. The lead (worker 0) writes a step's row once the version it
  // produced arrives with the step's loss and norm; evaluation and checkpoints wait for that version.
  std::vector<double> ps_begun, ps_staleness;  // worker: when each step began computing (s), its staleness
  auto run_ps_steps = [&]() {
    std::vector<double> begun, staleness;
    auto diverged = [&](int64_t s, double loss, double norm) {
      return DivergedError(str(!std::isfinite(loss) ? "loss" : "gradient norm", " is ",
                               !std::isfinite(loss) ? loss : norm, " at step ", s + 1,
                               "; training stopped (try a lower --lr or --grad-clip)"));
    };
    if (server) {
      ps_server = std::make_unique<parallel::PsServer>(*world, ps_split.get(), params, psl, world_rank - psl.workers);
      const double nan = std::numeric_limits<double>::quiet_NaN();
      ps_server->publish({start, nan, nan, 0});
      for (int64_t s = start; s < cfg.steps; s++) {
        const double loss = ps_server->gather(s) / (double)items_per_step;
        const double norm = ps_server->grad_norm();
        const float lr = sched.at(s);
        if (std::isfinite(loss) && std::isfinite(norm)) {
          if (cfg.grad_clip > 0 && norm + 1e-6 > cfg.grad_clip)
            ps_server->scale_grad((float)(cfg.grad_clip / (norm + 1e-6)));
          opt->step(ps_server->slice(), ps_server->grad(), ps_server->segments(), lr, s);
        }
        ps_server->publish({s + 1, loss, norm, lr});  // a non-finite loss tells the workers to stop too
        if (!std::isfinite(loss) || !std::isfinite(norm)) {
          ps_server->flush();
          throw diverged(s, loss, norm);
        }
        sum.steps_run++;
        sum.final_loss = loss;
        if (save_after(s)) save_ckpt(s + 1);
        if (stop_after(s)) break;
      }
      ps_server->flush();
      return;
    }
    const int64_t end = cfg.stop_at_step > 0 ? std::min<int64_t>(cfg.stop_at_step, cfg.steps) : cfg.steps;
    parallel::PsWorker worker(*world, params, psl, end);  // `end`: the last version it takes
    // Rows of steps whose version has not arrived yet (the lead's): step -> row.
    std::map<int64_t, nlohmann::json> rows;
    auto on_version = [&](const parallel::VersionInfo& v) {
      if (v.version <= start) return;  // the starting parameters
      const int64_t s = v.version - 1;
      if (!std::isfinite(v.loss) || !std::isfinite(v.norm)) throw diverged(s, v.loss, v.norm);
      if (auto g = guard.observe(s + 1, v.loss)) throw DivergedError(g->message + "; training stopped (try a lower --lr)");
      nlohmann::json& row = rows[s];
      row["loss"] = v.loss;
      row["grad_norm"] = v.norm;
      row["lr"] = v.lr;
    };
    // Writes the rows that are whole (this worker's part and the servers'), in step order.
    auto write_rows = [&]() {
      while (!rows.empty() && rows.begin()->second.contains("loss") && rows.begin()->second.contains("step")) {
        nlohmann::json& row = rows.begin()->second;
        const double loss = row["loss"];
        progress.step(row["step"].get<int64_t>(), loss, row["lr"].get<double>(), row[items_key].get<double>());
        metrics.write(row);
        sum.final_loss = loss;
        rows.erase(rows.begin());
      }
    };
    for (int64_t s = start; s < end; s++) {
      auto t0 = std::chrono::steady_clock::now();
      const uint64_t sent0 = world->counters().total_sent();
      const int64_t have = worker.acquire(std::max<int64_t>(start, s - cfg.staleness), on_version);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      write_rows();
      begun.push_back(trace::ChromeTrace::now_us() * 1e-6);
      staleness.push_back((double)(s - have));
      engine.begin_step();
      const double loss_sum = task->forward_backward(s, first, per_rank, hooks);
      straggle();
      engine.finish_backward();
      worker.push(s, loss_sum);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s > start) {
        timed_s += dt;
        timed_steps++;
      }
      const uint64_t sent = world->counters().total_sent() - sent0;
      comm_bytes_total += sent;
      nlohmann::json& row = rows[s];
      row["step"] = s;
      row[items_key] = (double)items_per_step / dt;
      row["step_time_s"] = dt;
      row["wait_s"] = waited;              // this worker's wait for fresh enough parameters
      row["staleness"] = s - have;          // versions between the parameters used and step s
      row["comm_bytes"] = sent;
      row["comm_bytes_total"] = comm_bytes_total;
      sum.steps_run++;
      const bool eval_now = eval_after(s), save_now = save_after(s);
      if (eval_now || save_now || s + 1 == end) {
        worker.acquire(s + 1, on_version);  // the parameters after step s, everywhere
        if (eval_now) evaluate(s, rows[s]);
      }
      write_rows();
      if (save_now) save_ckpt(s + 1);
    }
    worker.flush();
    write_rows();
    if (end < cfg.steps) progress.message("stopped after step " + std::to_string(end) + " (--stop-at-step)");
    ps_begun = std::move(begun);
    ps_staleness = std::move(staleness);
  };
  if (ps) {
    run_ps_steps();
  } else
  for (int64_t s = start; s < cfg.steps; s++) {
    auto t0 = std::chrono::steady_clock::now();
    const uint64_t sent0 = dp_group ? dp_group->counters().total_sent() : 0;
    engine.begin_step();
    double loss = task->forward_backward(s, first, per_rank, hooks);
    straggle();
    engine.finish_backward();
    // Local SGD: exact data parallelism during the warm-up, then each rank steps on its own windows' mean.
    const bool local_step = cfg.local_sgd > 0 && s >= cfg.local_sgd_warmup;
    if (exchange) {
      trace::TraceScope ts(&tracer, "compressed gradient exchange (" + cspec.str() + ")", "comm");
      exchange->exchange(s);
    } else if (cfg.local_sgd > 0 && !local_step && nranks > 1) {
      dp_group->all_reduce(params.grad(), params.grad(), params.size(), comm::DType::f32, comm::ReduceOp::sum);
    } else if (local_step) {
      engine.scale_grads((float)nranks);
    }
    if (pp > 1) {
      const double t0 = trace::ChromeTrace::now_us();
      if (tied) tie_group->all_reduce(tied->grad, tied->grad, tied->numel, comm::DType::f32, comm::ReduceOp::sum);
      const double t1 = trace::ChromeTrace::now_us();
      engine.reduce_all();
      if (tracer.enabled()) {
        if (tied) tracer.add(trace::Track::comm, "all_reduce tied wte (first + last stage)", "comm", t0, t1);
        if (nranks > 1)
          tracer.add(trace::Track::comm, cfg.zero ? "reduce_scatter gradients (dp)" : "all_reduce gradients (dp)",
                     "comm", t1, trace::ChromeTrace::now_us());
      }
      sum_across(pp_group.get(), &loss, 1);  // only the last stage computed it
    }
    sum_across(dp_group, &loss, 1);  // tensor-parallel peers hold the same loss
    loss /= (double)items_per_step;
    double norm;
    if (tp * pp == 1) {
      norm = engine.grad_norm();
    } else {
      auto [all, skip] = engine.grad_sq(not_counted);
      double sq[1] = {all - skip};
      sum_across(mp_group.get(), sq, 1);  // the parts of one replica add up over its tensor x pipeline ranks
      norm = std::sqrt(std::max(0.0, sq[0]));
    }
    if (!std::isfinite(loss) || !std::isfinite(norm))
      stop_diverged(s, str(!std::isfinite(loss) ? "loss" : "gradient norm", " is ", !std::isfinite(loss) ? loss : norm,
                           " at step ", s + 1));
    if (auto v = guard.observe(s + 1, loss)) stop_diverged(v->first_step - 1, v->message);
    if (cfg.grad_clip > 0 && norm + 1e-6 > cfg.grad_clip) engine.scale_grads((float)(cfg.grad_clip / (norm + 1e-6)));
    float lr = sched.at(s);
    {
      trace::TraceScope ts(&tracer, "optimizer step", "compute");
      engine.update(*opt, lr, s);
    }
    bool synced = false;  // Local SGD: the parameters were averaged after this step
    if (local_step && (s + 1 - cfg.local_sgd_warmup) % cfg.local_sgd == 0) {
      average_replicas();
      synced = true;
    }
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double ips = (double)items_per_step / dt;
    if (s > start) {
      timed_s += dt;
      timed_steps++;
    } else if (auto* ps = task->pipeline_stats()) {
      *ps = {};  // the first step allocates: time the others
    }

    nlohmann::json row = {{"step", s}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
                          {std::string(task->item_name()) == "tok" ? "tokens_per_s" : "examples_per_s", ips},
                          {"step_time_s", dt}};
    // Bytes this rank sent on the data-parallel group in this step (gradient reduction, compressed payloads,
    // Local SGD averaging): what the communication-efficient methods are judged by.
    const uint64_t sent = dp_group ? dp_group->counters().total_sent() - sent0 : 0;
    comm_bytes_total += sent;
    row["comm_bytes"] = sent;
    row["comm_bytes_total"] = comm_bytes_total;
    if (exchange && cfg.compress_adaptive) {
      row["compress_light"] = exchange->light_fraction();
      row["compress_levels"] = exchange->light_layers();
    }
    if (cfg.local_sgd > 0) row["synced"] = !local_step || synced;
    if (eval_after(s)) evaluate(s, row);
    metrics.write(row);
    progress.step(s, loss, lr, ips);
    sum.steps_run++;
    sum.final_loss = loss;

    const bool stop_here = stop_after(s);
    if (save_after(s)) save_ckpt(s + 1);
    if (stop_here) {
      progress.message("stopped after step " + std::to_string(s + 1) + " (--stop-at-step)");
      break;
    }
  }
  progress.finish();
  nlohmann::json ps_json;
  if (ps) {
    const parallel::PsReport r = parallel::measure_staleness(*world, psl, server ? &ps_server->stats() : nullptr,
                                                             ps_begun, ps_staleness, start, sum.steps_run);
    ps_json = {{"workers", psl.workers},         {"servers", psl.servers},
               {"staleness_bound", psl.staleness}, {"max_staleness", r.max_staleness},
               {"mean_staleness", r.mean_staleness}, {"staleness_counts", r.staleness_counts}};
    if (r.measured) ps_json["max_ahead"] = r.max_ahead;
    progress.message(str("parameter server: staleness used max ", r.max_staleness, ", mean ", r.mean_staleness,
                         r.measured ? str("; most steps any worker ran ahead of the slowest: ", r.max_ahead) : "",
                         " (bound ", psl.staleness, ")"));
  }
  if (!cfg.save.empty()) {
    gather_params();
    if (lead) {
      metadata["format"] = "pt";
      checkpoint::save_params(cfg.save, full, metadata, full_params.data());
    }
  }

  if (!cfg.trace.empty()) {
    // Every rank writes its events next to the target; rank 0 merges them after a barrier.
    std::string part = trace::trace_part_path(cfg.trace, world_rank);
    write_file_atomic(part, tracer.events_json());
    if (world && world_size > 1) world->barrier();
    if (lead) {
      std::vector<std::string> bodies;
      for (int r = 0; r < world_size; r++) {
        std::string pr = trace::trace_part_path(cfg.trace, r);
        bodies.push_back(read_file(pr));
        std::filesystem::remove(pr);
      }
      trace::ChromeTrace::write_merged(cfg.trace, bodies);
    }
  }

  sum.items_per_s = timed_steps ? (double)items_per_step * timed_steps / timed_s : 0;
  sum.flops_per_step = task->flops_per_step();
  sum.params = (int64_t)full.size();
  constexpr int kF = 7;
  double mine[kF] = {(double)engine.param_bytes(),      (double)engine.grad_bytes(),        0.0,
                     (double)task->activation_bytes(per_rank), (double)peak_rss_bytes(),
                     (double)engine.transient_bytes(),  (double)task->activation_peak_bytes()};
  for (auto& [n, b] : opt->state()) mine[2] += (double)b->bytes();
  std::vector<float> all(kF * world_size), in(kF);
  for (int i = 0; i < kF; i++) in[i] = (float)(mine[i] / 1024.0);  // KiB: exact in float32 up to 16 GiB
  if (world && world_size > 1)
    world->all_gather(in.data(), all.data(), kF * world_size, comm::DType::f32);
  else
    all = in;
  for (int r = 0; r < world_size; r++) {
    const float* v = &all[kF * r];
    sum.ranks.push_back({v[0] * 1024.0, v[1] * 1024.0, v[2] * 1024.0, v[3] * 1024.0, v[4] * 1024.0, v[5] * 1024.0,
                         v[6] * 1024.0});
  }
  // Pipeline bubble of replica 0 (data-parallel index 0, tensor-parallel index 0), measured and simulated.
  nlohmann::json pipe_json;
  if (pp > 1) {
    const int V = pctx.virtual_stages;
    const size_t k = plan::packed_size(V);
    std::vector<float> mine_p(k), all_p(k * world_size);
    plan::pack(task->pipeline_stats() ? *task->pipeline_stats() : pipeline::PipelineStats{}, V, mine_p.data());
    world->all_gather(mine_p.data(), all_p.data(), all_p.size(), comm::DType::f32);
    std::vector<pipeline::PipelineStats> ranks;
    for (int j = 0; j < pp; j++) ranks.push_back(plan::unpack(&all_p[k * (j * nranks * tp)], V));
    const int mbs = cfg.micro_batch_size > 0 ? cfg.micro_batch_size : per_rank;
    const pipeline::ScheduleSpec spec{pctx.schedule, pp, per_rank / mbs, V};
    // On one host (shm) the ranks share a clock, so message latencies are measured; not across hosts.
    const plan::BubbleReport b = plan::bubble_report(spec, ranks, std::string(world->backend()) == "shm");
    if (b.measured >= 0) {
      sum.bubble_measured = b.measured;
      sum.bubble_simulated = b.simulated;
      sum.bubble_ideal = b.ideal;
      pipe_json = {{"schedule", spec.name},
                   {"stages", pp},
                   {"micro_batches", spec.micro_batches},
                   {"virtual_stages", spec.virtual_stages},
                   {"stage_layers", task->stage_layers()},
                   {"bubble_measured", b.measured},
                   {"bubble_simulated", b.simulated},
                   {"bubble_ideal", b.ideal},
                   {"bubble_simulated_without_message_latency", b.simulated_free_messages},
                   {"message_latency_ms", b.cost.comm},
                   {"stage_forward_ms", b.cost.stage_forward},
                   {"stage_backward_ms", b.cost.stage_backward}};
    }
  }
  if (lead && !cfg.summary.empty()) {
    nlohmann::json j = {{"tokens_per_s", sum.items_per_s}, {"zero", cfg.zero},  {"dp", nranks}, {"tp", tp},
                        {"pp", pp},                        {"params", sum.params},   {"steps", sum.steps_run},
                        {"final_loss", sum.final_loss}};
    if (!pipe_json.is_null()) j["pipeline"] = pipe_json;
    if (!ps_json.is_null()) j["ps"] = ps_json;
    for (int r = 0; r < world_size; r++) {
      const RankMemory& m = sum.ranks[r];
      j["ranks"].push_back({{"rank", r},
                            {"param_bytes", m.param_bytes},
                            {"grad_bytes", m.grad_bytes},
                            {"optimizer_bytes", m.optimizer_bytes},
                            {"activation_bytes", m.activation_bytes},
                            {"transient_bytes", m.transient_bytes},
                            {"activation_peak_bytes", m.activation_peak_bytes},
                            {"peak_rss_bytes", m.peak_rss_bytes}});
    }
    write_file_atomic(cfg.summary, j.dump(2) + "\n");
  }
  return sum;
}

int train_main(const TrainConfig& cfg) {
  check_outputs(cfg);  // before any work: a bad --save fails now, not after the last step
  auto report = [&](const TrainSummary& s) {
    if (!cfg.progress || s.steps_run == 0) return;
    std::fprintf(stderr, "done: %lld steps, final loss %.4f, %.0f %s/s\n", (long long)s.steps_run, s.final_loss,
                 s.items_per_s, cfg.model == "gpt" ? "tokens" : "examples");
    if (s.ranks.size() > 1 || cfg.zero > 0) {
      std::fprintf(stderr, "%6s %12s %12s %12s %12s %12s %12s  (MiB; activations: measured peak)\n", "rank",
                   "params", "grads", "optimizer", "transient", "activations", "peak RSS");
      for (size_t r = 0; r < s.ranks.size(); r++) {
        const RankMemory& m = s.ranks[r];
        std::fprintf(stderr, "%6zu %12.1f %12.1f %12.1f %12.1f %12.1f %12.1f\n", r, m.param_bytes / 1048576.0,
                     m.grad_bytes / 1048576.0, m.optimizer_bytes / 1048576.0, m.transient_bytes / 1048576.0,
                     m.activation_peak_bytes / 1048576.0, m.peak_rss_bytes / 1048576.0);
      }
    }
    if (s.bubble_simulated >= 0)
      std::fprintf(stderr, "pipeline bubble: measured %.1f%%, simulated %.1f%% (same schedule, each stage's "
                   "measured times and message latency), ideal %.1f%%\n", 100 * s.bubble_measured, 100 * s.bubble_simulated, 100 * s.bubble_ideal);
  };
  if (cfg.async == "hogwild") {  // threads of this process, not ranks
    MT_CHECK_INPUT(!comm::under_mpirun(), "--async hogwild runs threads of one process: do not start it under mpirun");
    report(run_hogwild(cfg));
    return 0;
  }
  comm::LaunchOptions lo;
  lo.nproc = cfg.nproc;
  lo.backend = cfg.backend;
  lo.timeout_s = cfg.comm_timeout;
  if (cfg.nproc == 1 && !comm::under_mpirun() && cfg.backend != "mpi") {
    report(run_training(cfg, nullptr));
    return 0;
  }
  if (!comm::under_mpirun()) {
    // One message from the parent, not one per rank.
    cfg.validate(cfg.nproc);
    if (cfg.model == "gpt" && (cfg.tp > 1 || !cfg.stage_layers.empty())) {
      std::optional<SafetensorsReader> init;
      if (!cfg.init.empty()) init.emplace(cfg.init);
      const model::GptConfig shape = gpt_shape(cfg, init ? &*init : nullptr);
      MT_CHECK_INPUT(shape.n_head % cfg.tp == 0, "n_head (", shape.n_head, ") is not divisible by --tp (", cfg.tp,
                     "): tensor parallelism splits attention by whole heads");
      if (!cfg.stage_layers.empty())
        pipeline::check_stage_layers(cfg.stage_layers, cfg.pp * cfg.virtual_stages, shape.n_layer);
    }
  }
  return comm::launch(lo, [&](comm::Communicator& world) {
    TrainSummary s = run_training(cfg, &world);
    if (world.rank() == 0) report(s);
  });
}

}  // namespace mt::train
