// set_replica_facts (train/replicas.h): which copy of a tp-replicated or tied tensor counts in the norm, is
// saved, and is summed over the tie group, per rank of the layout.
#include "train/replicas.h"

#include <gtest/gtest.h>

#include "nn/params.h"

namespace {

using mt::nn::CopyGroup;

mt::nn::ParamRegistry declared() {
  mt::nn::ParamRegistry r;
  r.add("whole", {4});                   // no shard axis: every tp rank holds it all
  r.add("split", {4, 2}, {0, 0, 2, 1});  // rows [0, 2) here
  r.add("tied", {8, 2}, {0, 4, 8, 1});   // split over tp and held by the first and last stage
  return r;
}

TEST(ReplicaFacts, TpRankZeroAndTheFirstStageHoldTheCountedCopies) {
  mt::nn::ParamRegistry a = declared();
  mt::train::set_replica_facts(a, 1, 2, {"tied"}, false);  // tp rank 1 of the last stage
  const mt::nn::Replicas w = a.get("whole").replicas, s = a.get("split").replicas, t = a.get("tied").replicas;
  EXPECT_TRUE(w.in(CopyGroup::tp) && !w.in(CopyGroup::tie) && !w.counted && !w.saved && !w.summed);
  EXPECT_TRUE(s.groups == 0 && s.counted && s.saved && !s.summed);
  EXPECT_TRUE(t.in(CopyGroup::tie) && !t.in(CopyGroup::tp) && !t.counted && !t.saved && t.summed);

  mt::nn::ParamRegistry b = declared();
  mt::train::set_replica_facts(b, 0, 2, {"tied"}, true);  // tp rank 0 of the first stage
  EXPECT_TRUE(b.get("whole").replicas.counted && b.get("whole").replicas.saved);
  EXPECT_TRUE(b.get("tied").replicas.counted && b.get("tied").replicas.saved && b.get("tied").replicas.summed);

  mt::nn::ParamRegistry c = declared();
  mt::train::set_replica_facts(c, 0, 1, {}, true);  // no tp, no pipeline: one copy of everything
  for (const mt::nn::Param& p : c.params()) EXPECT_TRUE(p.replicas.groups == 0 && p.replicas.counted) << p.name;
}

TEST(ReplicaFacts, CommonTensorsOfTwoRegistries) {
  mt::nn::ParamRegistry a = declared(), b;
  b.add("tied", {8, 2});
  b.add("other", {3});
  EXPECT_EQ(mt::train::common_tensors(a, b), (std::set<std::string>{"tied"}));
}

}  // namespace
