// TrainConfig::validate: every flag and combination checked once, before any work starts, with the values in
// the message. The mesh (parallel/mesh/grid.h) and the batch layout (train/layout.h) check their own part.
#include <sys/sysinfo.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "comm/shm/job.h"
#include "core/error.h"
#include "parallel/compress/spec.h"
#include "parallel/mesh/grid.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_generator.h"
#include "train/layout.h"
#include "train/sma_sync.h"
#include "train/train_config.h"

namespace mt::train {

Straggler Straggler::parse(const std::string& flag) {
  const size_t colon = flag.find(':');
  const bool ok = colon != std::string::npos && colon > 0 && colon + 1 < flag.size() && colon <= 9 &&
                  flag.size() - colon - 1 <= 9 && flag.find_first_not_of("0123456789:") == std::string::npos &&
                  flag.find(':', colon + 1) == std::string::npos;
  MT_CHECK_INPUT(ok, "--straggler must be RANK:MS with non-negative integers (e.g. 1:50), got '", flag, "'");
  return {std::stoi(flag.substr(0, colon)), std::stoi(flag.substr(colon + 1))};
}

namespace {
double host_memory_bytes() {
  struct sysinfo si {};
  if (::sysinfo(&si) != 0) return 1e300;  // unknown: no limit
  return ((double)si.totalram + (double)si.totalswap) * si.mem_unit;
}

// The model's shape and the data: tensor sizes in double (no integer wrap); a flag left at 0 (taken from --init)
// counts as 1 here.
void check_model(const TrainConfig& c) {
  MT_CHECK_INPUT(!c.data.empty(), "--data is required");
  MT_CHECK_INPUT(c.batch_size > 0, "--batch-size must be positive, got ", c.batch_size);
  MT_CHECK_INPUT(c.seq_len > 0, "--seq-len must be positive, got ", c.seq_len);
  MT_CHECK_INPUT(c.val_fraction > 0 && c.val_fraction < 1, "--val-fraction must be in (0, 1), got ", c.val_fraction);
  MT_CHECK_INPUT(c.threads >= 1 && c.threads <= kMaxThreads, "--threads must be in 1..", kMaxThreads,
                 " (more only contend for the cores), got ", c.threads);
  if (c.model != ModelKind::gpt) return;
  // A dimension left at 0 takes --init's value (unknown here: counted as 1) or the default (gpt_task.cpp).
  const model::GptConfig& gpt = c.gpt;
  const bool from_init = !c.init.empty();
  auto dim = [&](int v, int dflt) { return (double)(v > 0 ? v : from_init ? 1 : dflt); };
  auto desc = [&](const char* flag, int v, int dflt) {
    return v > 0 ? str(flag, " ", v) : from_init ? str(flag, " from --init") : str(flag, " ", dflt, " (default)");
  };
  const int dP = std::max(256, c.seq_len);
  const double gC = dim(gpt.n_embd, 128), gV = dim(gpt.vocab_size, 256), gP = dim(gpt.n_positions, dP),
               gL = dim(gpt.n_layer, 4);
  const std::string shape3 = str(desc("--n-embd", gpt.n_embd, 128), ", ", desc("--vocab-size", gpt.vocab_size, 256),
                                 ", ", desc("--n-positions", gpt.n_positions, dP));
  const double largest = std::max({gV, gP, 4 * gC}) * gC;
  MT_CHECK_INPUT(largest < 2147483648.0, "the GPT shape (", shape3, ") gives a tensor of ", largest, " elements (",
                 largest * 4, " bytes); one tensor is limited to 2^31 elements");
  const double gpt_weight_bytes = 4 * ((gV + gP) * gC + gL * (12 * gC * gC + 13 * gC)),
               host_bytes = host_memory_bytes();
  MT_CHECK_INPUT(gpt_weight_bytes <= host_bytes, "the GPT shape (", desc("--n-layer", gpt.n_layer, 4), ", ", shape3,
                 ") needs ", gpt_weight_bytes, " bytes for its weights alone (every rank gathers them whole to save) ",
                 "but this host has ", host_bytes, " bytes of memory and swap; reduce it");
}

// Steps, optimizer, learning-rate schedule and the divergence stop.
void check_optimizer(const TrainConfig& c) {
  MT_CHECK_INPUT(c.steps > 0, "--steps must be positive, got ", c.steps);
  MT_CHECK_INPUT(c.lr >= 0 && std::isfinite(c.lr), "--lr must be finite and >= 0, got ", c.lr);
  MT_CHECK_INPUT(c.min_lr == -1 || (c.min_lr >= 0 && c.min_lr <= c.lr), "--min-lr must be in [0, --lr ", c.lr,
                 "], got ", c.min_lr);
  MT_CHECK_INPUT(c.weight_decay >= 0 && c.weight_decay * c.lr <= 1,
                 "--weight-decay must be >= 0 with --weight-decay x --lr <= 1 (the decay would overshoot zero), got ",
                 c.weight_decay, " (--lr ", c.lr, ")");
  MT_CHECK_INPUT(c.momentum >= 0 && c.momentum < 1, "--momentum must be in [0, 1), got ", c.momentum);
  MT_CHECK_INPUT(!std::isnan(c.grad_clip), "--grad-clip must be a number (<= 0: off), got ", c.grad_clip);
  MT_CHECK_INPUT(c.warmup_steps >= 0, "--warmup-steps must be >= 0, got ", c.warmup_steps);
  MT_CHECK_INPUT(c.beta1 >= 0 && c.beta1 < 1, "--beta1 must be in [0, 1), got ", c.beta1);
  MT_CHECK_INPUT(c.beta2 >= 0 && c.beta2 < 1, "--beta2 must be in [0, 1), got ", c.beta2);
  MT_CHECK_INPUT(c.eps > 0 && std::isfinite(c.eps), "--eps must be finite and positive, got ", c.eps);
  MT_CHECK_INPUT(c.divergence_factor == 0 || (c.divergence_factor > 1 && std::isfinite(c.divergence_factor)),
                 "--divergence-factor must be 0 (off) or finite and > 1, got ", c.divergence_factor);
  MT_CHECK_INPUT(c.divergence_window >= 1, "--divergence-window must be >= 1, got ", c.divergence_window);
}

// Metrics, checkpoints, evaluation and progress.
void check_outputs(const TrainConfig& c) {
  MT_CHECK_INPUT(c.keep_checkpoints >= 0, "--keep-checkpoints must be >= 0 (0: all), got ", c.keep_checkpoints);
  MT_CHECK_INPUT(c.log_every >= 1, "--log-every must be >= 1, got ", c.log_every);
  MT_CHECK_INPUT(c.save_every >= 0, "--save-every must be >= 0, got ", c.save_every);
  MT_CHECK_INPUT(c.save_every == 0 || !c.checkpoint_dir.empty(), "--save-every needs --checkpoint-dir");
  MT_CHECK_INPUT(c.stop_at_step >= 0, "--stop-at-step must be >= 0, got ", c.stop_at_step);
  MT_CHECK_INPUT(c.max_restarts >= 0 && c.max_restarts <= 1000, "--max-restarts must be in 0..1000, got ",
                 c.max_restarts);
  MT_CHECK_INPUT(c.min_nproc >= 0 && c.min_nproc <= c.nproc, "--min-nproc must be in 1..--nproc (", c.nproc,
                 "), got ", c.min_nproc);
  MT_CHECK_INPUT(c.stop_at_step == 0 || !c.checkpoint_dir.empty(), "--stop-at-step ", c.stop_at_step,
                 " ends the run early to be resumed: it needs --checkpoint-dir (else the work is lost)");
  MT_CHECK_INPUT(c.resume.empty() || !c.checkpoint_dir.empty() || !c.save.empty(), "--resume ", c.resume,
                 " continues a run but nothing would keep its weights: give --checkpoint-dir (e.g. ", c.resume,
                 ") or --save (else the work is lost)");
  // With --resume it may empty another directory, never the one resumed from (preflight.cpp checks).
  MT_CHECK_INPUT(!c.overwrite_checkpoints || !c.checkpoint_dir.empty(),
                 "--overwrite-checkpoints needs --checkpoint-dir");
  MT_CHECK_INPUT(c.eval_every >= 0 && c.eval_batches >= 1, "--eval-every must be >= 0 and --eval-batches >= 1");
  MT_CHECK_INPUT(c.eval_every == 0 || c.model == ModelKind::mlp || !c.val_data.empty(),
                 "--eval-every needs --val-data");
}

// Processes, communication and the tensor/pipeline degrees against the model and ZeRO (the mesh checks that
// the degrees tile the ranks).
void check_layout(const TrainConfig& c) {
  MT_CHECK_INPUT(c.comm_timeout > 0, "--comm-timeout must be > 0 seconds (inf: wait forever), got ", c.comm_timeout);
  MT_CHECK_INPUT(c.bucket_mb > 0 && c.bucket_mb <= 1048576, "--bucket-mb must be in (0, 1048576], got ", c.bucket_mb);
  MT_CHECK_INPUT(c.virtual_stages >= 1, "--virtual-stages must be >= 1, got ", c.virtual_stages);
  // Ranks of the shm launcher, or Hogwild threads: both at most kMaxRanks.
  MT_CHECK_INPUT(c.nproc >= 1 && c.nproc <= comm::shm::kMaxRanks, "--nproc must be in 1..", comm::shm::kMaxRanks,
                 ", got ", c.nproc);
  MT_CHECK_INPUT(c.tp >= 1, "--tp must be >= 1, got ", c.tp);
  MT_CHECK_INPUT(c.pp >= 1, "--pp must be >= 1, got ", c.pp);
  MT_CHECK_INPUT(c.schedule.empty() || pipeline::has_schedule(c.schedule), "--schedule must be one of ",
                 pipeline::schedule_names_joined(), "; got '", c.schedule, "'");
  MT_CHECK_INPUT(c.schedule.empty() || c.pp > 1, "--schedule ", c.schedule, " needs --pp > 1");
  MT_CHECK_INPUT(c.stage_layers.empty() || c.pp > 1, "--stage-layers needs --pp > 1");
  MT_CHECK_INPUT(c.zero >= 0 && c.zero <= 3, "--zero must be 0, 1, 2 or 3, got ", c.zero);
  if (c.pp > 1) {
    MT_CHECK_INPUT(c.model == ModelKind::gpt, "--pp ", c.pp, " needs --model gpt");
  }
  if (c.tp > 1) {
    MT_CHECK_INPUT(c.model == ModelKind::gpt, "--tp ", c.tp,
                   " needs --model gpt (the MLP has no tensor-parallel layers)");
  }
}

// The combinations of the data-parallel methods (--compress, --local-sgd, --async) with each other and with
// the splits of a replica (--zero, --tp, --pp) that stay refused, each with its reason: the one place that
// says so. What is not listed works: --compress and --local-sgd run over the data-parallel group of each
// (tp, pp) coordinate (train/grad_sync.cpp), whatever split of the replica the rank holds. (--async hogwild
// needs --model mlp, check_async, which has no --tp/--pp to combine with.)
struct RefusedCombination {
  bool (*applies)(const TrainConfig&);
  std::string (*flags)(const TrainConfig&);  // the flags as given, for the message
  const char* reason;
};

bool compressing(const TrainConfig& c) { return c.compress.enabled(); }
bool local_sgd(const TrainConfig& c) { return c.local_sgd > 0; }
bool asynchronous(const TrainConfig& c) { return c.async != AsyncMode::off; }
bool onebit(const TrainConfig& c) { return c.optimizer == OptimizerKind::onebit_adam; }
std::string compress_flag(const TrainConfig& c) { return "--compress " + c.compress.str(); }
std::string local_flag(const TrainConfig& c) { return str("--local-sgd ", c.local_sgd); }
std::string async_flag(const TrainConfig& c) { return str("--async ", flag_name(c.async)); }
// A schedule whose update rule keeps two weight versions (pipedream-2bw): asynchronous by the terms.
bool async_schedule(const TrainConfig& c) {
  return c.pp > 1 && !c.schedule.empty() && pipeline::find_schedule(c.schedule).weight_versions() > 1;
}
// A schedule that updates each stage after every micro-batch (pipedream, pipemare), given by name.
bool micro_update_name(const TrainConfig& c) {
  return !c.schedule.empty() && pipeline::has_schedule(c.schedule) &&
         pipeline::find_schedule(c.schedule).micro_updates() != pipeline::ScheduleGenerator::MicroUpdates::none;
}
bool micro_update_schedule(const TrainConfig& c) { return c.pp > 1 && micro_update_name(c); }
std::string schedule_flag(const TrainConfig& c) { return "--schedule " + c.schedule; }
// Optimizers with a whole-tensor statistics phase (optim/optimizer.h), run by the exact exchange's store.
bool whole_tensor_optimizer(const TrainConfig& c) {
  return c.optimizer == OptimizerKind::lamb || c.optimizer == OptimizerKind::adafactor;
}
std::string optimizer_flag(const TrainConfig& c) { return str("--optimizer ", flag_name(c.optimizer)); }
bool decentralized(const TrainConfig& c) { return c.sync != SyncKind::exact; }
std::string sync_flag(const TrainConfig& c) { return str("--sync ", flag_name(c.sync)); }
// --offload params and/or grads: parameters and gradient shards in files (offload/shard_file.h).
bool shards_offloaded(const TrainConfig& c) { return c.offload.params || c.offload.grads; }
std::string shards_flag(const TrainConfig& c) {
  return str("--offload ", c.offload.params ? "params" : "", c.offload.params && c.offload.grads ? "," : "",
             c.offload.grads ? "grads" : "");
}

const RefusedCombination kRefused[] = {
    {[](const TrainConfig& c) { return compressing(c) && local_sgd(c); },
     [](const TrainConfig& c) { return compress_flag(c) + " with " + local_flag(c); },
     "both replace the exact gradient exchange; they are alternatives: choose one"},
    {[](const TrainConfig& c) { return compressing(c) && c.zero > 0; },
     [](const TrainConfig& c) { return compress_flag(c) + str(" with --zero ", c.zero); },
     "the codec encodes each rank's whole gradient of its part of the replica once the backward is over, while "
     "ZeRO's stages are built on the exact exchange (2, 3: buckets reduce-scattered during the backward; 1: the "
     "update sharded over the group the codec replaces); use --zero 0"},
    {[](const TrainConfig& c) { return c.dgc && c.compress.method != compress::Method::topk; },
     [](const TrainConfig& c) { return "--dgc with " + (compressing(c) ? compress_flag(c) : "no --compress"); },
     "Deep Gradient Compression sends the top-k of the accumulated velocity: it needs --compress topk:RATIO "
     "(e.g. topk:0.001)"},
    {[](const TrainConfig& c) { return c.dgc && c.compress_adaptive; },
     [](const TrainConfig&) { return std::string("--dgc with --compress-adaptive"); },
     "DGC sets the kept fraction itself (its sparsity warm-up, --dgc-warmup-steps) while Accordion switches "
     "it by the gradient norm: choose one"},
    {[](const TrainConfig& c) { return c.dgc && c.pp > 1; },
     [](const TrainConfig& c) { return str("--dgc with --pp ", c.pp); },
     "DGC clips each rank's share of the gradient by its norm before exchanging it, and under a pipeline the "
     "tied embedding's parts on the first and last stage are only summed after the exchange, so that norm "
     "is not defined yet; use --pp 1"},
    {[](const TrainConfig& c) { return onebit(c) && (compressing(c) || local_sgd(c) || asynchronous(c)); },
     [](const TrainConfig& c) {
       return std::string("--optimizer onebit-adam with ") +
              (compressing(c) ? compress_flag(c) : local_sgd(c) ? local_flag(c) : async_flag(c));
     },
     "1-bit Adam brings its own exchange (exact gradients during the warm-up, then the momentum as signs with "
     "error feedback), which replaces the exchange these flags choose: choose one"},
    {[](const TrainConfig& c) { return onebit(c) && c.zero > 0; },
     [](const TrainConfig& c) { return str("--optimizer onebit-adam with --zero ", c.zero); },
     "after the freeze step every rank mixes its whole gradient into the whole synchronized momentum and keeps "
     "error-feedback state for all of it, which ZeRO would shard; use --zero 0"},
    {[](const TrainConfig& c) { return onebit(c) && (c.tp > 1 || c.pp > 1 || c.gpt.moe_every > 0 || c.moe.ep > 1); },
     [](const TrainConfig& c) {
       return str("--optimizer onebit-adam with --tp ", c.tp, " --pp ", c.pp, " --moe-every ", c.gpt.moe_every);
     },
     "the compressed momentum exchange runs over one flat replica per data-parallel rank; its split over "
     "tensor, pipeline and expert groups is not built; use --tp 1 --pp 1 and a dense model"},
    {[](const TrainConfig& c) { return onebit(c) && (c.offload.optimizer || c.delayed_update); },
     [](const TrainConfig& c) {
       return std::string("--optimizer onebit-adam with ") +
              (c.offload.optimizer ? "--offload optimizer" : "--delayed-update");
     },
     "1-bit Adam exchanges its momentum inside the optimizer's step, tensor by tensor, which neither the tiled "
     "update that streams state from --offload-dir nor the delay-1 rule has been built or checked with; choose "
     "one"},
    {[](const TrainConfig& c) { return local_sgd(c) && c.zero > 0; },
     [](const TrainConfig& c) { return local_flag(c) + str(" with --zero ", c.zero); },
     "between syncs each data-parallel rank steps a replica and optimizer state of its own, which ZeRO would "
     "share as one sharded copy over those ranks; use --zero 0"},
    {[](const TrainConfig& c) { return asynchronous(c) && (compressing(c) || local_sgd(c)); },
     [](const TrainConfig& c) {
       return async_flag(c) + " with " + (compressing(c) ? compress_flag(c) : local_flag(c));
     },
     "the asynchronous methods replace the synchronous exchange that --compress and --local-sgd change: choose one"},
    {[](const TrainConfig& c) { return asynchronous(c) && c.zero > 0; },
     [](const TrainConfig& c) { return async_flag(c) + str(" with --zero ", c.zero); },
     "ps: the servers already hold the parameters and optimizer state in slices and each worker a whole replica; "
     "hogwild: its threads share one copy, nothing to shard; use --zero 0"},
    {[](const TrainConfig& c) { return c.async == AsyncMode::ps && (c.tp > 1 || c.pp > 1); },
     [](const TrainConfig& c) { return async_flag(c) + str(" with --tp ", c.tp, " --pp ", c.pp); },
     "a worker is one rank that pushes its whole gradient to the servers and pulls whole parameters (slices of "
     "one flat replica); under --tp/--pp a worker would be several ranks holding different parts, whose pushes, "
     "pulls and staleness bound would have to move in lockstep, which is not built; use --tp 1 --pp 1"},
    {[](const TrainConfig& c) { return c.offload.optimizer && asynchronous(c); },
     [](const TrainConfig& c) { return "--offload optimizer with " + async_flag(c); },
     "ps: the servers step their slices of the state in memory; hogwild: its threads share momentum buffers in "
     "memory without locks; neither goes through the tiled update that streams the state from --offload-dir"},
    {[](const TrainConfig& c) {
       return (c.gpt.moe_every > 0 || c.moe.ep > 1) && (asynchronous(c) || compressing(c) || local_sgd(c));
     },
     [](const TrainConfig& c) {
       return str("an MoE model (--moe-every ", c.gpt.moe_every, " --ep ", c.moe.ep, ") with ",
                  asynchronous(c)  ? async_flag(c)
                  : compressing(c) ? compress_flag(c)
                                   : local_flag(c));
     },
     "an MoE layer's experts are reduced over a group of their own (the expert data-parallel group of --ep), "
     "which these methods, moving one flat replica over dp, do not know; an MoE model trains with synchronous "
     "data parallelism"},
    {[](const TrainConfig& c) { return c.delayed_update && asynchronous(c); },
     [](const TrainConfig& c) { return "--delayed-update with " + async_flag(c); },
     "the delay-1 rule applies one global gradient per step to the weights one step ahead of those it was taken "
     "at; ps workers already compute on parameters up to --staleness versions old, pulled from the servers "
     "(which keep no second version), and Hogwild's threads update shared weights with no step at all: there "
     "is no W(t-1) and W(t) to keep"},
    {[](const TrainConfig& c) { return c.delayed_update && local_sgd(c); },
     [](const TrainConfig& c) { return "--delayed-update with " + local_flag(c); },
     "every H steps Local SGD averages the replicas' weights, which would average only the version the "
     "optimizer updates while each replica's one-step-older version stayed its own: the two versions would no "
     "longer be one step apart; choose one"},
    {[](const TrainConfig& c) { return async_schedule(c) && c.zero >= 2; },
     [](const TrainConfig& c) { return str("--schedule ", c.schedule, " with --zero ", c.zero); },
     "an asynchronous schedule runs (pipedream-2bw: at m >= p, fp32, no MoE) or is meant to run step t+1's "
     "forwards while step t's last backwards drain (no flush between steps), which ZeRO 2 and 3 cannot cross: they hold a "
     "stage's whole gradient (and gather its parameters) only within a step "
     "and reduce-scatter at its update; use --zero 0 or 1, or --delayed-update with --schedule 1f1b (the same "
     "update rule with a flush between steps, which takes ZeRO 2 and 3)"},
    {[](const TrainConfig& c) { return c.schedule == "zb-v" && c.zero >= 2; },
     [](const TrainConfig& c) { return str("--schedule zb-v with --zero ", c.zero); },
     "zb-v's V puts the first and the last stage on pipeline rank 0, so the tied wte is one tensor there whose "
     "gradient both ends add to, while ZeRO 2 and 3 reduce a group's gradient as soon as its first-stage uses "
     "are over (the store's hooks know one owner stage per group); use --zero 0 or 1, or --schedule zb-h1"},
    {[](const TrainConfig& c) { return c.schedule == "chimera" && c.zero >= 2; },
     [](const TrainConfig& c) { return str("--schedule chimera with --zero ", c.zero); },
     "chimera holds every stage on two pipeline ranks whose gradients are summed over that pair after the whole "
     "step's backward, while ZeRO 2 and 3 reduce-scatter (and free) a group's gradient over the data-parallel "
     "group as soon as its last micro-batch is done; use --zero 0 or 1"},
    {[](const TrainConfig& c) { return whole_tensor_optimizer(c) && (compressing(c) || local_sgd(c)); },
     [](const TrainConfig& c) { return optimizer_flag(c) + " with " + (compressing(c) ? compress_flag(c) : local_flag(c)); },
     "LAMB's trust ratio and Adafactor's factored moments are per-tensor statistics of the exact reduced gradient "
     "(the same under every layout); with a compressed exchange or Local SGD's local steps they would be taken "
     "from other gradients, a combination neither built for nor tested; use --optimizer adamw or sgd with it"},
    {[](const TrainConfig& c) { return whole_tensor_optimizer(c) && c.offload.optimizer; },
     [](const TrainConfig& c) { return optimizer_flag(c) + " with --offload optimizer"; },
     "the statistics phase reads the optimizer state of every tensor before the update, while --offload-dir's "
     "tiled update brings the state in only tile by tile during it; use --optimizer adamw or sgd with offload"},
    {[](const TrainConfig& c) { return whole_tensor_optimizer(c) && asynchronous(c); },
     [](const TrainConfig& c) { return optimizer_flag(c) + " with " + async_flag(c); },
     "a parameter server steps each slice of the flat buffer on its own, so a tensor that straddles two servers "
     "has no whole-tensor statistics phase (and --async hogwild runs SGD); use --optimizer adamw or sgd"},
    {[](const TrainConfig& c) {
       return c.learners > 0 && (compressing(c) || local_sgd(c) || asynchronous(c) || onebit(c) ||
                                 c.delayed_update);
     },
     [](const TrainConfig& c) {
       return str("--learners ", c.learners, " with ",
                  compressing(c)   ? compress_flag(c)
                  : local_sgd(c)   ? local_flag(c)
                  : asynchronous(c) ? async_flag(c)
                  : onebit(c)      ? optimizer_flag(c)
                                   : std::string("--delayed-update"));
     },
     "Crossbow's model averaging is the run's exchange (learners corrected toward a central model, no gradient "
     "exchange), which these flags replace or change: choose one"},
    {[](const TrainConfig& c) {
       return c.learners > 0 && (c.zero > 0 || c.tp > 1 || c.pp > 1 || c.gpt.moe_every > 0 || c.moe.ep > 1);
     },
     [](const TrainConfig& c) {
       return str("--learners ", c.learners, " with --zero ", c.zero, " --tp ", c.tp, " --pp ", c.pp,
                  " --moe-every ", c.gpt.moe_every);
     },
     "each learner is a whole replica of the model on one rank, swapped in per micro-batch; learners split by "
     "ZeRO, tensor, pipeline or expert groups are not built; use --zero 0 --tp 1 --pp 1 and a dense model"},
    {[](const TrainConfig& c) { return c.learners > 0 && c.offload.optimizer; },
     [](const TrainConfig& c) { return str("--learners ", c.learners, " with --offload optimizer"); },
     "each learner's copy of the optimizer state is kept in memory (the tiled update from --offload-dir is not "
     "built for several copies)"},
    {[](const TrainConfig& c) {
       return c.adaptive_batch && (compressing(c) || local_sgd(c) || asynchronous(c) || onebit(c) || c.learners > 0 ||
                                   c.delayed_update);
     },
     [](const TrainConfig& c) {
       return "--adaptive-batch with " + (compressing(c)    ? compress_flag(c)
                                          : local_sgd(c)    ? local_flag(c)
                                          : asynchronous(c) ? async_flag(c)
                                          : onebit(c)       ? optimizer_flag(c)
                                          : c.learners > 0  ? str("--learners ", c.learners)
                                                            : std::string("--delayed-update"));
     },
     "the batch grows by averaging whole reduced gradients of the exact exchange, whose measured noise scale "
     "decides it; these flags replace that exchange or its update: choose one"},
    {[](const TrainConfig& c) {
       return c.adaptive_batch && (c.zero > 0 || c.pp > 1 || c.gpt.moe_every > 0 || c.moe.ep > 1);
     },
     [](const TrainConfig& c) {
       return str("--adaptive-batch with --zero ", c.zero, " --pp ", c.pp, " --moe-every ", c.gpt.moe_every);
     },
     "the accumulation is built for the whole reduced gradient of the micro-batch loop (ZeRO 0, no pipeline), and "
     "the noise scale that decides is not measured with experts; use --zero 0 --pp 1 and a dense model"},
    {[](const TrainConfig& c) {
       return c.adaptive_batch && (!c.resume.empty() || c.offload.optimizer);
     },
     [](const TrainConfig& c) {
       return "--adaptive-batch with " + (!c.resume.empty() ? std::string("--resume") : std::string("--offload optimizer"));
     },
     "checkpoints do not hold k, the data steps accumulated so far or the controller's state (a resumed run would "
     "differ); the tiled update is not built with it"},
    {[](const TrainConfig& c) { return c.max_restarts > 0 && c.checkpoint_dir.empty(); },
     [](const TrainConfig& c) { return str("--max-restarts ", c.max_restarts, " without --checkpoint-dir"); },
     "a restarted job continues from the last checkpoint in --checkpoint-dir (give --save-every K too, or it "
     "holds only the final one)"},
    {[](const TrainConfig& c) { return c.min_nproc > 0 && c.max_restarts == 0; },
     [](const TrainConfig& c) { return str("--min-nproc ", c.min_nproc, " without --max-restarts"); },
     "--min-nproc is how few ranks a restart may continue with; without restarts there is none"},
    {[](const TrainConfig& c) { return c.max_restarts > 0 && c.async == AsyncMode::hogwild; },
     [](const TrainConfig& c) { return str("--max-restarts ", c.max_restarts, " with --async hogwild"); },
     "Hogwild's threads run in one process and write no checkpoints to restart from"},
    {[](const TrainConfig& c) { return micro_update_name(c) && c.pp <= 1; },
     [](const TrainConfig& c) { return schedule_flag(c) + str(" with --pp ", c.pp); },
     "the schedule updates each pipeline stage after every micro-batch's backward, with weight versions that "
     "differ between stages; with one stage there is no pipeline to run it; use --pp 2 or more"},
    {[](const TrainConfig& c) { return micro_update_schedule(c) && c.zero >= 2; },
     [](const TrainConfig& c) { return schedule_flag(c) + str(" with --zero ", c.zero); },
     "the schedule updates after every micro-batch, while ZeRO 2 and 3 reduce-scatter a stage's gradient "
     "buckets once per step (after m backward visits) and ZeRO 3 gathers the parameters the versions would "
     "have to swap; use --zero 0 or 1"},
    {[](const TrainConfig& c) { return micro_update_schedule(c) && c.delayed_update; },
     [](const TrainConfig& c) { return schedule_flag(c) + " with --delayed-update"; },
     "two different asynchronous update rules (per-micro-batch updates with their own weight versions, and the "
     "delay-1 rule's one-step-old weights): choose one"},
    {[](const TrainConfig& c) { return c.vertical_sync && !(c.pp > 1 && c.schedule == "pipedream"); },
     [](const TrainConfig& c) {
       return str("--vertical-sync with ", c.schedule.empty() ? std::string("no --schedule") : schedule_flag(c),
                  " --pp ", c.pp);
     },
     "vertical sync chooses which stashed weight version a micro-batch reads on each stage: it needs "
     "--schedule pipedream and --pp 2 or more (pipemare keeps no stash)"},
    {[](const TrainConfig& c) { return c.pipemare_lr_anneal != 0 && !(c.pp > 1 && c.schedule == "pipemare"); },
     [](const TrainConfig& c) {
       return str("--pipemare-lr-anneal ", c.pipemare_lr_anneal, " with ",
                  c.schedule.empty() ? std::string("no --schedule") : schedule_flag(c), " --pp ", c.pp);
     },
     "PipeMare's learning-rate rescheduling scales each stage's step size by its delay under the per-micro-batch "
     "updates without a stash: it needs --schedule pipemare and --pp 2 or more"},
    {[](const TrainConfig& c) { return c.pipemare_lr_anneal < 0; },
     [](const TrainConfig& c) { return str("--pipemare-lr-anneal ", c.pipemare_lr_anneal); },
     "the number of updates K over which the step size anneals to the base rate must be positive (0: off)"},
    {[](const TrainConfig& c) { return c.pipemare_lr_anneal > 0 && whole_tensor_optimizer(c); },
     [](const TrainConfig& c) {
       return str("--pipemare-lr-anneal ", c.pipemare_lr_anneal, " with --optimizer ",
                  c.optimizer == OptimizerKind::lamb ? "lamb" : "adafactor");
     },
     "the per-stage step size runs the optimizer once per learning rate, which a whole-tensor statistics phase "
     "(LAMB, Adafactor) would not see whole; use --optimizer adamw or sgd"},
    {[](const TrainConfig& c) { return c.pipemare_correction >= 0 && !(c.pp > 1 && c.schedule == "pipemare"); },
     [](const TrainConfig& c) {
       return str("--pipemare-correction ", c.pipemare_correction, " with ",
                  c.schedule.empty() ? std::string("no --schedule") : schedule_flag(c), " --pp ", c.pp);
     },
     "PipeMare's discrepancy correction predicts the weights a backward multiplies by when it reads newer "
     "weights than its forward: it needs --schedule pipemare and --pp 2 or more (pipedream's stash reads the "
     "forward's own)"},
    {[](const TrainConfig& c) { return c.pipemare_correction >= 1 || (c.pipemare_correction < 0 && c.pipemare_correction != -1); },
     [](const TrainConfig& c) { return str("--pipemare-correction ", c.pipemare_correction); },
     "the moving average's decay GAMMA must be in [0, 1) (-1: off)"},
    {[](const TrainConfig& c) { return c.pipemare_correction >= 0 && !c.resume.empty(); },
     [](const TrainConfig& c) { return str("--pipemare-correction ", c.pipemare_correction, " with --resume"); },
     "the correction's moving average of weight changes is not written to checkpoints, so a resumed run would "
     "restart it at zero and leave the rule: drop one"},
    {[](const TrainConfig& c) {
       return micro_update_schedule(c) && (compressing(c) || local_sgd(c) || asynchronous(c) || onebit(c) || c.dgc);
     },
     [](const TrainConfig& c) {
       return schedule_flag(c) + " with " +
              (compressing(c) ? compress_flag(c)
               : local_sgd(c) ? local_flag(c)
               : asynchronous(c) ? async_flag(c)
               : onebit(c)      ? std::string("--optimizer onebit-adam")
                                : std::string("--dgc"));
     },
     "the per-micro-batch updates are built on the exact gradient exchange (one reduce, norm and update per "
     "micro-batch); these methods replace it: choose one"},
    {[](const TrainConfig& c) { return micro_update_schedule(c) && c.precision == Precision::bf16; },
     [](const TrainConfig& c) { return schedule_flag(c) + " with --precision bf16"; },
     "the bf16 mirror of the weights is refreshed once per step, while this schedule changes the weight version "
     "a computation reads many times per step; use --precision fp32"},
    {[](const TrainConfig& c) { return micro_update_schedule(c) && c.offload.optimizer; },
     [](const TrainConfig& c) { return schedule_flag(c) + " with --offload optimizer"; },
     "the tiled update that streams the optimizer state from --offload-dir would run once per micro-batch "
     "(m times the disk traffic), a combination not built or tested; drop one"},
    {[](const TrainConfig& c) { return c.pp > 1 && c.schedule == "pipemare" && c.recompute; },
     [](const TrainConfig&) { return std::string("--schedule pipemare with --recompute"); },
     "pipemare's backward multiplies by the stage's newest weights but uses the activations its forward "
     "computed; recomputing them at the backward would take them at the newest weights instead, another rule; "
     "drop --recompute (pipedream takes it: its backward reads the forward's version)"},
    {[](const TrainConfig& c) { return micro_update_schedule(c) && (c.gpt.moe_every > 0 || c.moe.ep > 1); },
     [](const TrainConfig& c) { return schedule_flag(c) + str(" with --moe-every ", c.gpt.moe_every, " --ep ", c.moe.ep); },
     "an MoE model's per-step router statistics and expert-group reductions have not been built or checked "
     "with per-micro-batch updates; use a dense model"},
    // Decentralized methods (--sync gossip | decentralized-lowprec, train/gossip_sync.h).
    {[](const TrainConfig& c) { return decentralized(c) && (c.learners > 0 || c.adaptive_batch); },
     [](const TrainConfig& c) {
       return sync_flag(c) + " with " + (c.learners > 0 ? str("--learners ", c.learners) : "--adaptive-batch");
     },
     "Crossbow's learners and the adaptive batch are exchanges of their own over the exact gradient sum; the "
     "decentralized methods replace that exchange: choose one"},
    {[](const TrainConfig& c) { return decentralized(c) && c.zero > 0; },
     [](const TrainConfig& c) { return sync_flag(c) + str(" with --zero ", c.zero); },
     "each data-parallel rank steps and mixes a whole replica and optimizer state of its own, which ZeRO would "
     "share as one sharded copy over those ranks; use --zero 0"},
    {[](const TrainConfig& c) { return decentralized(c) && (c.tp > 1 || c.pp > 1 || c.gpt.moe_every > 0 || c.moe.ep > 1); },
     [](const TrainConfig& c) {
       return sync_flag(c) + str(" with --tp ", c.tp, " --pp ", c.pp, " --moe-every ", c.gpt.moe_every, " --ep ", c.moe.ep);
     },
     "the neighbour exchange mixes one flat replica per data-parallel rank; over tensor, pipeline or expert "
     "splits of a replica it is neither built nor tested; use --tp 1 --pp 1 and a dense model"},
    {[](const TrainConfig& c) { return decentralized(c) && (compressing(c) || local_sgd(c) || asynchronous(c) || onebit(c)); },
     [](const TrainConfig& c) {
       return sync_flag(c) + " with " +
              (compressing(c) ? compress_flag(c) : local_sgd(c) ? local_flag(c) : asynchronous(c) ? async_flag(c)
                                                                                                  : optimizer_flag(c));
     },
     "each of these replaces the exact gradient exchange with one of its own, as the decentralized methods do: "
     "choose one (decentralized-lowprec is the compressed decentralized variant)"},
    {[](const TrainConfig& c) { return decentralized(c) && whole_tensor_optimizer(c); },
     [](const TrainConfig& c) { return sync_flag(c) + " with " + optimizer_flag(c); },
     "LAMB's trust ratio and Adafactor's factored moments are per-tensor statistics of the exact reduced gradient; "
     "each replica would take them from its own share's gradient, a combination neither built for nor tested; use "
     "--optimizer adamw or sgd"},
    {[](const TrainConfig& c) { return c.sync == SyncKind::decentralized_lowprec && c.gossip_graph == GossipGraphKind::exp; },
     [](const TrainConfig&) { return std::string("--sync decentralized-lowprec with --gossip-graph exp"); },
     "the low-precision exchange sends differences against an exact copy of each neighbour's model, kept over the "
     "whole run, so its neighbours must stay fixed (the ring); the exponential graph changes them every step"},
    {[](const TrainConfig& c) { return decentralized(c) && (c.offload.optimizer || c.delayed_update || !c.resume.empty()); },
     [](const TrainConfig& c) {
       return sync_flag(c) + " with " +
              (c.offload.optimizer ? "--offload optimizer" : c.delayed_update ? "--delayed-update" : "--resume");
     },
     "--offload and --delayed-update are not built or checked with the neighbour exchange; a checkpoint holds one "
     "replica (the writing rank's) and not the neighbour copies of decentralized-lowprec, so --resume could "
     "not continue the run"},
    {[](const TrainConfig& c) { return shards_offloaded(c) && (c.delayed_update || async_schedule(c)); },
     [](const TrainConfig& c) {
       return shards_flag(c) + " with " + (c.delayed_update ? "--delayed-update" : "--schedule " + c.schedule);
     },
     "the delay-1 rule keeps a second version of the resident parameters and swaps the two in memory, which an "
     "offloaded parameter shard does not have; offload the optimizer state alone"},
    {[](const TrainConfig& c) { return shards_offloaded(c) && (compressing(c) || local_sgd(c) || asynchronous(c)); },
     [](const TrainConfig& c) {
       return shards_flag(c) + " with " + (compressing(c) ? compress_flag(c) : local_sgd(c) ? local_flag(c) : async_flag(c));
     },
     "these exchanges read and write the whole gradient or parameter shard in memory; only the exact exchange "
     "streams them from --offload-dir"},
    // DGC with AdamW (--dgc --freeze-step K: src/train/dgc_adam_sync.h)
    {[](const TrainConfig& c) { return c.dgc && c.freeze_step >= 0 && c.optimizer != OptimizerKind::adamw; },
     [](const TrainConfig& c) { return "--dgc --freeze-step with " + optimizer_flag(c); },
     "--freeze-step freezes AdamW's variance and runs DGC on the preconditioned momentum; with --optimizer sgd "
     "DGC needs no freeze step (drop --freeze-step), other optimizers are not built with it"},
    {[](const TrainConfig& c) { return c.dgc && c.freeze_step >= 0 && c.tp > 1; },
     [](const TrainConfig& c) { return str("--dgc --freeze-step with --tp ", c.tp); },
     "after the freeze step each rank clips its share by its own norm, which under tensor parallelism would need "
     "the other parts of the replica (not built); use --tp 1"},
    {[](const TrainConfig& c) { return c.dgc && c.freeze_step >= 0 && (c.offload.optimizer || c.delayed_update); },
     [](const TrainConfig& c) {
       return std::string("--dgc --freeze-step with ") + (c.offload.optimizer ? "--offload optimizer" : "--delayed-update");
     },
     "the exchange reads the frozen variance and AdamW's momentum from the optimizer's state in memory, which "
     "neither the tiled update that streams state from --offload-dir nor the delay-1 rule has been built or "
     "checked with; choose one"},
    {[](const TrainConfig& c) { return c.overlap_update && !c.delayed_update && !(c.zero == 3 && c.offload.params); },
     [](const TrainConfig&) { return std::string("--overlap-update without --delayed-update"); },
     "--overlap-update runs the delayed parameter update on a thread of its own; the exact update is needed "
     "before the next step's forward and has nothing to overlap (except with --zero 3 --offload params, where "
     "each group's forward waits for its own shard's update): add --delayed-update"},
    {[](const TrainConfig& c) { return c.overlap_update && c.delayed_update && (c.zero >= 2 || c.tp > 1 || c.pp > 1 || c.moe.ep > 1); },
     [](const TrainConfig& c) {
       return "--overlap-update with " + (c.zero >= 2 ? str("--zero ", c.zero)
                                          : c.tp > 1  ? str("--tp ", c.tp)
                                          : c.pp > 1  ? str("--pp ", c.pp)
                                                      : str("--ep ", c.moe.ep));
     },
     "the update on its own thread is built for one process and data parallelism with ZeRO 0 or 1 (the "
     "optimizer alone on the thread, every collective on the main one); ZeRO 2/3's sharded gradients and "
     "gathers, tp, pp and experts are not built: drop --overlap-update (the serial --delayed-update runs there)"},
    {[](const TrainConfig& c) { return c.overlap_update && (whole_tensor_optimizer(c) || onebit(c)); },
     [](const TrainConfig& c) { return "--overlap-update with " + optimizer_flag(c); },
     "the update on its own thread runs an elementwise optimizer (adamw, sgd); this one's statistics phase "
     "or compressed momentum needs collectives inside the update, which stay on the main thread"},
    {[](const TrainConfig& c) { return c.overlap_update && c.delayed_update && (c.offload.activations || shards_offloaded(c)); },
     [](const TrainConfig& c) {
       return "--overlap-update with " + (c.offload.activations ? std::string("--offload-activations") : shards_flag(c));
     },
     "only the optimizer state's file is read and written by the update's thread; the activation and shard "
     "files are not built or checked with it: use --offload optimizer"},
    // The exact update overlapped with the next forward (ZeRO 3, --offload params: parallel/data/zero_stage.cpp)
    {[](const TrainConfig& c) {
       return c.overlap_update && !c.delayed_update && (c.tp > 1 || c.pp > 1 || c.moe.ep > 1 || c.offload.activations);
     },
     [](const TrainConfig& c) {
       return "--overlap-update --zero 3 --offload params with " +
              (c.tp > 1 ? str("--tp ", c.tp) : c.pp > 1 ? str("--pp ", c.pp) : c.moe.ep > 1 ? str("--ep ", c.moe.ep)
                                                                                 : std::string("--offload-activations"));
     },
     "the exact update on its own thread is built and checked for one process and data parallelism (ZeRO 3 "
     "shard files): drop --overlap-update there"},
    {[](const TrainConfig& c) { return c.overlap_update && !c.delayed_update && !c.offload.optimizer; },
     [](const TrainConfig&) { return std::string("--overlap-update --zero 3 --offload params without --offload optimizer"); },
     "the exact update on its own thread streams the optimizer state's tiles from --offload-dir beside the "
     "parameter shard's: add optimizer to --offload"},
};

void check_refused(const TrainConfig& c) {
  for (const RefusedCombination& r : kRefused)
    MT_CHECK_INPUT(!r.applies(c), r.flags(c), " is not supported: ", r.reason);
  // A restart (--max-restarts, elastic.h) resumes from the last checkpoint: whatever the table refuses with
  // --resume is refused with --max-restarts too, now rather than when a restart is needed. The rows say
  // "X with --resume"; the message names X and --max-restarts.
  if (c.max_restarts == 0 || !c.resume.empty()) return;
  TrainConfig resumed = c;
  resumed.resume = c.checkpoint_dir;
  for (const RefusedCombination& r : kRefused) {
    if (!r.applies(resumed)) continue;
    std::string x = r.flags(resumed);
    const std::string tail = " with --resume";
    if (x.size() > tail.size() && x.compare(x.size() - tail.size(), tail.size(), tail) == 0)
      x.resize(x.size() - tail.size());
    MT_CHECK_INPUT(false, str("--max-restarts ", c.max_restarts), " with ", x,
                   " is not supported: a restart resumes the job from its last checkpoint, and ", r.flags(resumed),
                   " is refused: ", r.reason);
  }
}

// Asynchronous training (parameter server, Hogwild) and the straggler emulation.
void check_async(const TrainConfig& c, int world_size) {
  const AsyncMode async = c.async;
  MT_CHECK_INPUT(async == AsyncMode::ps || (c.servers == -1 && c.staleness == 0),
                 "--servers and --staleness need --async ps");
  if (async == AsyncMode::ps) {
    MT_CHECK_INPUT(c.servers == -1 || c.servers >= 1, "--servers must be >= 1, got ", c.servers);
    MT_CHECK_INPUT(c.staleness >= 0, "--staleness must be >= 0, got ", c.staleness);
    MT_CHECK_INPUT(world_size > c.ps_servers(), "--async ps needs at least one worker besides the ", c.ps_servers(),
                   " server(s) of --servers: --nproc (or mpirun -np) ", world_size, " is too few");
  }
  if (async == AsyncMode::hogwild) {
    MT_CHECK_INPUT(
        c.model == ModelKind::mlp && c.optimizer == OptimizerKind::sgd,
        "--async hogwild is lock-free SGD on shared parameters: ", "it needs --model mlp and --optimizer sgd");
    MT_CHECK_INPUT(c.backend != BackendKind::mpi,
                   "--async hogwild runs threads of one process (shared memory), not --backend mpi");
  }
  MT_CHECK_INPUT(c.straggler.rank < world_size, "--straggler rank ", c.straggler.rank,
                 " does not exist: there are ", world_size, " ranks");
}

// Communication-efficient data parallelism (compressed exchange, Local SGD) over d data-parallel ranks.
void check_comm_efficient(const TrainConfig& c, int d) {
  const compress::CompressSpec& cspec = c.compress;
  if (cspec.enabled() || c.local_sgd > 0) {
    const char* what = cspec.enabled() ? "--compress" : "--local-sgd";
    // The exchange runs over the data-parallel group of each (tp, pp) coordinate: --tp and --pp take ranks.
    if (c.tp * c.pp > 1)
      MT_CHECK_INPUT(d > 1, what, " needs more than one data-parallel rank: with --tp ", c.tp, " --pp ", c.pp, ", ",
                     c.tp * c.pp * d, " ranks give dp ", d, " (nothing to exchange); use ", 2 * c.tp * c.pp,
                     " ranks or more (a multiple of --tp x --pp = ", c.tp * c.pp, ")");
    MT_CHECK_INPUT(d > 1, what, " needs more than one data-parallel rank (here ", d,
                   "; set --nproc > 1): with one rank nothing is exchanged");
  }
  MT_CHECK_INPUT(c.local_sgd >= 0 && c.local_sgd_warmup >= 0, "--local-sgd and --local-sgd-warmup must be >= 0");
  MT_CHECK_INPUT(c.local_sgd > 0 || (c.local_sgd_warmup == 0 && !c.local_sgd_state),
                 "--local-sgd-warmup and --local-sgd-state need --local-sgd H");
  MT_CHECK_INPUT(cspec.enabled() || !c.compress_adaptive, "--compress-adaptive needs --compress METHOD");
  MT_CHECK_INPUT(c.optimizer != OptimizerKind::onebit_adam || c.freeze_step >= 0,
                 "--optimizer onebit-adam needs --freeze-step K >= 0 (AdamW for the first K steps)");
  MT_CHECK_INPUT(c.freeze_step == -1 || c.optimizer == OptimizerKind::onebit_adam || c.dgc,
                 "--freeze-step needs --optimizer onebit-adam or --dgc, got --optimizer ", flag_name(c.optimizer));
  MT_CHECK_INPUT(c.freeze_step == -1 || c.optimizer == OptimizerKind::onebit_adam || c.freeze_step >= 1,
                 "--dgc --freeze-step K needs K >= 1 (AdamW for the first K steps), got ", c.freeze_step);
  MT_CHECK_INPUT(!c.dgc_no_masking || (c.dgc && c.freeze_step >= 0),
                 "--dgc-no-masking needs --dgc --freeze-step K");
  MT_CHECK_INPUT(!c.dgc_dense_vectors || (c.dgc && c.freeze_step >= 0),
                 "--dgc-dense-vectors needs --dgc --freeze-step K");
  MT_CHECK_INPUT(!c.dgc_global_topk || (c.dgc && c.freeze_step >= 0),
                 "--dgc-global-topk needs --dgc --freeze-step K");
  MT_CHECK_INPUT(!c.dgc_split_clip || (c.dgc && c.freeze_step >= 0),
                 "--dgc-split-clip needs --dgc --freeze-step K");
  MT_CHECK_INPUT(c.dgc_lr_scale == 1.0 || (c.dgc && c.freeze_step >= 0),
                 "--dgc-lr-scale needs --dgc --freeze-step K");
  MT_CHECK_INPUT(c.dgc_lr_scale > 0 && std::isfinite(c.dgc_lr_scale),
                 "--dgc-lr-scale must be finite and > 0, got ", c.dgc_lr_scale);
  MT_CHECK_INPUT(!c.dgc_split_clip || c.grad_clip > 0, "--dgc-split-clip needs --grad-clip > 0, got --grad-clip ",
                 c.grad_clip);
  MT_CHECK_INPUT(c.dgc_warmup >= 0, "--dgc-warmup-steps must be >= 0, got ", c.dgc_warmup);
  MT_CHECK_INPUT(c.dgc || c.dgc_warmup == 0, "--dgc-warmup-steps needs --dgc");
  MT_CHECK_INPUT(c.compress_adaptive_every >= 1 && c.compress_adaptive_eta > 0,
                 "--compress-adaptive-every must be >= 1 and --compress-adaptive-eta > 0");
}

// --sync gossip | decentralized-lowprec and their own flags (combinations: kRefused).
void check_decentralized(const TrainConfig& c, int d) {
  MT_CHECK_INPUT(c.consensus_every >= 0, "--consensus-every must be >= 0 (0: never), got ", c.consensus_every);
  MT_CHECK_INPUT(c.gossip_graph == GossipGraphKind::ring || c.sync == SyncKind::gossip,
                 "--gossip-graph ", flag_name(c.gossip_graph), " needs --sync gossip (got --sync ", flag_name(c.sync), ")");
  MT_CHECK_INPUT(c.gossip_mix == GossipMixKind::unset || c.sync == SyncKind::gossip, "--gossip-mix ",
                 flag_name(c.gossip_mix), " needs --sync gossip (got --sync ", flag_name(c.sync), ")");
  if (c.sync == SyncKind::exact) return;
  MT_CHECK_INPUT(d > 1, "--sync ", flag_name(c.sync), " needs more than one data-parallel rank (here ", d,
                 "; set --nproc > 1): with one rank there are no neighbours to mix with");
}

// --offload and --memory-limit (the directory itself is checked when each rank creates its file).
void check_offload(const TrainConfig& c) {
  const OffloadFlags& o = c.offload;
  MT_CHECK_INPUT(!o.any() || !o.dir.empty(), "--offload needs --offload-dir DIR (where each rank's files go)");
  MT_CHECK_INPUT(o.any() || o.dir.empty(), "--offload-dir ", o.dir, " needs --offload optimizer, params and/or grads, or --offload-activations");
  MT_CHECK_INPUT(o.tile_bytes >= 4096 && o.tile_bytes % 4096 == 0,
                 "--offload-tile must be a positive multiple of 4096 bytes, got ", o.tile_bytes);
}

}  // namespace

void OffloadFlags::parse_kinds(const std::string& v) {
  size_t at = 0;
  do {
    const size_t comma = std::min(v.find(',', at), v.size());
    const std::string kind = v.substr(at, comma - at);
    if (kind == "optimizer")
      optimizer = true;
    else if (kind == "params")
      params = true;
    else if (kind == "grads")
      grads = true;
    else
      throw InputError(str("--offload takes optimizer, params or grads (comma-separated), got '", kind, "'"));
    at = comma + 1;
  } while (at <= v.size());
}

uint64_t OffloadFlags::parse_bytes(const std::string& flag, const std::string& v) {
  size_t digits = 0;
  while (digits < v.size() && v[digits] >= '0' && v[digits] <= '9') digits++;
  const std::string rest = v.substr(digits);
  const int shift = rest.empty() ? 0 : rest == "K" || rest == "k" ? 10 : rest == "M" || rest == "m" ? 20
                    : rest == "G" || rest == "g" ? 30 : -1;
  MT_CHECK_INPUT(digits > 0 && shift >= 0, flag,
                 " takes bytes as an integer with an optional K, M or G suffix (powers of 1024), got '", v, "'");
  MT_CHECK_INPUT(digits <= 12, flag, " is too large: '", v, "'");
  const uint64_t n = std::stoull(v.substr(0, digits));
  MT_CHECK_INPUT(n > 0, flag, " must be positive, got '", v, "'");
  MT_CHECK_INPUT(n <= (UINT64_MAX >> shift), flag, " is too large: '", v, "'");
  return n << shift;
}

// One named check per concern (MoE: moe.cpp); the first failing check is reported.
void TrainConfig::validate(int world_size) const {
  check_model(*this);
  check_optimizer(*this);
  check_outputs(*this);
  check_layout(*this);
  check_refused(*this);
  check_offload(*this);
  check_async(*this, world_size);
  // The mesh and the batch layout check themselves (degrees tile the ranks; batch, micro-batches, schedule).
  const parallel::MeshGrid grid(world_size, dp, tp, pp, async == AsyncMode::ps ? ps_servers() : 0);
  const int d = grid.dp();
  const BatchLayout layout(*this, d);
  moe.validate(*this, d);
  check_comm_efficient(*this, d);
  check_learners(*this, d);
  if (adaptive_batch) {
    MT_CHECK_INPUT(adaptive_batch_max >= 1 && adaptive_batch_every >= 1,
                   "--adaptive-batch-max and --adaptive-batch-every must be >= 1, got ", adaptive_batch_max, " and ",
                   adaptive_batch_every);
    MT_CHECK_INPUT(d * layout.micro_count() >= 2 && batch_size % (d * layout.micro_count()) == 0,
                   "--adaptive-batch decides from the gradient noise scale, which needs at least two equal small "
                   "batches per step: --batch-size ", batch_size, " over ", d, " data-parallel ranks in ",
                   layout.micro_count(), " micro-batches each; use --nproc > 1 or --micro-batch-size");
  } else {
    MT_CHECK_INPUT(adaptive_batch_max == 8 && adaptive_batch_every == 10,
                   "--adaptive-batch-max and --adaptive-batch-every need --adaptive-batch");
  }
  check_decentralized(*this, d);
}

}  // namespace mt::train
