#include "parallel/data/zero_shards.h"

#include <cstring>

#include "comm/types.h"

namespace mt::parallel {

size_t shard_size(const std::vector<FlatRange>& buckets, int n, int r) {
  size_t total = 0;
  for (const FlatRange& b : buckets) total += comm::shard_of(b.count, n, r).count;
  return total;
}

void take_shard(const std::vector<FlatRange>& buckets, int n, int r, const float* full, float* shard) {
  for (const FlatRange& b : buckets) {
    const comm::Shard s = comm::shard_of(b.count, n, r);
    std::memcpy(shard, full + b.begin + s.offset, sizeof(float) * s.count);
    shard += s.count;
  }
}

void place_shard(const std::vector<FlatRange>& buckets, int n, int r, const float* shard, float* full) {
  for (const FlatRange& b : buckets) {
    const comm::Shard s = comm::shard_of(b.count, n, r);
    std::memcpy(full + b.begin + s.offset, shard, sizeof(float) * s.count);
    shard += s.count;
  }
}

}  // namespace mt::parallel
