// Checks of everything a run will write, done once before any work (so a bad --save fails in a second,
// not after the last step): each output path can be written (train: --metrics, --save, --summary, --trace;
// see core/fs.h check_output_path for what a path may be), --checkpoint-dir is a writable directory (or can be
// made) holding no other run's checkpoints unless resumed or --overwrite-checkpoints, and no output is one
// of the inputs (--metrics = --data would destroy the data) or another output. Read-only: every rank of an
// mpirun job may call it. Throws InputError naming both flags and paths.
#pragma once

#include "train/train_config.h"

namespace mt::train {

void check_outputs(const TrainConfig& cfg);

}  // namespace mt::train
