// Elastic restarts on one host, torchelastic's rule (--max-restarts N, --min-nproc K): when a job launched by
// the shm launcher fails, the launcher starts it again from the last complete checkpoint in --checkpoint-dir
// (or from the start, when none was written yet), at most N times. A restart uses the same number of ranks,
// unless ranks' places were lost (on one host that happens only through an injected "lose" fault,
// flight_recorder.h: a killed or stalled rank is simply started again); then it continues with the most ranks
// n' <= nproc - lost, n' >= K, that the flags accept, all of them data-parallel beyond --tp x --pp (checkpoints
// hold whole tensors, so any layout resumes them: docs/formats.md). Interruptions (Ctrl-C, SIGTERM) and bad
// input are never restarted. The restarted run's metrics rows continue the file as one run (rows from the
// resumed step on are rewritten), so an unbroken run and a broken-and-restarted one read the same.
//
// Injected faults (LaunchOptions::fault) apply to the first attempt only. Each failed attempt with --metrics PATH
// writes the flight recorder's rings to flight_file(cfg) = PATH.flight.json; when a restart then finishes the
// job, run_elastic removes that file (it described a failure the job recovered from; the restart's message on
// stderr says so). A job that ends failed keeps it.
#pragma once

#include <functional>
#include <string>

#include "comm/launch.h"
#include "train/train_config.h"

namespace mt::train {

struct RestartPlan {
  bool restart = false;
  TrainConfig next;     // the next attempt's flags (nproc, dp, resume, overwrite_checkpoints changed)
  std::string message;  // why not, or what the restart does ("restart 1 of 2: from ... with 2 ranks ...")
};

// Where a failed attempt writes the flight recorder's rings ("" without --metrics).
std::string flight_file(const TrainConfig& cfg);

// After attempt number `restarts_done` (0: the first run) of `failed` ended with `r`: the next attempt.
RestartPlan plan_restart(const TrainConfig& failed, const comm::LaunchResult& r, int restarts_done);

// Runs attempt(cfg, first), then restarts per plan_restart while it fails; prints each restart's message
// ("meshtrain: ...") to stderr. Returns the last attempt's exit code.
int run_elastic(const TrainConfig& cfg,
                const std::function<comm::LaunchResult(const TrainConfig&, bool first)>& attempt);

}  // namespace mt::train
