// union_factored (train/consolidate.h stage 3) on forked shm ranks: every member ends with every factored
// buffer some member holds, sorted by name, each as the lowest declaring rank has it (ranks give different
// values for a shared name, so the owner shows); members declaring one name with two shapes get an error
// naming both; with nothing declared anywhere nothing changes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "shm_ranks.h"
#include "train/consolidate.h"

namespace {

using mt::train::FactoredState;

TEST(UnionFactored, OneCopyOfEachFromTheLowestHolder) {
  auto res = mt::test::run_shm_ranks(3, [](mt::comm::Communicator& world) {
    const int r = world.rank();
    const float fr = (float)r;
    // "shared" on every rank (values r, r + 0.5); "one" on rank 1 only; "two" on ranks 1 and 2, 2 x 2.
    std::vector<FactoredState> s = {{"shared", {2}, {fr, fr + 0.5f}}};
    if (r == 1) s.push_back({"one", {3}, {10, 11, 12}});
    if (r >= 1) s.push_back({"two", {2, 2}, {20 + fr, 21, 22, 23}});
    mt::train::union_factored(&world, s);
    MT_REQUIRE(mt::Error, s.size() == 3, "rank ", r, " holds ", s.size(), " buffers");
    MT_REQUIRE(mt::Error, s[0].name == "one" && s[1].name == "shared" && s[2].name == "two", "order on rank ", r);
    MT_REQUIRE(mt::Error, s[0].shape == std::vector<int64_t>{3} && s[0].data == std::vector<float>({10, 11, 12}),
               "one on rank ", r);
    MT_REQUIRE(mt::Error, s[1].data == std::vector<float>({0, 0.5f}), "shared on rank ", r, ": ", s[1].data[0]);
    MT_REQUIRE(mt::Error, s[2].shape == (std::vector<int64_t>{2, 2}) && s[2].data[0] == 21.0f, "two on rank ", r, ": ",
               s[2].data[0]);
    std::vector<FactoredState> none;
    mt::train::union_factored(&world, none);
    MT_REQUIRE(mt::Error, none.empty(), "nothing declared, something gathered");
  });
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

TEST(UnionFactored, OneNameTwoShapesIsAnError) {
  auto res = mt::test::run_shm_ranks(2, [](mt::comm::Communicator& world) {
    std::vector<FactoredState> s = {{"row", {world.rank() == 0 ? 2 : 3}, std::vector<float>(2 + world.rank())}};
    std::string msg;
    try {
      mt::train::union_factored(&world, s);
    } catch (const mt::InputError& e) {
      msg = e.what();
    }
    MT_REQUIRE(mt::Error,
               msg.find("factored optimizer state row has shape [2] on rank 0 of group world but [3] on "
                        "rank 1") != std::string::npos,
               "rank ", world.rank(), ": '", msg, "'");
  });
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

}  // namespace
