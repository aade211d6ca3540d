// Training checkpoints: a directory per save,
//   DIR/step_00000100/model.safetensors      weights (Hugging Face names, model shape in __metadata__)
//   DIR/step_00000100/optimizer.safetensors  optimizer state per tensor ("adamw.m/<param name>", ...)
//   DIR/step_00000100/state.json             step to resume at, seed, data position, config
//   DIR/latest                               the name of the newest complete checkpoint
// A save writes into DIR/step_00000100.tmp.<pid>, fsyncs, renames the directory into place and only then
// rewrites `latest` (atomically), so a crash at any point leaves the previous checkpoint intact and
// `latest` pointing at a complete one. Older checkpoints beyond `keep` are removed after the switch, chosen
// by step number (not name), never `latest`'s target or a newer step; each is first renamed to
// step_N.tmp.prune.<pid> and then deleted, so a kill mid-prune leaves a temporary, not a half checkpoint.
// Leftovers of killed saves and prunes are removed by clean_checkpoint_dir at the next start.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/params.h"
#include "optim/optimizer.h"

namespace mt::checkpoint {

// Full flat buffers laid out as the registry says (ZeRO ranks gather theirs first): the parameters, and
// each optimizer state buffer by name ("adamw.m", ...). Tensors are stored whole and named per parameter,
// so a checkpoint resumes under any data-parallel degree or ZeRO stage.
using NamedFlat = std::vector<std::pair<std::string, const float*>>;
using NamedFlatOut = std::vector<std::pair<std::string, float*>>;
// Factored optimizer state (optim/state_store.h: any non-flat buffer, e.g. a row mean per tensor): one tensor of
// the optimizer file each, under its declared name and shape, beside the flat buffers' per-parameter tensors.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
};
struct NamedTensorOut {
  std::string name;
  std::vector<int64_t> shape;  // what the optimizer declared; the file's tensor must have it
  float* data = nullptr;
};

// Returns the path of the checkpoint written.
std::string save_checkpoint(const std::string& dir, int64_t step, const nn::ParamRegistry& params,
                            const float* flat_params, const NamedFlat& flat_states,
                            const std::map<std::string, std::string>& model_metadata, const nlohmann::json& state,
                            int keep, const std::vector<NamedTensor>& factored_states = {});

// Read-only check before a run writes into `dir`: it must not hold another run's checkpoints (step_N
// directories or `latest`), which pruning could mix with this run's (and delete). A fresh run calls it
// with resume empty; a resumed run whose checkpoint lies elsewhere passes its --resume. Throws InputError
// naming them and the ways out (--resume, another directory, --overwrite-checkpoints).
void check_fresh_checkpoint_dir(const std::string& dir, const std::string& resume = "");

// Run once at start by rank 0: removes step_N.tmp.PID / latest.tmp.PID / *.tmp.prune.PID entries whose
// process is gone, and step_N directories missing a file (a prune killed by an older meshtrain) other than
// `latest`'s target; with `overwrite`, every checkpoint and `latest` as well. Returns the names removed.
std::vector<std::string> clean_checkpoint_dir(const std::string& dir, bool overwrite);

// The directory name of step N's checkpoint ("step_00000012"); save_checkpoint returns DIR/step_name(N).
std::string step_name(int64_t step);

// Step N of a checkpoint directory name "step_00000012" (exactly "step_" and digits), else -1.
int64_t checkpoint_step(const std::string& name);

// Why the checkpoint directory `path` cannot be resumed from, or "" when it can: all three files present,
// state.json an object with a non-negative integer step equal to the N of a step_N directory name, both
// safetensors headers valid. Reads the headers only (cheap).
std::string checkpoint_problem(const std::string& path);

// The checkpoint to resume from: DIR itself when it holds a state.json (its problems are load_checkpoint's
// to report), else DIR/latest's target when that is complete, else the newest complete step_N in DIR, with
// `note` (when given) set to a sentence saying why latest was passed over and which step is used. Throws
// InputError when DIR holds no complete checkpoint, naming latest's problem and the step directories' ones.
std::string resolve_checkpoint(const std::string& dir, std::string* note = nullptr);

// Points DIR/latest at the checkpoint directory `name` (atomically).
void set_latest(const std::string& dir, const std::string& name);

// Loads weights and optimizer state into full flat buffers (shapes must match) and the factored state by name
// (each must be in the file with its declared shape), and returns state.json.
// A state.json whose step disagrees with its step_N directory name is an InputError naming both.
nlohmann::json load_checkpoint(const std::string& path, const nn::ParamRegistry& params, float* flat_params,
                               const NamedFlatOut& flat_states,
                               const std::vector<NamedTensorOut>& factored_states = {});

}  // namespace mt::checkpoint
