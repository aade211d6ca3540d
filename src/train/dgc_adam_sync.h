// DGC with AdamW as a gradient exchange (`--compress topk:R --dgc --freeze-step K`, the rule:
// parallel/compress/dgc_adam.h and optim/dgc_adam.h): exact data parallelism for steps < K (the whole gradient
// all-reduced once the backward is over; the optimizer is AdamW then, bit-equal to --optimizer adamw), then no
// gradient exchange: the update first runs DGC on each rank's own momentum of its share, preconditioned by
// the frozen variance, exchanges the top-k of the accumulated update (one all_gather) and the optimizer applies
// their sum. After K the step's norm is this rank's share's (no communication), so --grad-clip clips each
// rank's share, as 1-bit Adam does. ZeRO 0, --pp 1, --tp 1, dense models (train_config.cpp's kRefused).
#pragma once

#include <memory>

#include "train/grad_sync.h"

namespace mt::train {

std::unique_ptr<GradSync> make_dgc_adam_sync(const SyncOptions& o, const parallel::Mesh& mesh,
                                             parallel::DataParallel& store, nn::ParamRegistry& params,
                                             trace::ChromeTrace* tracer);

}  // namespace mt::train
