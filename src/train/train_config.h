// Everything `meshtrain train` can be told, with defaults. validate() rejects bad combinations once, with
// the values in the message, before any work starts.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "nn/moe_router.h"
#include "parallel/compress/spec.h"
#include "tensor/blas.h"

namespace mt::train {

// Flags whose value is one of a few names hold an enum: the CLI maps the name once (apps/meshtrain
// add_enum_option), and flag_name() gives it back for messages, checkpoints and the summary. A value outside the
// table (AsyncMode::off) is the flag not given and has no spelling. --schedule is not among them: its names are
// the pipeline schedule registry's (parallel/pipeline/schedules/registry.cpp), so a new schedule needs no edit here.
// --straggler RANK:MS, parsed once at the CLI: that rank (or Hogwild worker) sleeps MS ms in every step.
struct Straggler {
  int rank = -1, ms = 0;  // rank -1: none
  // Throws InputError naming --straggler unless flag is RANK:MS with non-negative integers.
  static Straggler parse(const std::string& flag);
  void pause(int me) const;  // sleeps when me == rank (src/train/run.cpp)
};

// The most threads a process may ask for (--threads): see apps/meshtrain/commands.h kThreads.
constexpr int kMaxThreads = 1024;

enum class ModelKind { gpt, mlp };
enum class OptimizerKind { adamw, sgd, lamb, adafactor, onebit_adam };
enum class AsyncMode { off, ps, hogwild };
enum class BackendKind { automatic, shm, mpi };  // automatic: mpi under mpirun, else shm
enum class GradCommDtype { f32, bf16 };
enum class SyncKind { exact, gossip, decentralized_lowprec };  // --sync (train/gossip_sync.h)
enum class GossipGraphKind { ring, exp };                       // --gossip-graph (parallel/data/gossip.h)
// --gossip-mix (train/gossip_sync.h); unset: the flag not given (no spelling), both under --sync gossip
enum class GossipMixKind { unset, params, grads, both };

template <class E>
struct FlagValue {
  const char* name;
  E value;
};
inline constexpr FlagValue<OptimizerKind> kOptimizerValues[] = {{"adamw", OptimizerKind::adamw},
                                                                 {"sgd", OptimizerKind::sgd},
                                                                 {"lamb", OptimizerKind::lamb},
                                                                 {"adafactor", OptimizerKind::adafactor},
                                                                 {"onebit-adam", OptimizerKind::onebit_adam}};
inline constexpr FlagValue<AsyncMode> kAsyncValues[] = {{"ps", AsyncMode::ps}, {"hogwild", AsyncMode::hogwild}};
inline constexpr FlagValue<BackendKind> kBackendValues[] = {
    {"auto", BackendKind::automatic}, {"shm", BackendKind::shm}, {"mpi", BackendKind::mpi}};
inline constexpr FlagValue<GradCommDtype> kGradCommDtypeValues[] = {{"f32", GradCommDtype::f32},
                                                                    {"bf16", GradCommDtype::bf16}};
inline constexpr FlagValue<SyncKind> kSyncValues[] = {{"exact", SyncKind::exact},
                                                      {"gossip", SyncKind::gossip},
                                                      {"decentralized-lowprec", SyncKind::decentralized_lowprec}};
inline constexpr FlagValue<GossipGraphKind> kGossipGraphValues[] = {{"ring", GossipGraphKind::ring},
                                                                    {"exp", GossipGraphKind::exp}};
inline constexpr FlagValue<GossipMixKind> kGossipMixValues[] = {
    {"params", GossipMixKind::params}, {"grads", GossipMixKind::grads}, {"both", GossipMixKind::both}};
inline constexpr FlagValue<Precision> kPrecisionValues[] = {{"fp32", Precision::fp32}, {"bf16", Precision::bf16}};
inline constexpr FlagValue<nn::SecondPolicy> kSecondPolicyValues[] = {{"all", nn::SecondPolicy::all},
                                                                      {"random", nn::SecondPolicy::random}};
// --model's spellings are the model registry's rows (train/model_registry.cpp): a new model is one row there.
std::span<const FlagValue<ModelKind>> flag_values(ModelKind);
constexpr std::span<const FlagValue<OptimizerKind>> flag_values(OptimizerKind) { return kOptimizerValues; }
constexpr std::span<const FlagValue<AsyncMode>> flag_values(AsyncMode) { return kAsyncValues; }
constexpr std::span<const FlagValue<BackendKind>> flag_values(BackendKind) { return kBackendValues; }
constexpr std::span<const FlagValue<GradCommDtype>> flag_values(GradCommDtype) { return kGradCommDtypeValues; }
constexpr std::span<const FlagValue<Precision>> flag_values(Precision) { return kPrecisionValues; }
constexpr std::span<const FlagValue<SyncKind>> flag_values(SyncKind) { return kSyncValues; }
constexpr std::span<const FlagValue<GossipGraphKind>> flag_values(GossipGraphKind) { return kGossipGraphValues; }
constexpr std::span<const FlagValue<GossipMixKind>> flag_values(GossipMixKind) { return kGossipMixValues; }
constexpr std::span<const FlagValue<nn::SecondPolicy>> flag_values(nn::SecondPolicy) { return kSecondPolicyValues; }

// The flag spelling of v ("" for the not-given value).
template <class E>
constexpr const char* flag_name(E v) {
  for (const FlagValue<E>& f : flag_values(E{}))
    if (f.value == v) return f.name;
  return "";
}

// Mixture-of-experts routing while training (the model's MoE shape is in TrainConfig::gpt: moe_every,
// experts, moe_top_k, expert_hidden). nn/moe_router.h has the semantics.
struct MoeFlags {
  double capacity_factor = 1.25;     // F: ceil(F k group_tokens / E) slots per expert and group; 0 = dropless
  int group_windows = 1;             // G: routing groups of G consecutive windows of the global batch
  nn::SecondPolicy second_policy = nn::SecondPolicy::all;  // GShard's random: keep the second choice when 2 g2 > u
  double aux_loss = 0.01;            // alpha of the load-balancing loss
  double z_loss = 0.0;               // beta of the router z-loss
  int ep = 1;                        // expert-parallel degree: experts split over ep ranks of each dp group
  // Checks against the model flags and the data-parallel degree (moe.cpp).
  void validate(const struct TrainConfig& cfg, int dp) const;
};

// Offload tiers and the memory budget (docs/offload.md; train/offload.h assembles them).
struct OffloadFlags {
  bool optimizer = false;                // --offload optimizer: each rank's optimizer state in a file under dir
  bool params = false, grads = false;    // --offload params / grads: the parameters / reduced gradients too
  bool activations = false;              // --offload-activations: each block's saved activations too
  std::string dir;                       // --offload-dir
  uint64_t tile_bytes = uint64_t(1) << 20;  // --offload-tile: bytes per state buffer per tile (multiple of 4096)
  uint64_t memory_limit = 0;             // --memory-limit: bytes per rank (0: none)
  bool any() const { return optimizer || params || grads || activations; }
  // "optimizer", "params", "grads", comma-separated.
  void parse_kinds(const std::string& v);
  // BYTES with an optional K, M or G suffix (powers of 1024); flag names the flag in errors.
  static uint64_t parse_bytes(const std::string& flag, const std::string& v);
};

struct TrainConfig {
  ModelKind model = ModelKind::gpt;
  // GPT shape: 0 = take from --init's metadata/tensors, else the defaults in resolve().
  model::GptConfig gpt{0, 0, 0, 0, 0, 0, 0, 0, 0};  // moe_top_k 0: not given (1)
  MoeFlags moe;
  std::vector<int> hidden{256, 128};  // MLP hidden widths

