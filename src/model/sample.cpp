#include "model/sample.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "nn/activation_store.h"

namespace mt::model {

std::vector<int32_t> generate(Gpt& gpt, const std::vector<int32_t>& prompt, const SampleOptions& opt,
                              const std::function<void(int32_t)>& on_token) {
  const GptConfig& cfg = gpt.config();
  MT_CHECK_INPUT(!prompt.empty(), "the prompt is empty");
  const int V = cfg.vocab_size;
  std::vector<int32_t> ctx = prompt, out;
  std::vector<float> logits(V);
  std::vector<int> order(V);
  nn::ActivationStore store;
  CounterRng rng(opt.seed, "sample");
  for (int i = 0; i < opt.max_new_tokens; i++) {
    int T = std::min<int>((int)ctx.size(), cfg.n_positions);
    const int32_t* window = ctx.data() + ctx.size() - T;
    gpt.forward(store, 0, window, nullptr, 1, T, 0.0f);
    gpt.logits_last(store, 0, 1, T, logits.data());
    int next;
    if (opt.temperature <= 0.0f) {
      next = (int)(std::max_element(logits.begin(), logits.end()) - logits.begin());
    } else {
      std::iota(order.begin(), order.end(), 0);
      int k = opt.top_k > 0 ? std::min(opt.top_k, V) : V;
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int a, int b) { return logits[a] > logits[b]; });
      double mx = logits[order[0]], sum = 0;
      std::vector<double> p(k);
      for (int j = 0; j < k; j++) sum += p[j] = std::exp((logits[order[j]] - mx) / opt.temperature);
      double u = rng.uniform((uint64_t)i) * sum;
      next = order[k - 1];
      for (int j = 0; j < k; j++) {
        if ((u -= p[j]) < 0) {
          next = order[j];
          break;
        }
      }
    }
    ctx.push_back(next);
    if (on_token) {
      on_token(next);
    } else {
      out.push_back(next);
    }
    // Only the last n_positions tokens are read: drop the older ones now and then (amortized O(1) per token).
    if (ctx.size() >= 2 * (size_t)cfg.n_positions + 1024) ctx.erase(ctx.begin(), ctx.end() - cfg.n_positions);
  }
  return out;
}

}  // namespace mt::model
