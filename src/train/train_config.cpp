// TrainConfig::validate: every flag and combination checked once, before any work starts, with the values in
// the message. The mesh (parallel/mesh/grid.h) and the batch layout (train/layout.h) check their own part.
#include <string>

#include "core/error.h"
#include "parallel/compress/spec.h"
#include "parallel/mesh/grid.h"
#include "train/layout.h"
#include "train/train_config.h"

namespace mt::train {

void TrainConfig::validate(int world_size) const {
  MT_CHECK_INPUT(model == "gpt" || model == "mlp", "--model must be gpt or mlp, got '", model, "'");
  MT_CHECK_INPUT(!data.empty(), "--data is required");
  MT_CHECK_INPUT(batch_size > 0, "--batch-size must be positive, got ", batch_size);
  MT_CHECK_INPUT(seq_len > 0, "--seq-len must be positive, got ", seq_len);
  MT_CHECK_INPUT(steps > 0, "--steps must be positive, got ", steps);
  MT_CHECK_INPUT(optimizer == "adamw" || optimizer == "sgd", "--optimizer must be adamw or sgd, got '", optimizer,
                 "'");
  MT_CHECK_INPUT(lr >= 0, "--lr must be >= 0, got ", lr);
  MT_CHECK_INPUT(warmup_steps >= 0, "--warmup-steps must be >= 0, got ", warmup_steps);
  MT_CHECK_INPUT(beta1 >= 0 && beta1 < 1, "--beta1 must be in [0, 1), got ", beta1);
  MT_CHECK_INPUT(beta2 >= 0 && beta2 < 1, "--beta2 must be in [0, 1), got ", beta2);
  MT_CHECK_INPUT(eps > 0, "--eps must be positive, got ", eps);
  MT_CHECK_INPUT(threads >= 1, "--threads must be >= 1, got ", threads);
  MT_CHECK_INPUT(save_every >= 0 && (save_every == 0 || !checkpoint_dir.empty()),
                 "--save-every needs --checkpoint-dir");
  MT_CHECK_INPUT(stop_at_step >= 0, "--stop-at-step must be >= 0, got ", stop_at_step);
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
