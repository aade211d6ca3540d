// TrainConfig::validate: every flag and combination checked once, before any work starts, with the values in
// the message. The mesh (parallel/mesh/grid.h) and the batch layout (train/layout.h) check their own part.
#include <sys/sysinfo.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "parallel/compress/spec.h"
#include "parallel/mesh/grid.h"
#include "train/layout.h"
#include "train/train_config.h"

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
  const double gC = std::max(gpt.n_embd, 1), gV = std::max(gpt.vocab_size, 1), gP = std::max(gpt.n_positions, 1),
               gL = std::max(gpt.n_layer, 1);
  MT_CHECK_INPUT(model != "gpt" || std::max({gV, gP, 4 * gC}) * gC < 2147483648.0, "the GPT shape (--n-embd ",
                 gpt.n_embd, " --vocab-size ", gpt.vocab_size, " --n-positions ", gpt.n_positions, ") gives a tensor of ",
                 std::max({gV, gP, 4 * gC}) * gC, " elements (", std::max({gV, gP, 4 * gC}) * gC * 4,
                 " bytes); one tensor is limited to 2^31 elements");
  const double gpt_weight_bytes = 4 * ((gV + gP) * gC + gL * (12 * gC * gC + 13 * gC)), host_bytes = host_memory_bytes();
  MT_CHECK_INPUT(model != "gpt" || gpt_weight_bytes <= host_bytes, "the GPT shape (--n-layer ", gpt.n_layer,
                 " --n-embd ", gpt.n_embd, " --vocab-size ", gpt.vocab_size, " --n-positions ", gpt.n_positions,
                 ") needs ", gpt_weight_bytes, " bytes for its weights alone (every rank gathers them whole to save) ",
                 "but this host has ", host_bytes, " bytes of memory and swap; reduce it");
  MT_CHECK_INPUT(save_every >= 0, "--save-every must be >= 0, got ", save_every);
  MT_CHECK_INPUT(save_every == 0 || !checkpoint_dir.empty(), "--save-every needs --checkpoint-dir");
  MT_CHECK_INPUT(stop_at_step >= 0, "--stop-at-step must be >= 0, got ", stop_at_step);
  MT_CHECK_INPUT(stop_at_step == 0 || !checkpoint_dir.empty(), "--stop-at-step ", stop_at_step,
                 " ends the run early to be resumed: it needs --checkpoint-dir (else the work is lost)");
  MT_CHECK_INPUT(!overwrite_checkpoints || (resume.empty() && !checkpoint_dir.empty()),
                 "--overwrite-checkpoints needs --checkpoint-dir and a fresh run (not --resume)");
  MT_CHECK_INPUT(divergence_factor == 0 || (divergence_factor > 1 && std::isfinite(divergence_factor)),
                 "--divergence-factor must be 0 (off) or finite and > 1, got ", divergence_factor);
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
  // The mesh and the batch layout check themselves (degrees tile the ranks; batch, micro-batches, schedule).
  const parallel::MeshGrid grid(world_size, dp, tp, pp, async == "ps" ? ps_servers() : 0);
  const int d = grid.dp();
  const BatchLayout layout(*this, d);
  moe.validate(*this, d);
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
}

}  // namespace mt::train
