// meshtrain train: flags -> TrainConfig -> run_training.
#include <unistd.h>

#include <cstdio>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "apps/meshtrain/commands.h"
#include "apps/meshtrain/config_file.h"
#include "core/fs.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_generator.h"
#include "train/trainer.h"

namespace mt::cli {

namespace {

// The model, its shape and its data.
void add_model_flags(CLI::App* s, train::TrainConfig& c) {
  std::string models;  // the model registry's rows (train/model_registry.cpp)
  for (const auto& v : train::flag_values(train::ModelKind{}))
    models += (models.empty() ? "" : " | ") + std::string(v.name);
  add_enum_option(s, "--model", c.model, models, true);
  s->add_option("--init", c.init, "safetensors weights to start from (Hugging Face GPT-2 names)");
  s->add_option("--data", c.data, "GPT: llm.c token shard (.bin); MLP: IDX images");
  s->add_option("--labels", c.labels, "MLP: IDX labels for --data");
  s->add_option("--val-data", c.val_data, "held-out data: token shard (GPT) or IDX images (MLP)");
  s->add_option("--val-labels", c.val_labels, "MLP: IDX labels for --val-data");
  s->add_option("--val-fraction", c.val_fraction, "MLP without --val-data: hold out this tail of --data")
      ->capture_default_str();
  s->add_option("--n-layer", c.gpt.n_layer, "GPT layers (default: from --init, else 4)")->check(kPositiveInt);
  s->add_option("--n-head", c.gpt.n_head, "GPT attention heads (default: from --init, else 4)")->check(kPositiveInt);
  s->add_option("--n-embd", c.gpt.n_embd, "GPT width (default: from --init, else 128)")->check(kPositiveInt);
  s->add_option("--vocab-size", c.gpt.vocab_size, "GPT vocabulary (default: from --init, else 256)")
      ->check(kPositiveInt);
  s->add_option("--n-positions", c.gpt.n_positions,
                "GPT context length (default: from --init, else the larger of 256 and --seq-len)")
      ->check(kPositiveInt);
  s->add_option("--hidden", c.hidden, "MLP hidden widths, e.g. 256,128")
      ->delimiter(',')
      ->capture_default_str()
      ->check(kPositiveInt);
  s->add_option("--batch-size", c.batch_size, "global batch: sequences (GPT) or examples (MLP) per step")
      ->capture_default_str();
  s->add_option("--seq-len", c.seq_len, "GPT tokens per sequence")->capture_default_str();
  s->add_option("--micro-batch-size", c.micro_batch_size,
                "split each step's batch into micro-batches of this size, gradients accumulated (0 = off)")
      ->capture_default_str();
  s->add_flag("--recompute", c.recompute,
              "GPT: keep only each block's input and recompute the block during backward (less activation memory, "
              "about one more forward of compute; same results)");
}

// Steps, optimizer and learning-rate schedule.
void add_optimizer_flags(CLI::App* s, train::TrainConfig& c) {
  s->add_option("--steps", c.steps, "optimizer steps (total, also when resuming)")->capture_default_str();
  add_enum_option(s, "--optimizer", c.optimizer,
                  "adamw | sgd (with momentum) | lamb (AdamW's moments, per-tensor trust ratio) | adafactor "
                  "(factored second moments, no momentum; uses --lr and --weight-decay only)",
                  true);
  s->add_option("--lr", c.lr, "peak learning rate")->capture_default_str();
  // A negative value is refused here: the config keeps -1 as "not given" (lr / 10).
  s->add_option_function<double>(
      "--min-lr",
      [&c](double v) {
        MT_CHECK_INPUT(v >= 0, "--min-lr must be in [0, --lr], got ", v);
        c.min_lr = v;
      },
      "final learning rate of the cosine decay (default lr/10)");
  s->add_option("--warmup-steps", c.warmup_steps, "linear warmup steps")->capture_default_str();
  s->add_option("--beta1", c.beta1, "AdamW and LAMB beta1")->capture_default_str();
  s->add_option("--beta2", c.beta2, "AdamW and LAMB beta2")->capture_default_str();
  s->add_option("--eps", c.eps, "AdamW and LAMB epsilon")->capture_default_str();
  s->add_option("--weight-decay", c.weight_decay, "decoupled weight decay on tensors with >= 2 dims")
      ->capture_default_str();
  s->add_option("--momentum", c.momentum, "SGD momentum")->capture_default_str();
  s->add_option("--grad-clip", c.grad_clip, "clip the global gradient L2 norm to this (<= 0: off)")
      ->capture_default_str();
  s->add_option("--seed", c.seed, "seed of the counter-based initializer")->capture_default_str();
  s->add_option("--threads", c.threads, "threads in this process (BLAS and loops)")
      ->capture_default_str()
      ->check(kThreads);
}

// Metrics, weights, checkpoints, divergence stop, evaluation and progress.
void add_output_flags(CLI::App* s, train::TrainConfig& c) {
  s->add_option("--metrics", c.metrics, "write one JSON object per step to this file");
  s->add_option("--save", c.save, "write the final weights to this safetensors file");
  s->add_option("--checkpoint-dir", c.checkpoint_dir,
                "directory for checkpoints (one at the end; --save-every K for more); a fresh run refuses a "
                "directory holding another run's checkpoints");
  s->add_flag("--overwrite-checkpoints", c.overwrite_checkpoints,
              "a fresh run deletes the checkpoints already in --checkpoint-dir instead of refusing");
  s->add_option("--save-every", c.save_every, "write a checkpoint every K steps (and at the end)")
      ->capture_default_str();
  s->add_option("--keep-checkpoints", c.keep_checkpoints, "keep the newest K checkpoints (0 = all)")
      ->capture_default_str();
  s->add_option("--resume", c.resume, "continue from the newest checkpoint in this directory");
  s->add_option("--stop-at-step", c.stop_at_step,
                "stop this process after that many steps, writing a checkpoint (time-boxed jobs)")
      ->capture_default_str();
  s->add_option("--divergence-factor", c.divergence_factor,
                "stop (naming the step and the last good checkpoint) when the loss stays above this x its running "
                "median (and median + 1) for --divergence-window steps in a row; 0 = off")
      ->capture_default_str();
  s->add_option("--divergence-window", c.divergence_window, "consecutive high steps that count as divergence")
      ->capture_default_str();
  s->add_option("--eval-every", c.eval_every, "evaluate on the held-out data every K steps")->capture_default_str();
  s->add_option("--eval-batches", c.eval_batches, "GPT: batches per evaluation")->capture_default_str();
  s->add_option("--log-every", c.log_every, "progress line every K steps when stderr is not a terminal")
      ->capture_default_str();
}

// Processes, backend and the data-parallel reduction.
void add_launch_flags(CLI::App* s, train::TrainConfig& c) {
  s->add_option("--nproc", c.nproc,
                "worker processes on this host, over shared memory (under mpirun: ignored); when --nproc x --threads "
                "fits the CPUs allowed, each worker is bound to CPUs of its own (MESHTRAIN_SHM_BIND=0: not)")
      ->capture_default_str();
  add_enum_option(s, "--backend", c.backend, "auto | shm | mpi (auto: mpi under mpirun, else shm)", true,
                  "TEXT:{auto,shm,mpi}");
  s->add_option("--comm-timeout", c.comm_timeout,
                "seconds any communication may wait before failing (any value > 0; inf: wait forever)")
      ->capture_default_str();
  s->add_option("--max-restarts", c.max_restarts,
                "after a failure, restart the job from the last checkpoint in --checkpoint-dir, at most N times "
                "(shm launcher; docs/faults.md)")
      ->capture_default_str();
  s->add_option("--min-nproc", c.min_nproc,
                "when ranks' places are lost, a restart may continue with fewer ranks, down to K (0: never fewer)")
      ->capture_default_str();
  s->add_option("--dp", c.dp, "data-parallel degree (default: ranks / --tp)")->check(kPositiveInt);
  s->add_option("--zero", c.zero, "ZeRO stage: 0 replicate, 1 shard optimizer state, 2 + gradients, 3 + parameters")
      ->capture_default_str();
  s->add_option("--bucket-mb", c.bucket_mb, "gradient bucket size for overlapped reduction")->capture_default_str();
  add_enum_option(s, "--grad-comm-dtype", c.grad_comm_dtype,
                  "f32 | bf16: the data-parallel gradient exchange; bf16 halves gradient bytes moved but rounds "
                  "gradients (changes the math; independent of --precision)",
                  true);
  add_enum_option(s, "--precision", c.precision,
                  "fp32 | bf16: the model's matrix products (linear, attention, tied logits, MoE router and experts, "
                  "forward and backward); bf16 rounds both inputs of each product to bfloat16 and accumulates in "
                  "float32 (native on CPUs with bf16 instructions, else emulated: see the run's first line). "
                  "Master weights, gradients, their exchange (--grad-comm-dtype), the optimizer and checkpoints "
                  "stay float32",
                  true);
}

// Methods that change the math: compressed exchange, Local SGD, asynchronous training.
void add_method_flags(CLI::App* s, train::TrainConfig& c) {
  // Communication-efficient data parallelism: these change the math (not reproductions of the exact run).
  s->add_option_function<std::string>(
      "--compress",
      [&c](const std::string& v) {
        MT_CHECK_INPUT(!v.empty(),
                       "--compress needs a method (topk:RATIO, randk:RATIO, qsgd:BITS, nuqsgd:BITS, "
                       "powersgd:RANK or sign); got an empty value");
        c.compress = compress::parse_compress_spec(v);
      },
      "CHANGES THE MATH. Compressed gradient exchange (dp > 1, ZeRO 0): topk:RATIO | randk:RATIO "
      "(sparse, error feedback) | qsgd:BITS | nuqsgd:BITS (unbiased stochastic quantization, bit-packed) | "
      "powersgd:RANK (low rank, error feedback) | sign (1 bit + scale, error feedback). With --tp/--pp it runs "
      "over the data-parallel group of each (tp, pp) coordinate on that rank's part of the model: the codec "
      "sees each rank's shard of a tensor split by --tp as a tensor of its own (top-k of the shard, PowerSGD "
      "factors of the shard's matrix, error feedback per shard); the tied embedding's parts on the first and "
      "last stage are exchanged each on its stage, then summed");
  s->add_flag("--compress-adaptive", c.compress_adaptive,
              "CHANGES THE MATH. Accordion: per layer, the light setting (4x entries / +4 bits / 4x rank / "
              "exact) while the gradient norm changes fast (critical regime), the chosen one otherwise");
  s->add_option("--compress-adaptive-every", c.compress_adaptive_every, "Accordion: steps per decision")
      ->capture_default_str();
  s->add_option("--compress-adaptive-eta", c.compress_adaptive_eta,
                "Accordion: relative change of the gradient norm that marks a critical regime")
      ->capture_default_str();
  s->add_flag("--dgc", c.dgc,
              "CHANGES THE MATH. Deep Gradient Compression with --compress topk:RATIO: each rank clips its share "
              "of the gradient at --grad-clip / sqrt(dp) (instead of the global clip after the exchange), "
              "accumulates it as momentum-corrected velocity (u = m u + g, v += u; m = --momentum with "
              "--optimizer sgd, which then applies no momentum itself; m = 0 with adamw, whose first moment is "
              "the momentum), sends the top-k of v and zeroes u and v where sent");
  s->add_option("--dgc-warmup-steps", c.dgc_warmup,
                "DGC sparsity warm-up: W steps in 4 equal stages keeping 25%, 6.25%, 1.5625%, 0.390625% "
                "(never less than RATIO), then RATIO; 0: RATIO from the start")
      ->capture_default_str();
  s->add_option("--freeze-step", c.freeze_step,
                "--optimizer onebit-adam (CHANGES THE MATH after K): AdamW with exact gradients for steps < K, "
                "then the variance frozen and the momentum exchanged as signs with a scale, error feedback on "
                "the worker and the server side; --grad-clip then applies to each rank's share of the gradient. "
                "With --optimizer adamw --compress topk:R --dgc: AdamW with exact gradients for steps < K, then "
                "the variance frozen and DGC run on each rank's momentum, preconditioned (docs/parallelism.md)");
  s->add_flag("--dgc-no-masking", c.dgc_no_masking,
              "--dgc --freeze-step K: keep each rank's momentum where its accumulated update was sent (no "
              "momentum factor masking)");
  s->add_flag("--dgc-dense-vectors", c.dgc_dense_vectors,
              "--dgc --freeze-step K: tensors of fewer than 2 dims (biases, LayerNorm) are sent whole every step "
              "(Adam with the variance frozen for them), the others as top-k");
  s->add_flag("--dgc-global-topk", c.dgc_global_topk,
              "--dgc --freeze-step K: one top-k over all tensors not sent whole (one threshold on the model's "
              "preconditioned accumulated update) instead of one per tensor");
  s->add_flag("--dgc-split-clip", c.dgc_split_clip,
              "--dgc --freeze-step K: from K on each rank's share is clipped at --grad-clip / N (N data-parallel "
              "ranks), so the sum of the clipped shares has norm <= --grad-clip, the bound of the exact steps");
  s->add_option("--dgc-lr-scale", c.dgc_lr_scale,
                "--dgc --freeze-step K (CHANGES THE MATH after K): the learning rate times S from step K on")
      ->capture_default_str();
  s->add_option("--local-sgd", c.local_sgd,
                "CHANGES THE MATH. Local SGD: each rank steps on its own windows; parameters averaged every H "
                "steps (dp > 1, ZeRO 0) over the data-parallel group (with --tp/--pp: of each (tp, pp) "
                "coordinate, each rank its part of the model)")
      ->capture_default_str();
  s->add_option("--local-sgd-warmup", c.local_sgd_warmup,
                "exact data parallelism for the first K steps, local steps after (post-local SGD)")
      ->capture_default_str();
  s->add_flag("--local-sgd-state", c.local_sgd_state, "also average the optimizer state at each sync");
  s->add_option("--learners", c.learners,
                "CHANGES THE MATH. Crossbow's synchronous model averaging: L learner replicas per rank, each "
                "stepping on its own micro-batches (--micro-batch-size: a multiple of L per rank), corrected toward "
                "a central average model every step; evaluation and files hold the central model (0: off)")
      ->capture_default_str();
  s->add_option("--sma-alpha", c.sma_alpha,
                "--learners: the correction c_j = alpha (w_j - z), in [0, 1] (default 1 / (L x dp))")
      ->check(CLI::NonNegativeNumber);  // the default's -1 (not given) is never checked
  s->add_flag("--adaptive-batch", c.adaptive_batch,
              "CHANGES THE MATH. Pollux-style: every --adaptive-batch-every optimizer steps, double the global "
              "batches averaged per optimizer step (k) while the predicted goodput (measured throughput x "
              "statistical efficiency from the gradient noise scale) improves; learning rate x sqrt(k); --steps "
              "counts global batches; the gradient is exchanged and clipped once per optimizer step (exact exchange, ZeRO 0)");
  s->add_option("--adaptive-batch-max", c.adaptive_batch_max, "--adaptive-batch: the largest k")
      ->capture_default_str();
  s->add_option("--adaptive-batch-every", c.adaptive_batch_every,
                "--adaptive-batch: optimizer steps between decisions (and global batches before the first)")
      ->capture_default_str();
  s->add_option("--sma-momentum", c.sma_momentum,
                "--learners: momentum mu of the central model: z += sum_j c_j + mu (z - z_prev)")
      ->capture_default_str();
  add_enum_option(s, "--sync", c.sync,
                  "CHANGES THE MATH unless exact. exact: gradients all-reduced over dp (default); gossip: no "
                  "all-reduce, each rank steps on its own windows then averages its model with its --gossip-graph "
                  "neighbours every step (D-PSGD); decentralized-lowprec: BAGUA's variant, 8-bit model differences "
                  "with the ring neighbours (dp > 1, ZeRO 0, no tp/pp)",
                  true);
  add_enum_option(s, "--gossip-graph", c.gossip_graph,
                  "--sync gossip: ring (each rank with its two neighbours, 1/3 each) | exp (one peer per step at "
                  "hop 2^(step mod ceil(log2 dp)), 1/2 each)",
                  true);
  add_enum_option(s, "--gossip-mix", c.gossip_mix,
                  "--sync gossip: what each rank mixes with its graph neighbours (the same W, the same messages). "
                  "params: its model after its own optimizer step (D-PSGD); grads: its own share's mean gradient "
                  "before the optimizer step, g_r <- sum_j W_rj g_j, and no model mixing (replicas can drift apart); "
                  "both (default): the gradient before the step and the model after it (twice the bytes); "
                  "at 2 ranks grads and both are exact data parallelism with any optimizer",
                  false);
  s->add_option("--consensus-every", c.consensus_every,
                "--sync gossip/decentralized-lowprec: measure the consensus distance sqrt(mean_r |x_r - mean x|^2) "
                "every K steps (one all-reduce of the model, not counted in comm_bytes; 0: never)")
      ->capture_default_str();
  add_enum_option(s, "--async", c.async,
                  "CHANGES THE MATH (unless --staleness 0). ps: parameter server: the last --servers ranks hold "
                  "slices of the parameters and optimizer state and apply updates, the others compute gradients "
                  "and push/pull; hogwild: --nproc threads of one process update shared parameters without "
                  "locks (MLP, SGD)",
                  false);
  // -1 stays the config's "not given"; a given value must be a count.
  s->add_option("--servers", c.servers, "--async ps: parameter-server ranks (slices balanced by bytes; default 1)")
      ->check(kPositiveInt);
  s->add_option("--staleness", c.staleness,
                "--async ps: a worker computes at most K steps ahead of the slowest (0: synchronous, equal to "
                "exact data parallelism)")
      ->capture_default_str();
  s->add_flag("--delayed-update", c.delayed_update,
              "CHANGES THE MATH (one-step-stale weights). The delayed parameter update (ZeRO-Offload's DPU, "
              "PipeDream-2BW's rule): step t's gradient is taken at the weights W(t-1) (W(-1) = W(0)), clipped by "
              "its own norm and applied to W(t): W(t+1) = opt(W(t), g_t); the row of step t reports that "
              "evaluation's loss and norm. Keeps a second copy of the weights; any exact layout (dp, ZeRO 0-3, "
              "tp, pp) gives the same run; not with --async or --local-sgd");
  s->add_flag("--overlap-update", c.overlap_update,
              "with --delayed-update: step t's optimizer update (with --offload optimizer, its state's reads and "
              "writes) runs on a thread of its own while step t+1's forward and backward run; the same bits as "
              "without it. One process or dp with ZeRO 0/1, --optimizer adamw or sgd. Without --delayed-update, "
              "with --zero 3 --offload optimizer,params[,grads] (exact): step t's update runs on a thread of its own "
              "while step t+1's forward starts, each group's forward waiting only for its own shard's update; "
              "the same bits as without it");
  s->add_option_function<std::string>(
      "--straggler", [&c](const std::string& v) { c.straggler = train::Straggler::parse(v); },
                "RANK:MS: that rank sleeps MS milliseconds in every step (emulates a slow worker, for "
                "experiments with --async)");
}

// Offload tiers and the memory budget (docs/offload.md).
void add_offload_flags(CLI::App* s, train::TrainConfig& c) {
  s->add_option_function<std::string>(
      "--offload", [&c](const std::string& v) { c.offload.parse_kinds(v); },
      "optimizer: each rank's optimizer state (its ZeRO shard) lives in a file under --offload-dir and streams "
      "through a few tile buffers, read ahead of the update and written behind it on an I/O thread; the math is "
      "unchanged (same bits as in memory). params: the float32 parameters (ZeRO 3: the rank's shard, read ahead "
      "of each bucket's gather; ZeRO 0-2: the full parameters, read group by group around each use); grads: the "
      "gradients (ZeRO 2/3: the reduced shard; ZeRO 0/1: the full gradient, around each group's backward); the "
      "update streams them tile by tile. Any of the three alone or comma-separated, e.g. optimizer,params,grads");
  s->add_flag("--offload-activations", c.offload.activations,
              "each transformer block's saved activations (with --recompute, its input) are written to a file "
              "under --offload-dir after the next block's forward and read back ahead of the block's backward; "
              "same bits as in memory (gpt)");
  s->add_option("--offload-dir", c.offload.dir,
                "directory for --offload's files (created unnamed: nothing is left there when the run ends, fails "
                "or is killed); must exist and be writable, with room for the state (checked at start)");
  s->add_option_function<std::string>(
      "--offload-tile",
      [&c](const std::string& v) { c.offload.tile_bytes = train::OffloadFlags::parse_bytes("--offload-tile", v); },
      "bytes of each state buffer per tile (one read and one write per tile; a multiple of 4096, K/M/G; "
      "default 1M)");
  s->add_option_function<std::string>(
      "--memory-limit",
      [&c](const std::string& v) { c.offload.memory_limit = train::OffloadFlags::parse_bytes("--memory-limit", v); },
      "bytes per rank (K/M/G): the run plans what stays resident (parameters, gradients, optimizer state, "
      "activations) and refuses to start when the plan does not fit; --summary reports peak RSS against it");
}

// Tensor, sequence and pipeline parallelism.
void add_model_parallel_flags(CLI::App* s, train::TrainConfig& c) {
  s->add_option("--tp", c.tp,
                "tensor-parallel degree (Megatron-style GPT blocks, vocabulary-parallel "
                "embedding and loss); ranks = dp x tp x pp, tensor fastest, then data, then pipeline")
      ->capture_default_str();
  s->add_flag("--sequence-parallel", c.sequence_parallel,
              "with --tp: split the residual stream, LayerNorms and "
              "embedding sums by token rows over the tensor-parallel group (all-gather / reduce-scatter instead of "
              "all-reduce; less activation memory)");
  s->add_option("--pp", c.pp,
                "pipeline-parallel degree: the blocks split into stages balanced by estimated "
                "cost (or --stage-layers); with --dp, --tp and --zero 0 or 1")
      ->capture_default_str();
  s->add_option("--stage-layers", c.stage_layers,
                "blocks per pipeline stage, e.g. 2,3,3 (pp x virtual-stages "
                "entries summing to n_layer; default: balanced by estimated cost)")
      ->delimiter(',');
  // The names are the schedule registry's; TrainConfig::validate checks the value against it.
  std::string stale;  // the generators whose update rule keeps two weight versions
  for (const std::string& n : pipeline::schedule_names())
    if (pipeline::find_schedule(n).weight_versions() > 1) stale += (stale.empty() ? "" : ", ") + n;
  s->add_option("--schedule", c.schedule,
                "pipeline schedule: " + pipeline::schedule_names_joined(" | ") + " (default " +
                    pipeline::kDefaultSchedule + ")" +
                    (stale.empty() ? std::string()
                                   : "; " + stale +
                                         " CHANGES THE MATH: the delay-1 rule of --delayed-update (one-step-stale "
                                         "weights, two weight versions per stage), in 1F1B's order") +
                    "; pipedream and pipemare CHANGE THE MATH: 1F1B's order with an update of each stage after "
                    "EVERY micro-batch's backward (the gradient of that micro-batch's mean loss, clipped by its "
                    "own global norm over all stages, lr of the step; AdamW counts updates); pipedream's backward "
                    "reads the weight version its forward read (stashed: stage s of p keeps up to p-s), pipemare's "
                    "(Pipelined Backpropagation; PipeMare with --pipemare-lr-anneal, --pipemare-correction) the newest; both without a flush between steps (1F1B over the micro-batches of a window of steps; windows end at every evaluation, checkpoint and the last step) when m >= --pp, else flushing every step");
  s->add_option("--virtual-stages", c.virtual_stages, "chunks per pipeline rank (interleaved)")->capture_default_str();
  s->add_flag("--vertical-sync", c.vertical_sync,
              "--schedule pipedream: micro-batch i reads, on every stage, the weight version stage 0 read when i "
              "entered the pipeline (PipeDream's vertical sync; without it each stage's forward reads its newest)");
  s->add_option("--pipemare-lr-anneal", c.pipemare_lr_anneal,
                 "--schedule pipemare: PipeMare's learning-rate rescheduling: update n (one per micro-batch, counted "
                 "over the run) of stage j of p uses lr * (p-j)^-(1 - min(n/K, 1)), annealing to lr over K updates; "
                 "the tied embedding takes stage 0's factor (0: off, Pipelined Backpropagation's lr)")
      ->capture_default_str();
  s->add_option("--pipemare-correction", c.pipemare_correction,
                 "--schedule pipemare: PipeMare's discrepancy correction with decay GAMMA in [0, 1): the backward "
                 "of a micro-batch whose forward read d versions ago multiplies by W - d delta, delta the "
                 "moving average (GAMMA) of the stage's weight changes per update (-1: off)")
      ->capture_default_str();
}

// Mixture of experts (GPT): the shape (saved in the weights' metadata) and how tokens are routed.
void add_moe_flags(CLI::App* s, train::TrainConfig& c) {
  s->add_option("--moe-every", c.gpt.moe_every,
                "GPT: the MLP of blocks K-1, 2K-1, ... becomes --experts expert MLPs behind a router (0: dense)");
  s->add_option("--experts", c.gpt.experts, "MoE: experts per MoE block (E)");
  s->add_option("--moe-top-k", c.gpt.moe_top_k, "MoE: experts per token, 1 (Switch) or 2 (GShard) (default 1)");
  s->add_option("--expert-hidden", c.gpt.expert_hidden, "MoE: hidden width of an expert (default 4 x n_embd)");
  s->add_option("--capacity-factor", c.moe.capacity_factor,
                "MoE: each expert admits ceil(F x k x group tokens / E) tokens of a routing group, first choices "
                "first; the rest are dropped (pass through the residual). 0: dropless")
      ->capture_default_str();
  s->add_option("--moe-group-windows", c.moe.group_windows,
                "MoE: tokens are routed (and capacity counted) in groups of G consecutive windows of the global "
                "batch; G must divide the micro-batch")
      ->capture_default_str();
  add_enum_option(s, "--moe-second-policy", c.moe.second_policy,
                  "MoE top-2: all (always keep the second choice) | random (keep it when 2 x its gate > u)", true);
  s->add_option("--moe-aux-loss", c.moe.aux_loss,
                "MoE: alpha of the load-balancing loss E sum_i f_i P_i (mean over groups, per MoE block)")
      ->capture_default_str();
  s->add_option("--moe-z-loss", c.moe.z_loss, "MoE: beta of the router z-loss mean(logsumexp(logits)^2)")
      ->capture_default_str();
  s->add_option("--ep", c.moe.ep,
                "MoE: expert-parallel degree: each MoE block's experts split over ep ranks of the data-parallel "
                "group, tokens sent to their experts and back by all-to-all (ep divides dp and --experts); a rank "
                "stores only its experts, their gradients reduced over the dp/ep ranks holding the same ones")
      ->capture_default_str();
}

// Flags that only one model reads: given for the other, they would do nothing, so they are refused (and left
// out of the other model's resolved configuration).
const std::set<std::string> kGptOnly = {"--n-layer",    "--n-head",       "--n-embd",
                                        "--vocab-size", "--n-positions",  "--seq-len",
                                        "--recompute",  "--eval-batches", "--sequence-parallel"};
const std::set<std::string> kMlpOnly = {"--labels", "--val-labels", "--val-fraction", "--hidden"};
// Written to the resolved configuration only as comments: repeating a run must not resume it or delete
// checkpoints unless asked again on the command line.
const std::set<std::string> kNotRepeated = {"--resume", "--overwrite-checkpoints"};

const std::set<std::string>& other_model_flags(const train::TrainConfig& c) {
  return c.model == train::ModelKind::gpt ? kMlpOnly : kGptOnly;
}

// `lines`: where --config set a flag, to name the file's line in the message.
void check_model_flags(const CLI::App& sub, const train::TrainConfig& c, const ConfigLines& lines,
                       const std::string& config) {
  const bool gpt = c.model == train::ModelKind::gpt;
  for (const std::string& f : other_model_flags(c)) {
    const auto at = lines.find(f);
    MT_CHECK_INPUT(sub.count(f) == 0,
                   at == lines.end() ? "" : str(config, ":", at->second, ": key '", f.substr(2), "': "), f,
                   " does nothing for --model ", train::flag_name(c.model), " (it is for --model ", gpt ? "mlp" : "gpt",
                   "); remove it");
  }
}

// The run's resolved configuration and where rank 0 writes it (config_file.h has the rule). It must not land on
// a file the run reads or writes; on the --config file itself only when identical (repeating a run from its own
// resolved configuration), so a hand-written file is never replaced. A path that cannot be written fails on rank 0
// before the first step, naming it (core/fs.h).
void set_resolved_config(const CLI::App& sub, train::TrainConfig& c, const std::string& config) {
  const std::string path = resolved_config_path(c.metrics, c.save);
  if (path.empty()) return;
  const char* from = resolved_config_path(c.metrics, "") == path ? "--metrics" : "--save";
  const std::string text = render_config(sub, other_model_flags(c), kNotRepeated);
  const std::vector<std::pair<const char*, std::string>> files = {
      {"--data", c.data},  {"--val-data", c.val_data}, {"--labels", c.labels}, {"--val-labels", c.val_labels},
      {"--init", c.init},  {"--metrics", c.metrics},   {"--save", c.save},     {"--summary", c.summary},
      {"--trace", c.trace}};
  for (const auto& [flag, file] : files)
    MT_CHECK_INPUT(file.empty() || !same_file(path, file), "the run's configuration goes beside ", from, " to ", path,
                   ", which is the ", flag, " file; give ", from, " another name (e.g. ending .jsonl)");
  MT_CHECK_INPUT(config.empty() || !same_file(path, config) || read_file(config) == text, "the run's configuration ",
                 "goes beside ", from, " to ", path, ", which is the --config file, and differs from it; give ", from,
                 " another path (a --config file is rewritten only by the identical text)");
  c.resolved_config_path = path;
  c.resolved_config = text;
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto cfg = std::make_shared<train::TrainConfig>();
  CLI::App* sub = app.add_subcommand("train", "train a GPT or an MLP");
  auto& c = *cfg;
  auto config = std::make_shared<std::string>();
  sub->add_option("--config", *config,
                  "read flags from this TOML file: keys are the flag names without dashes (batch-size = 8); flags "
                  "given on the command line override it. Every run writes its resolved configuration beside "
                  "--metrics (metrics.toml), which --config repeats (docs/config.md)");
  // --help lists the flags in this order.
  add_model_flags(sub, c);
  add_optimizer_flags(sub, c);
  add_output_flags(sub, c);
  auto quiet = std::make_shared<bool>(false);
  sub->add_flag("--quiet", *quiet, "no progress output");
  add_launch_flags(sub, c);
  add_method_flags(sub, c);
  sub->add_option("--trace", c.trace, "write a Chrome trace (open in Perfetto): per-rank compute and comm tracks");
  sub->add_option("--summary", c.summary, "write a JSON run summary (throughput, per-rank memory) here");
  add_model_parallel_flags(sub, c);
  add_moe_flags(sub, c);
  add_offload_flags(sub, c);
  sub->callback([cfg, quiet, sub, config] {
    const ConfigLines lines = config->empty() ? ConfigLines{} : apply_config_file(*sub, *config);
    check_model_flags(*sub, *cfg, lines, *config);
    cfg->progress = !*quiet;
    set_resolved_config(*sub, *cfg, *config);
    int rc = train::train_main(*cfg);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace mt::cli
