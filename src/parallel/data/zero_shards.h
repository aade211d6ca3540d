// Where a ZeRO rank's shard lives in the flat buffer: rank r of N owns comm::shard_of(count, N, r) of each
// bucket (a contiguous flat range), and keeps those slices packed in bucket order. Pure arithmetic, shared
// by DataParallel (load, consolidation) and the consolidation tests.
//
//   flat   | bucket 0: r0 r1 .. rN-1 | bucket 1: r0 r1 .. rN-1 | ...
//   shard r  = bucket 0's slice r, bucket 1's slice r, ...     (shard_size(buckets, N, r) floats)
#pragma once

#include <cstddef>
#include <vector>

namespace mt::parallel {

struct FlatRange {
  size_t begin = 0, count = 0;
};

size_t shard_size(const std::vector<FlatRange>& buckets, int n, int r);
// full: the flat buffer; shard: shard_size floats. Copy r's slices out of / into their places.
void take_shard(const std::vector<FlatRange>& buckets, int n, int r, const float* full, float* shard);
void place_shard(const std::vector<FlatRange>& buckets, int n, int r, const float* shard, float* full);

}  // namespace mt::parallel
