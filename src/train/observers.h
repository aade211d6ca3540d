// Run observers: small parts the step loops call after a step, each owning one concern. None changes the
// math; each is collective only where it says so.
//
//   Cadence        when to evaluate, checkpoint and stop after step s (pure)
//   RunLog         the metrics row (JSONL, lead) and the progress line (lead)
//   RowQueue       a step's row from its two parts (the loop's, the exchange's outcome), written in order
//   Evaluator      held-out loss after step s, summed over the groups that split it, into the step's row
//   Checkpointer   resume, checkpoints on the cadence, the final save, and the last good checkpoint when a
//                  step diverges (state.h: whole tensors through Consolidation)
//   write_trace    every rank's events merged into one Chrome trace by the lead
//   summary.h      memory per rank, the pipeline bubble, the closing JSON
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "nn/param_hooks.h"
#include "parallel/mesh/mesh.h"
#include "trace/chrome_trace.h"
#include "trace/metrics.h"
#include "train/consolidate.h"
#include "train/exchange_state.h"
#include "train/task.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace mt::train {

struct Cadence {
  int64_t steps = 0, stop_at = 0, eval_every = 0, save_every = 0;
  bool eval = false, checkpoints = false;  // the task has held-out data; --checkpoint-dir given
  static Cadence from(const TrainConfig& cfg, bool has_eval);
  bool stop_after(int64_t s) const { return stop_at > 0 && s + 1 == stop_at; }
  bool eval_after(int64_t s) const { return eval && eval_every > 0 && ((s + 1) % eval_every == 0 || s + 1 == steps); }
  bool save_after(int64_t s) const {
    return checkpoints && ((save_every > 0 && (s + 1) % save_every == 0) || stop_after(s) ||
                           s + 1 == steps);  // --checkpoint-dir alone: one checkpoint at the end
  }
  int64_t end() const { return stop_at > 0 ? std::min(stop_at, steps) : steps; }
  bool last_after(int64_t s) const { return stop_after(s) || s + 1 == steps; }  // the loop ends after s
};

class Checkpointer;

class RunLog {
 public:
  // Rows go to --metrics (appended on resume), the progress line to stderr; both on the lead only.
  RunLog(const TrainConfig& cfg, bool lead, int64_t start, const std::string& item_name);
  void message(const std::string& line) { progress_.message(line); }
  // Writes the row and redraws the progress line. A row that cannot be written (a full disk) stops the run
  // with a message naming step s and, when set, the checkpointer's last checkpoint.
  void step(const nlohmann::json& row, int64_t s, double loss, float lr, double items_per_s);
  void set_checkpointer(const Checkpointer* ckpt) { ckpt_ = ckpt; }
  void finish() { progress_.finish(); }
  const std::string& items_key() const { return items_key_; }  // "tokens_per_s" | "examples_per_s"

 private:
  trace::MetricsWriter metrics_;
  trace::Progress progress_;
  std::string items_key_;
  const Checkpointer* ckpt_ = nullptr;
};

// A step's row comes in two parts: the loop's (step, time, bytes, evaluation, the method's and the task's
// fields) when this rank's step is over, and the outcome (loss, grad_norm, lr) when the exchange knows it: at
// once for synchronous methods, with the step's version for a parameter-server worker (possibly steps
// later). Whole rows are written in step order (RunLog::step) and the last one's loss is the summary's.
class RowQueue {
 public:
  RowQueue(RunLog& log, TrainSummary& sum) : log_(log), sum_(sum) {}
  void local(int64_t s, const nlohmann::json& part) { merge(s, part); }
  void outcome(int64_t s, double loss, double norm, float lr) {
    merge(s, {{"loss", loss}, {"grad_norm", norm}, {"lr", lr}});
  }
  size_t pending() const { return rows_.size(); }  // rows still missing a part

 private:
  void merge(int64_t s, const nlohmann::json& part);
  RunLog& log_;
  TrainSummary& sum_;
  std::map<int64_t, nlohmann::json> rows_;
};

class Evaluator {
 public:
  // hooks: the parameter store's (ZeRO 3 gathers parameters through them, in a pipeline's stages too).
  Evaluator(TrainTask& task, const parallel::Mesh& mesh, int batches, nn::ParamHooks* hooks, RunLog& log)
      : task_(task), mesh_(mesh), batches_(batches), hooks_(hooks), log_(log) {}
  // Collective over dp (and pp): val_loss (and val_accuracy) of the parameters after step s into row.
  void operator()(int64_t s, nlohmann::json& row);

 private:
  TrainTask& task_;
  const parallel::Mesh& mesh_;
  int batches_;
  nn::ParamHooks* hooks_;
  RunLog& log_;
};

class Checkpointer {
 public:
  Checkpointer(const TrainConfig& cfg, Consolidation& state, const parallel::Mesh& mesh,
               std::map<std::string, std::string> metadata, int64_t items_per_step);
  // --resume: loads whole tensors into every rank's part; returns the step to start from. Every rank.
  int64_t resume();
  // Collective: gathers the whole state, the lead writes checkpoint next_step into --checkpoint-dir.
  void save(int64_t next_step);
  // Collective: --save (final weights, safetensors), when given.
  void save_final();
  // For a divergence at step s: repoints "latest" at the newest complete checkpoint from before s (lead)
  // and says which one it is, or that there is none.
  std::string diverged_advice(int64_t s);
  const std::vector<std::pair<int64_t, std::string>>& written() const { return written_; }
  // "the last checkpoint is DIR/step_N (step N): ..." or why there is none, for messages that stop a run.
  std::string last_checkpoint() const;
  // The exchange's per-rank state (exchange_state.h), saved and resumed with the rest; null: none. Set before
  // resume().
  void set_exchange_state(ExchangeState* e) { exchange_ = e; }

 private:
  // Collective over the world: every rank's exchange buffers, concatenated, at the lead (per world rank;
  // empty elsewhere), and each rank's element count.
  void gather_exchange(std::vector<std::vector<float>>& per_rank, std::vector<uint64_t>& sizes);
  // The flags that change what a step computes, and the inputs' content (core/fs.h file_fingerprint), as
  // state.json records them; resume() compares them with this run's.
  nlohmann::json run_identity() const;
  // Lead, on resume: a warning per flag or input that differs from the checkpoint's state.json.
  void warn_if_changed(const std::string& path, const nlohmann::json& st) const;
  const TrainConfig& cfg_;
  Consolidation& state_;
  const parallel::Mesh& mesh_;
  std::map<std::string, std::string> metadata_;
  int64_t items_per_step_;
  std::vector<std::pair<int64_t, std::string>> written_;  // (step, path), oldest first
  std::vector<float> whole_;
  nlohmann::json inputs_;  // lead: {"data_fingerprint": "BYTES:HASH", ...}, taken once at start
  ExchangeState* exchange_ = nullptr;
};

// Every rank writes its events next to `path`; the lead merges them after a barrier over the world.
void write_trace(const std::string& path, const trace::ChromeTrace& tracer, const parallel::Mesh& mesh);

}  // namespace mt::train
