#include "data/batch.h"

namespace mt::data {

void gpt_batch(const TokenShard& shard, int64_t step, int B, int T, int j0, int nb, int32_t* inputs,
               int32_t* targets) {
  const int64_t n = shard.size();
  const uint16_t* tok = shard.data();
  for (int j = 0; j < nb; j++) {
    int64_t o = ((step * B + j0 + j) * (int64_t)T) % n;
    for (int t = 0; t < T; t++) {
      inputs[(int64_t)j * T + t] = tok[(o + t) % n];
      targets[(int64_t)j * T + t] = tok[(o + t + 1) % n];
    }
  }
}

int64_t gpt_batch_offset(const TokenShard& shard, int64_t step, int B, int T) {
  return (step * B * (int64_t)T) % shard.size();
}

}  // namespace mt::data
