// The optimizer's state store (optim/state_store.h): buffers declared by name and shape, flat ones listed in
// declaration order for files, factored ones kept out of that list but counted in memory; AdamW and SGD keep
// their state there under the names checkpoints hold.
#include "optim/state_store.h"

#include <gtest/gtest.h>

#include "optim/optimizer.h"

namespace {

using mt::optim::StateStore;

TEST(StateStore, FlatAndFactoredBuffers) {
  StateStore s;
  const size_t m = s.declare_flat("m", 10);
  const size_t rows = s.declare("row_mean", {4});
  const size_t cols = s.declare("col_mean", {3, 2});
  const size_t v = s.declare_flat("v", 10);
  EXPECT_EQ(s.count(), 4u);
  EXPECT_EQ(s.flat(), (std::vector<size_t>{m, v}));
  EXPECT_EQ(s.size(cols), 6u);
  EXPECT_FALSE(s.at(rows).flat);
  EXPECT_EQ(s.at(cols).shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(s.bytes(), (10 + 4 + 6 + 10) * sizeof(float));
  float* before = s.data(m);
  s.declare_flat("later", 1000);
  EXPECT_EQ(s.data(m), before);  // declaring more moves nothing
  for (size_t k = 0; k < s.count(); k++)
    for (size_t i = 0; i < s.size(k); i++) ASSERT_EQ(s.data(k)[i], 0.0f);
}

TEST(StateStore, OptimizersDeclareTheirStateByName) {
  mt::optim::AdamW adam(5, {});
  ASSERT_EQ(adam.state().flat().size(), 2u);
  EXPECT_EQ(adam.state().at(0).name, "adamw.m");
  EXPECT_EQ(adam.state().at(1).name, "adamw.v");
  mt::optim::Sgd sgd(5, {});
  ASSERT_EQ(sgd.state().count(), 1u);
  EXPECT_EQ(sgd.state().at(0).name, "sgd.momentum");
  // One step writes the momentum through the store: buf = g (step 0).
  float p[5] = {0, 0, 0, 0, 0}, g[5] = {1, 2, 3, 4, 5};
  sgd.step(p, g, {{0, 0, 0, 5, false, 0}}, 0.5f, 0);
  EXPECT_EQ(sgd.state().data(0)[4], 5.0f);
  EXPECT_EQ(p[4], -2.5f);
}

}  // namespace