  std::string init;        // safetensors weights to start from
  std::string data;        // GPT: token shard; MLP: IDX images
  std::string labels;      // MLP: IDX labels for --data
  std::string val_data;    // GPT: token shard; MLP: IDX images
  std::string val_labels;  // MLP
  double val_fraction = 0.2;  // MLP without --val-data: hold out this tail of --data

  int batch_size = 8;
  int seq_len = 64;
  int micro_batch_size = 0;  // 0 = whole batch at once
  bool recompute = false;    // GPT: keep only each block's input; recompute the block in backward
  bool sequence_parallel = false;  // GPT with --tp: split the residual stream's token rows over the group
  int64_t steps = 100;
  OptimizerKind optimizer = OptimizerKind::adamw;
  double lr = 3e-4, min_lr = -1;    // min_lr < 0: lr / 10
  int64_t warmup_steps = 0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0, momentum = 0.9;
  double grad_clip = 1.0;  // <= 0: no clipping
  uint64_t seed = 1337;
  int threads = 1;

  std::string metrics;   // JSONL, one row per step
  std::string save;      // final weights, safetensors
  std::string checkpoint_dir;
  int64_t save_every = 0;
  int keep_checkpoints = 2;
  bool overwrite_checkpoints = false;  // a fresh run may delete another run's checkpoints in checkpoint_dir
  std::string resume;
  int64_t stop_at_step = 0;  // stop this process after this many steps (time-boxed jobs, resume tests)
  double divergence_factor = 10;  // stop when the loss is above this x its running median (0: off) ...
  int divergence_window = 5;       // ... for this many steps in a row (train/divergence_guard.h)
  int64_t eval_every = 0;
  int eval_batches = 4;
  int log_every = 10;
  bool progress = true;

