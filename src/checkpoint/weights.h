// Model weights <-> safetensors files in Hugging Face naming. Loading accepts a leading "transformer."
// prefix and ignores known non-parameter buffers (GPT-2's h.{i}.attn.bias / attn.masked_bias causal masks);
// any other unknown tensor, a missing tensor or a wrong shape is an InputError naming file and tensor.
#pragma once

#include <map>
#include <string>

#include "checkpoint/safetensors.h"
#include "model/gpt.h"
#include "nn/params.h"

namespace mt::checkpoint {

// The model shape for `file`: each field from the flag (non-zero in `flags`), else the file's
// __metadata__, else (all but n_head) from the tensor shapes. A flag that disagrees with the metadata, or a
// tensor shape that disagrees with the result, is an InputError naming both values; n_head found nowhere is
// an InputError telling the user to pass --n-head.
model::GptConfig gpt_config_from_file(const SafetensorsReader& file, const model::GptConfig& flags);

// Checks that `file` holds every parameter of `params` with its full shape and nothing unexpected (the
// known mask buffers aside); throws InputError naming file and tensor.
void check_tensors(const SafetensorsReader& file, const nn::ParamRegistry& params);
// Copies one parameter from `file` into p.data (a shard reads its slice). check_tensors first.
void load_param(const SafetensorsReader& file, nn::Param& p);
// check_tensors, then load_param for each.
void load_params(const SafetensorsReader& file, nn::ParamRegistry& params);

// Writes every parameter (float32, full shapes) with `metadata`, atomically. `flat` is the full flat
// parameter buffer laid out as the registry says (default: the registry's own).
void save_params(const std::string& path, const nn::ParamRegistry& params,
                 const std::map<std::string, std::string>& metadata, const float* flat = nullptr);

}  // namespace mt::checkpoint
