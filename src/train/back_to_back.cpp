#include "train/back_to_back.h"

#include "core/error.h"
#include "train/train_config.h"

namespace mt::train {

std::string back_to_back_note(const TrainConfig& cfg) {
  if (cfg.pp <= 1 || cfg.schedule != "zb-h2" || cfg.grad_clip <= 0) return "";
  return str("zb-h2: the first stage's update waits for the global gradient norm (--grad-clip ", cfg.grad_clip,
             "), so for the last stage's last W: a step costs at least (p-1)F + m(F+B+W) however the steps are "
             "joined (the synchronized step's bound, which zb-h2 reaches for m >= 2p-1); with --grad-clip 0 the "
             "steps run back to back at the zero-bubble paper's m(F+B+W) (docs/parallelism.md, \"Back to back "
             "and exact\")");
}

}  // namespace mt::train