  // Parallel layout. dp = 0: all ranks are data-parallel (world / (tp * pp)).
  int nproc = 1, dp = 0, tp = 1, pp = 1, zero = 0;
  std::string schedule;  // a registered schedule generator's name; "": not given (pipeline::kDefaultSchedule)
  int virtual_stages = 1;
  std::vector<int> stage_layers;  // blocks per global stage (--stage-layers 2,3,3); empty: balanced by cost
  BackendKind backend = BackendKind::automatic;
  double comm_timeout = 300;
  double bucket_mb = 8;
  GradCommDtype grad_comm_dtype = GradCommDtype::f32;  // bf16 changes the math
  Precision precision = Precision::fp32;  // the model's products (tensor/blas.h); the rest stays float32
  // Communication-efficient data parallelism (change the math; dp > 1, ZeRO 0, no tp/pp):
  compress::CompressSpec compress;  // --compress topk:R | randk:R | qsgd:B | nuqsgd:B | powersgd:R | sign, parsed
  bool compress_adaptive = false;  // Accordion: light setting in critical regimes
  int compress_adaptive_every = 10;
  double compress_adaptive_eta = 0.5;
  bool dgc = false;                // Deep Gradient Compression on --compress topk (parallel/compress/dgc.h)
  int64_t dgc_warmup = 0;
  bool dgc_no_masking = false;     // --dgc --freeze-step (AdamW): keep the momentum where sent (dgc_adam.h)
  bool dgc_dense_vectors = false;  // --dgc --freeze-step (AdamW): tensors of < 2 dims sent whole (dgc_adam.h)
  bool dgc_global_topk = false;    // --dgc --freeze-step (AdamW): one top-k over the whole model (dgc_adam.h)
  bool dgc_split_clip = false;     // --dgc --freeze-step (AdamW): each share clipped at --grad-clip / N
  double dgc_lr_scale = 1.0;       // --dgc --freeze-step (AdamW): the learning rate times S from K on
  int64_t freeze_step = -1;        // --optimizer onebit-adam or adamw --dgc: AdamW for steps < K, compressed momentum after
                                   // (-1: not given, required)          // sparsity warm-up steps (4 stages: 25%, 6.25%, 1.5625%, 0.39% kept)
  int local_sgd = 0;               // H > 0: local steps, parameters averaged every H steps
  int64_t local_sgd_warmup = 0;    // exact data parallelism for the first K steps (post-local SGD)
  bool local_sgd_state = false;    // also average the optimizer state at each sync
  int learners = 0;                // --learners L > 0: Crossbow's SMA, L learner replicas per rank (sma_sync.h)
  double sma_alpha = -1;           // the SMA correction's alpha (-1: 1 / (L x dp))
  double sma_momentum = 0;         // the central model's momentum mu
  bool adaptive_batch = false;     // Pollux-style growth of the batch per update (train/adaptive_batch.h)
  int adaptive_batch_max = 8;      // the most global batches per optimizer step
  int adaptive_batch_every = 10;   // optimizer steps between decisions (and data steps before the first)
  SyncKind sync = SyncKind::exact;   // decentralized: gossip | decentralized-lowprec (changes the math)
  GossipGraphKind gossip_graph = GossipGraphKind::ring;
  GossipMixKind gossip_mix = GossipMixKind::unset;  // --sync gossip: what is mixed (unset: both)
  int consensus_every = 10;          // decentralized: consensus distance every K steps (0: never)
  AsyncMode async = AsyncMode::off;  // asynchronous data parallelism (changes the math unless staleness 0)
  bool delayed_update = false;       // the delay-1 rule (changes the math; train/weight_versions.h)
  bool overlap_update = false;       // ... with the update on its own thread (train/overlapped_update.h)
  bool vertical_sync = false;        // --schedule pipedream: one weight version per micro-batch on every stage
  double pipemare_correction = -1;   // --schedule pipemare: GAMMA in [0, 1) turns on the discrepancy correction
  int64_t pipemare_lr_anneal = 0;    // --schedule pipemare: K > 0 rescales stage j's lr by (p-j)^-(1-min(n/K,1))
  int servers = -1;                // ps: the last ps_servers() ranks hold the parameters, the others compute
                                   // (-1: --servers not given, 1 server)
  int staleness = 0;               // ps: a worker runs at most K steps ahead of the slowest
  Straggler straggler;             // --straggler RANK:MS (emulates a slow worker)
  int max_restarts = 0;            // the launcher restarts a failed job from the last checkpoint (train/elastic.h)
  int min_nproc = 0;               // ... with fewer ranks, down to this many, when ranks are lost (0: never fewer)
  // Workers (ranks computing gradients): the ranks minus the parameter servers.
  int ps_servers() const { return servers > 0 ? servers : 1; }
  int workers(int world_size) const { return async == AsyncMode::ps ? world_size - ps_servers() : world_size; }
  OffloadFlags offload;
  std::string summary;                  // JSON run summary (rank 0)
  std::string trace;                    // Chrome trace JSON (all ranks, merged by rank 0)
  // The run's resolved configuration (TOML, rendered by the CLI from its flags) and where rank 0 writes it
  // before the first step; an empty path writes nothing (apps/meshtrain/config_file.h has the rule).
  std::string resolved_config, resolved_config_path;

  // Checks the flags alone; world_size is the number of ranks actually running.
  void validate(int world_size) const;
};

}  // namespace mt::train
