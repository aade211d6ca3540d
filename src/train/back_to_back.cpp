#include "train/back_to_back.h"

#include "core/error.h"
#include "train/train_config.h"

namespace mt::train {

std::string back_to_back_note(const TrainConfig& cfg) {
  if (cfg.pp <= 1 || cfg.schedule != "zb-h2") return "";
  const std::string norm = cfg.grad_clip > 0 ? str("the global gradient norm (--grad-clip ", cfg.grad_clip, ") and ")
                                             : std::string();
  return str("zb-h2: the first stage's update waits for ", norm,
             "the tied wte's gradient from the last stage, so a step costs at least (p-1)F + m(F+B+W) however the "
             "steps are joined (the synchronized step's bound, which zb-h2 reaches for m >= 2p-1); the zero-bubble paper's "
             "back-to-back m(F+B+W) needs updates that wait for no other stage (docs/parallelism.md, \"Back to back "
             "and exact\")");
}

}  // namespace mt::train
