// Mixture-of-experts flags: checked once against the model and the layout.
#include <cmath>

#include "core/error.h"
#include "train/model_registry.h"
#include "train/train_config.h"

namespace mt::train {

void MoeFlags::validate(const TrainConfig& cfg, int dp) const {
  const model::GptConfig& g = cfg.gpt;
  const bool moe_model = g.moe_every > 0 || !cfg.init.empty();  // --init may hold an MoE model
  const bool router = model_entry(cfg.model).has_router;
  MT_CHECK_INPUT(router || (g.moe_every == 0 && g.experts == 0 && ep == 1),
                 "--moe-every, --experts and --ep are for --model gpt (the MLP has no experts)");
  if (!router) {             // a routing flag away from its default on a model without a router (an explicit
    const MoeFlags unset;    // default value cannot be told apart from an absent flag and passes)
    const char* given = g.moe_top_k != 0                              ? "--moe-top-k"
                        : g.expert_hidden != 0                        ? "--expert-hidden"
                        : capacity_factor != unset.capacity_factor    ? "--capacity-factor"
                        : group_windows != unset.group_windows        ? "--moe-group-windows"
                        : second_policy != unset.second_policy        ? "--moe-second-policy"
                        : aux_loss != unset.aux_loss                  ? "--moe-aux-loss"
                        : z_loss != unset.z_loss                      ? "--moe-z-loss"
                                                                      : nullptr;
    MT_CHECK_INPUT(!given, given ? given : "", " is an MoE flag, for --model gpt (the ", flag_name(cfg.model),
                   " model has no experts)");
  }
  MT_CHECK_INPUT(g.moe_every >= 0, "--moe-every must be >= 0, got ", g.moe_every);
  MT_CHECK_INPUT(g.experts >= 0, "--experts must be >= 1, got ", g.experts);
  MT_CHECK_INPUT(g.moe_every == 0 || g.experts >= 1 || !cfg.init.empty(), "--moe-every ", g.moe_every,
                 " needs --experts E");
  MT_CHECK_INPUT(g.experts == 0 || moe_model, "--experts ", g.experts, " needs --moe-every K (which blocks get experts)");
  MT_CHECK_INPUT(g.moe_top_k >= 0 && g.moe_top_k <= 2, "--moe-top-k must be 1 or 2, got ", g.moe_top_k);
  MT_CHECK_INPUT(g.experts == 0 || g.moe_top_k <= g.experts, "--moe-top-k ", g.moe_top_k, " is more than --experts ",
                 g.experts);
  MT_CHECK_INPUT(g.expert_hidden >= 0, "--expert-hidden must be >= 1 (or 0: 4 x n_embd), got ", g.expert_hidden);
  MT_CHECK_INPUT(std::isfinite(capacity_factor) && capacity_factor >= 0, "--capacity-factor must be >= 0 (0: ",
                 "dropless), got ", capacity_factor);
  MT_CHECK_INPUT(group_windows >= 1, "--moe-group-windows must be >= 1, got ", group_windows);
  MT_CHECK_INPUT(std::isfinite(aux_loss) && aux_loss >= 0, "--moe-aux-loss must be >= 0, got ", aux_loss);
  MT_CHECK_INPUT(std::isfinite(z_loss) && z_loss >= 0, "--moe-z-loss must be >= 0, got ", z_loss);
  MT_CHECK_INPUT(ep >= 1, "--ep must be >= 1, got ", ep);
  MT_CHECK_INPUT(ep == 1 || moe_model, "--ep ", ep, " needs an MoE model (--moe-every K --experts E)");
  MT_CHECK_INPUT(dp % ep == 0, "--ep ", ep, " does not divide the data-parallel degree ", dp,
                 ": experts are split over ep ranks of each data-parallel group");
  MT_CHECK_INPUT(g.experts == 0 || g.experts % ep == 0, "--experts ", g.experts, " is not divisible by --ep ", ep);
  if (g.moe_every > 0 || ep > 1) {
    // Routing groups are runs of whole windows inside one micro-batch, so capacity does not depend on the layout.
    const int per_rank = cfg.batch_size / dp, mb = cfg.micro_batch_size > 0 ? cfg.micro_batch_size : per_rank;
    MT_CHECK_INPUT(mb % group_windows == 0, "--moe-group-windows ", group_windows, " must divide the windows of a ",
                   "micro-batch (", mb, ": ", cfg.micro_batch_size > 0 ? "--micro-batch-size" : "--batch-size / dp",
                   "): a routing group may not span micro-batches or ranks");
  }
}

}  // namespace mt::train
