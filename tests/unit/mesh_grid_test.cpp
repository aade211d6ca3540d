// MeshGrid: coordinates and group membership for every dp x tp x pp factorization of 1-16 ranks (and the
// parameter-server split), against membership worked out here by brute force over coordinates: a group is
// the set of ranks agreeing on the coordinates the group fixes, ordered by the coordinates it varies.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "parallel/mesh/grid.h"

using mt::parallel::MeshCoord;
using mt::parallel::MeshGrid;
using mt::parallel::MeshGroup;

namespace {

// The InputError message of fn(), or "(no error)".
template <class Fn>
std::string message(Fn fn) {
  try {
    fn();
  } catch (const mt::InputError& e) {
    return std::string(e.what());
  }
  return std::string("(no error)");
}

struct Expect {
  int d, t, j;
};

// The layout documented in grid.h, written out as a table instead of the formula.
std::vector<Expect> enumerate_ranks(int dp, int tp, int pp) {
  std::vector<Expect> ranks;
  for (int j = 0; j < pp; j++)
    for (int d = 0; d < dp; d++)
      for (int t = 0; t < tp; t++) ranks.push_back({d, t, j});
  return ranks;
}

// Calls fn(grid, ranks, world, dp, tp, pp, ep) for every dp x tp x pp layout of 1-16 ranks and every ep dividing
// dp; returns how many layouts it visited.
template <class Fn>
int for_each_ep_layout(Fn fn) {
  int layouts = 0;
  for (int world = 1; world <= 16; world++)
    for (int tp = 1; tp <= world; tp++)
      for (int pp = 1; pp <= world; pp++) {
        if (world % (tp * pp)) continue;
        const int dp = world / (tp * pp);
        for (int ep = 1; ep <= dp; ep++) {
          if (dp % ep) continue;
          fn(MeshGrid(world, 0, tp, pp, 0, ep), enumerate_ranks(dp, tp, pp), world, dp, tp, pp, ep);
          layouts++;
        }
      }
  return layouts;
}

// Brute force: ranks of the same group as `me`, sorted by the in-group order.
std::vector<int> brute_members(const std::vector<Expect>& r, MeshGroup g, int me, int pp) {
  std::vector<std::pair<int, int>> keyed;
  const Expect& m = r[me];
  for (int q = 0; q < (int)r.size(); q++) {
    const Expect& o = r[q];
    switch (g) {
      case MeshGroup::tp:
        if (o.d == m.d && o.j == m.j) keyed.push_back({o.t, q});
        break;
      case MeshGroup::dp:
        if (o.t == m.t && o.j == m.j) keyed.push_back({o.d, q});
        break;
      case MeshGroup::pp:
        if (o.d == m.d && o.t == m.t) keyed.push_back({o.j, q});
        break;
      case MeshGroup::replica:
        if (o.d == m.d) keyed.push_back({o.j * 1000 + o.t, q});
        break;
      case MeshGroup::tie:
        if ((m.j == 0 || m.j == pp - 1) && o.d == m.d && o.t == m.t && (o.j == 0 || o.j == pp - 1))
          keyed.push_back({o.j, q});
        break;
      case MeshGroup::side:
      case MeshGroup::ep:   // expert groups have their own brute force (ExpertGroups tests below)
      case MeshGroup::edp:
        break;
    }
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<int> out;
  for (auto& [k, q] : keyed) out.push_back(q);
  return out;
}

}  // namespace

TEST(MeshGrid, EveryFactorizationOf1To16Ranks) {
  int layouts = 0;
  for (int world = 1; world <= 16; world++) {
    for (int tp = 1; tp <= world; tp++) {
      for (int pp = 1; pp <= world; pp++) {
        if (world % (tp * pp)) continue;
        const int dp = world / (tp * pp);
        layouts++;
        // dp = 0 (inferred) and the explicit degree give the same grid.
        const MeshGrid g(world, 0, tp, pp);
        const MeshGrid explicit_dp(world, dp, tp, pp);
        ASSERT_EQ(g.dp(), dp);
        ASSERT_EQ(explicit_dp.dp(), dp);
        const std::vector<Expect> ranks = enumerate_ranks(dp, tp, pp);
        ASSERT_EQ((int)ranks.size(), world);
        std::set<std::tuple<int, int, int>> seen;
        for (int r = 0; r < world; r++) {
          const MeshCoord c = g.coord(r);
          ASSERT_FALSE(c.server);
          EXPECT_EQ(c.dp, ranks[r].d) << world << " " << tp << " " << pp << " rank " << r;
          EXPECT_EQ(c.tp, ranks[r].t);
          EXPECT_EQ(c.pp, ranks[r].j);
          EXPECT_EQ(g.world_rank(c), r);
          seen.insert({c.dp, c.tp, c.pp});
          for (MeshGroup grp : {MeshGroup::tp, MeshGroup::dp, MeshGroup::pp, MeshGroup::replica, MeshGroup::tie}) {
            const std::vector<int> want = brute_members(ranks, grp, r, pp);
            EXPECT_EQ(g.members(grp, r), want)
                << "group " << mt::parallel::group_name(grp) << " of rank " << r << " in " << dp << "x" << tp << "x"
                << pp;
            // The rank's own place in its group is its key's position: the coordinate the group varies.
            if (!want.empty()) {
              const int pos = (int)(std::find(want.begin(), want.end(), r) - want.begin());
              const int expect_pos = grp == MeshGroup::tp        ? c.tp
                                     : grp == MeshGroup::dp      ? c.dp
                                     : grp == MeshGroup::pp      ? c.pp
                                     : grp == MeshGroup::replica ? c.pp * tp + c.tp
                                                                 : (c.pp == 0 ? 0 : 1);
              EXPECT_EQ(pos, expect_pos);
            }
          }
          // Sizes: tp, dp, pp groups have the dimension's size; a replica holds tp * pp ranks.
          EXPECT_EQ((int)g.members(MeshGroup::tp, r).size(), tp);
          EXPECT_EQ((int)g.members(MeshGroup::dp, r).size(), dp);
          EXPECT_EQ((int)g.members(MeshGroup::pp, r).size(), pp);
          EXPECT_EQ((int)g.members(MeshGroup::replica, r).size(), tp * pp);
          const bool end_stage = c.pp == 0 || c.pp == pp - 1;
          EXPECT_EQ((int)g.members(MeshGroup::tie, r).size(), end_stage ? (pp == 1 ? 1 : 2) : 0);
        }
        EXPECT_EQ((int)seen.size(), world) << "coordinates are not one-to-one";
        EXPECT_EQ(g.builds(MeshGroup::tp), tp > 1);
        EXPECT_EQ(g.builds(MeshGroup::pp), pp > 1);
        EXPECT_EQ(g.builds(MeshGroup::dp), tp * pp > 1);
        EXPECT_FALSE(g.builds(MeshGroup::side));
      }
    }
  }
  // Count of (tp, pp) with tp * pp | W, summed over W = 1..16 (ordered factor pairs of divisors).
  int expect = 0;
  for (int w = 1; w <= 16; w++)
    for (int a = 1; a <= w; a++)
      if (w % a == 0)
        for (int b = 1; b <= w / a; b++)
          if ((w / a) % b == 0) expect++;
  EXPECT_EQ(layouts, expect);
}

TEST(MeshGrid, ParameterServersAreTheLastRanks) {
  for (int world = 2; world <= 16; world++) {
    for (int servers = 1; servers < world; servers++) {
      const MeshGrid g(world, 0, 1, 1, servers);
      EXPECT_EQ(g.workers(), world - servers);
      EXPECT_EQ(g.dp(), world - servers);
      EXPECT_TRUE(g.builds(MeshGroup::side));
      std::vector<int> workers, server_ranks;
      for (int r = 0; r < world; r++) (r < world - servers ? workers : server_ranks).push_back(r);
      for (int r = 0; r < world; r++) {
        EXPECT_EQ(g.is_server(r), r >= world - servers);
        EXPECT_EQ(g.coord(r).server, r >= world - servers);
        EXPECT_EQ(g.members(MeshGroup::side, r), r < world - servers ? workers : server_ranks);
        if (r < world - servers) { EXPECT_EQ(g.coord(r).dp, r); }
        // Servers are in no model group.
        if (r >= world - servers) { EXPECT_TRUE(g.members(MeshGroup::tp, r).empty()); }
      }
    }
  }
}

TEST(MeshGrid, RejectsDegreesThatDoNotTileTheRanks) {
  EXPECT_NE(message([] { MeshGrid(6, 0, 4, 1); }).find("not divisible by --tp 4 x --pp 1"), std::string::npos);
  EXPECT_NE(message([] { MeshGrid(8, 3, 2, 1); }).find("--dp 3 x --tp 2 x --pp 1 must equal the number of ranks"),
            std::string::npos);
  EXPECT_NE(message([] { MeshGrid(5, 3, 1, 1, 1); }).find("workers (ranks minus --servers): 4"), std::string::npos);
  EXPECT_NE(message([] { MeshGrid(2, 0, 1, 1, 2); }).find("at least one worker"), std::string::npos);
  EXPECT_NE(message([] { MeshGrid(4, 0, 0, 1); }).find("--tp 0"), std::string::npos);
  EXPECT_EQ(MeshGrid(12, 0, 2, 3).describe(), "data-parallel 2 x tensor-parallel 2 x pipeline 3");
  EXPECT_EQ(MeshGrid(8, 1, 2, 4).describe(" (sequence-parallel)", " (gpipe)"),
            "data-parallel 1 x tensor-parallel 2 (sequence-parallel) x pipeline 4 (gpipe)");
}

TEST(MeshGrid, ExpertGroupsCutEachDataParallelGroupIntoRunsOfEp) {
  // For every layout of 1-16 ranks and every ep dividing dp: the ep group of rank (d, t, j) is the ranks
  // (d', t, j) with d' / ep = d / ep, ordered by d', and the rank's place in it is d % ep.
  int checked = 0;
  for_each_ep_layout([&](const MeshGrid& g, const std::vector<Expect>& ranks, int world, int dp, int tp, int pp,
                         int ep) {
    EXPECT_EQ(g.builds(MeshGroup::ep), ep > 1);
    for (int r = 0; r < world; r++) {
      std::vector<int> want;
      for (int q = 0; q < world; q++)
        if (ranks[q].t == ranks[r].t && ranks[q].j == ranks[r].j && ranks[q].d / ep == ranks[r].d / ep)
          want.push_back(q);  // ascending q is ascending d' within fixed (t, j)
      ASSERT_EQ(g.members(MeshGroup::ep, r), want) << dp << "x" << tp << "x" << pp << " ep " << ep << " rank " << r;
      EXPECT_EQ(want[ranks[r].d % ep], r);
      checked++;
    }
  });
  EXPECT_GT(checked, 200);
  EXPECT_NE(message([] { MeshGrid(6, 0, 1, 1, 0, 4); }).find("--ep 4 does not divide the data-parallel degree 6"),
            std::string::npos);
  EXPECT_EQ(MeshGrid(8, 0, 2, 1, 0, 2).describe(), "data-parallel 4 (expert-parallel 2) x tensor-parallel 2 x pipeline 1");
}

TEST(MeshGrid, ExpertReplicaGroupsJoinTheSamePlaceOfEveryEpRun) {
  // The edp group of rank (d, t, j): the ranks (d', t, j) with d' % ep = d % ep (they hold the same experts),
  // ordered by d', the rank's place d / ep; built only when it has more than one rank. Its members and the
  // ep group's meet only in the rank itself, and together they tile the dp group.
  int checked = 0;
  for_each_ep_layout([&](const MeshGrid& g, const std::vector<Expect>& ranks, int world, int dp, int tp, int pp,
                         int ep) {
    EXPECT_EQ(g.builds(MeshGroup::edp), ep > 1 && dp > ep) << dp << " " << ep;
    for (int r = 0; r < world; r++) {
      std::vector<int> want;
      for (int q = 0; q < world; q++)
        if (ranks[q].t == ranks[r].t && ranks[q].j == ranks[r].j && ranks[q].d % ep == ranks[r].d % ep)
          want.push_back(q);
      ASSERT_EQ(g.members(MeshGroup::edp, r), want) << dp << "x" << tp << "x" << pp << " ep " << ep << " rank " << r;
      EXPECT_EQ((int)want.size(), dp / ep);
      EXPECT_EQ(want[ranks[r].d / ep], r);
      const std::vector<int> run = g.members(MeshGroup::ep, r);
      int common = 0;
      for (int q : run) common += (int)std::count(want.begin(), want.end(), q);
      EXPECT_EQ(common, 1);
      checked++;
    }
  });
  EXPECT_GT(checked, 200);
  EXPECT_STREQ(mt::parallel::group_name(MeshGroup::edp), "edp");
}

// A bidirectional pipeline (chimera) holds stage s on pipeline ranks s and pp - 1 - s: the tie group then pairs
// every rank with its mirror (rank 0's pair is still the first and the last stage), within its (dp, tp) place.
TEST(MeshGrid, MirroredTieGroupPairsEachPipelineRankWithItsMirror) {
  for (int pp : {2, 4, 6}) {
    MeshGrid g(2 * 2 * pp, 2, 2, pp);
    const MeshGrid plain = g;
    g.set_mirrored(true);
    EXPECT_TRUE(g.mirrored());
    for (int r = 0; r < g.world(); r++) {
      const MeshCoord c = g.coord(r);
      const int a = std::min(c.pp, pp - 1 - c.pp), b = std::max(c.pp, pp - 1 - c.pp);
      const std::vector<int> want{g.world_rank({c.dp, c.tp, a}), g.world_rank({c.dp, c.tp, b})};
      EXPECT_EQ(g.members(MeshGroup::tie, r), want) << "pp " << pp << " rank " << r;
      EXPECT_EQ(g.key(MeshGroup::tie, r).key, c.pp);
      // The ends' pair is the plain tie group.
      if (c.pp == 0 || c.pp == pp - 1) { EXPECT_EQ(plain.members(MeshGroup::tie, r), want) << "pp " << pp; }
    }
  }
}
