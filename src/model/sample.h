// Autoregressive sampling from a GPT: greedy (temperature 0) or temperature + top-k, with draws from the
// counter-based generator keyed by (seed, "sample", position) so a sample is reproducible.
// No KV cache: each new token reruns the forward pass over the (cropped) context, which is fine for the
// short generations the CLI makes.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/gpt.h"

namespace mt::model {

struct SampleOptions {
  int max_new_tokens = 64;
  float temperature = 1.0f;  // 0 = greedy
  int top_k = 0;             // 0 = whole vocabulary
  uint64_t seed = 1337;
};

// Returns the generated tokens (without the prompt). The context is the last n_positions tokens. With on_token,
// each token is handed to it as soon as it is drawn instead (streaming; the returned vector is then empty), so a
// long generation needs memory for its context only.
std::vector<int32_t> generate(Gpt& gpt, const std::vector<int32_t>& prompt, const SampleOptions& opt,
                              const std::function<void(int32_t)>& on_token = nullptr);

}  // namespace mt::model
