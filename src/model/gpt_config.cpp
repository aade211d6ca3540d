// GptConfig's own functions (model/gpt.h): the shape checks, parameter and FLOP counts and the file
// metadata. Apart from the model itself, so that readers of model files (checkpoint/weights.h) need only this.
#include <map>
#include <string>

#include "core/error.h"
#include "model/gpt.h"

namespace mt::model {

void GptConfig::validate() const {
  MT_CHECK_INPUT(n_layer > 0, "n_layer must be positive, got ", n_layer);
  MT_CHECK_INPUT(n_head > 0, "n_head must be positive, got ", n_head);
  MT_CHECK_INPUT(n_embd > 0, "n_embd must be positive, got ", n_embd);
  MT_CHECK_INPUT(vocab_size > 0 && vocab_size <= 65536,
                 "vocab_size must be in [1, 65536] (tokens are uint16), got ", vocab_size);
  MT_CHECK_INPUT(n_positions > 0, "n_positions must be positive, got ", n_positions);
  MT_CHECK_INPUT(n_embd % n_head == 0, "n_embd (", n_embd, ") is not divisible by n_head (", n_head, ")");
  MT_CHECK_INPUT(moe_every >= 0, "--moe-every must be >= 0, got ", moe_every);
  if (moe_every > 0) {
    MT_CHECK_INPUT(experts >= 1, "--moe-every ", moe_every, " needs --experts >= 1, got ", experts);
    MT_CHECK_INPUT(moe_top_k == 1 || moe_top_k == 2, "--moe-top-k must be 1 or 2, got ", moe_top_k);
    MT_CHECK_INPUT(moe_top_k <= experts, "--moe-top-k ", moe_top_k, " is more than --experts ", experts);
    MT_CHECK_INPUT(expert_hidden >= 0, "--expert-hidden must be >= 0 (0: 4 x n_embd), got ", expert_hidden);
    MT_CHECK_INPUT(moe_every <= n_layer, "--moe-every ", moe_every, " is more than n_layer ", n_layer,
                   ": no block would have experts");
  }
}

namespace {
// Parameters of the model when each MoE block counts `experts_counted` experts (all, or the active k).
int64_t count_params(const GptConfig& g, int experts_counted) {
  const int64_t C = g.n_embd, Hx = g.moe_hidden();
  const int64_t attn = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C;
  const int64_t dense_mlp = (C * 4 * C + 4 * C) + (4 * C * C + C);
  const int64_t expert = (C * Hx + Hx) + (Hx * C + C);
  int64_t total = (int64_t)g.vocab_size * C + (int64_t)g.n_positions * C + 2 * C;
  for (int l = 0; l < g.n_layer; l++)
    total += attn + (g.is_moe(l) ? C * g.experts + experts_counted * expert : dense_mlp);
  return total;
}
}  // namespace

int64_t GptConfig::num_params() const { return count_params(*this, experts); }
int64_t GptConfig::active_params() const { return count_params(*this, moe_top_k); }

double GptConfig::flops_per_token(int T) const {
  return 6.0 * (double)active_params() + 12.0 * n_layer * (double)T * n_embd;
}

std::map<std::string, std::string> GptConfig::to_metadata() const {
  std::map<std::string, std::string> m = {{"n_layer", std::to_string(n_layer)},
                                          {"n_head", std::to_string(n_head)},
                                          {"n_embd", std::to_string(n_embd)},
                                          {"vocab_size", std::to_string(vocab_size)},
                                          {"n_positions", std::to_string(n_positions)}};
  if (moe_every > 0) {
    m["moe_every"] = std::to_string(moe_every);
    m["experts"] = std::to_string(experts);
    m["moe_top_k"] = std::to_string(moe_top_k);
    m["expert_hidden"] = std::to_string(moe_hidden());
  }
  return m;
}

}  // namespace mt::model
