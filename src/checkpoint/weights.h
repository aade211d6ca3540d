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

// Copies every parameter of `params` from `file` (full tensors; shards read their slice).
void load_params(const SafetensorsReader& file, nn::ParamRegistry& params);

// Writes every parameter (float32, full shapes) with `metadata`, atomically.
void save_params(const std::string& path, const nn::ParamRegistry& params,
                 const std::map<std::string, std::string>& metadata);

}  // namespace mt::checkpoint
