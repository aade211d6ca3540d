// Checks of everything a run will write, done once before any work (so a bad --save fails in a second,
// not after the last step): each output path can be written (train: --metrics, --save, --summary, --trace;
// see core/fs.h check_output_path for what a path may be; a FIFO needs its reader now), --checkpoint-dir is
// a writable directory (or can be made; a dangling symlink on the way is refused) holding no other run's
// checkpoints unless it holds the one --resume continues or --overwrite-checkpoints is given, and no output
// is one of the inputs (--metrics = --data would destroy the data) or another output. Writes nothing (a
// FIFO output is held open, see check_output_path): every rank of an mpirun job may call it. Throws
// InputError naming both flags and paths.
#pragma once

#include "train/train_config.h"

namespace mt::train {

void check_outputs(const TrainConfig& cfg);

}  // namespace mt::train
