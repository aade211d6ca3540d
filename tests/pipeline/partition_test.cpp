// Stage splitting (parallel/pipeline/partition.h) against an exhaustive search, --stage-layers checks, the
// simulator's per-stage costs, and the activation store's measured peak that the pipeline summary reports.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "nn/activation_store.h"
#include "parallel/pipeline/partition.h"
#include "plan/bubble.h"
#include "plan/simulator.h"

namespace {

using mt::pipeline::balance_layers;

// The smallest possible maximum stage cost over every contiguous split (enumerated).
double brute_force_best(const std::vector<double>& c, int S, double first, double last) {
  const int L = (int)c.size();
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> counts(S, 0);
  std::function<void(int, int)> rec = [&](int s, int left) {
    if (s == S - 1) {
      counts[s] = left;
      double worst = 0;
      int l = 0;
      for (int k = 0; k < S; k++) {
        double v = (k == 0 ? first : 0) + (k == S - 1 ? last : 0);
        for (int i = 0; i < counts[k]; i++) v += c[l++];
        worst = std::max(worst, v);
      }
      best = std::min(best, worst);
      return;
    }
    for (int n = 0; n <= left; n++) {
      counts[s] = n;
      rec(s + 1, left - n);
    }
  };
  rec(0, L);
  (void)L;
  return best;
}

double max_stage(const std::vector<double>& c, const std::vector<int>& counts, double first, double last) {
  double worst = 0;
  int l = 0;
  for (size_t s = 0; s < counts.size(); s++) {
    double v = (s == 0 ? first : 0) + (s + 1 == counts.size() ? last : 0);
    for (int i = 0; i < counts[s]; i++) v += c[l++];
    worst = std::max(worst, v);
  }
  return worst;
}

TEST(Partition, OptimalAgainstExhaustiveSearch) {
  unsigned seed = 7;
  auto rnd = [&]() {
    seed = seed * 1103515245u + 12345u;
    return 0.5 + (seed >> 16) % 100 / 50.0;
  };
  for (int L = 0; L <= 8; L++) {
    for (int S = 1; S <= 5; S++) {
      std::vector<double> c(L);
      for (double& x : c) x = rnd();
      const double first = rnd() - 0.5, last = 2 * rnd();
      std::vector<int> counts = balance_layers(c, S, first, last);
      ASSERT_EQ((int)counts.size(), S);
      EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), 0), L);
      EXPECT_NEAR(max_stage(c, counts, first, last), brute_force_best(c, S, first, last), 1e-9)
          << "L=" << L << " S=" << S;
    }
  }
}

TEST(Partition, EqualLayersSplitEvenlyAndTheHeadMovesLayersForward) {
  EXPECT_EQ(balance_layers(std::vector<double>(8, 1.0), 4, 0, 0), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(balance_layers(std::vector<double>(6, 1.0), 4, 0, 0), (std::vector<int>{2, 2, 1, 1}));
  EXPECT_EQ(balance_layers(std::vector<double>(2, 1.0), 3, 0, 0), (std::vector<int>{1, 1, 0}));
  // A last stage carrying 1.5 layers' worth of logits takes fewer blocks: 6 layers on 2 stages -> 4 + 2.
  EXPECT_EQ(balance_layers(std::vector<double>(6, 1.0), 2, 0, 1.5), (std::vector<int>{4, 2}));
}

TEST(Partition, StageLayersChecks) {
  EXPECT_NO_THROW(mt::pipeline::check_stage_layers({2, 0, 2}, 3, 4));
  EXPECT_THROW(mt::pipeline::check_stage_layers({2, 2}, 3, 4), mt::InputError);
  EXPECT_THROW(mt::pipeline::check_stage_layers({2, 1, 2}, 3, 4), mt::InputError);
  EXPECT_THROW(mt::pipeline::check_stage_layers({5, -1}, 2, 4), mt::InputError);
  EXPECT_EQ(mt::pipeline::describe_split({2, 0, 1, 3}), "[0-1] [] [2] [3-5]");
}

TEST(SimulatorRankCosts, EqualPerRankCostsGiveTheUniformModel) {
  for (const char* sched : {"gpipe", "1f1b"}) {
    mt::plan::CostModel uniform{1.0, 2.0, 0.0}, per_rank;
    per_rank.stage_forward = {1, 1, 1, 1};
    per_rank.stage_backward = {2, 2, 2, 2};
    auto a = mt::plan::simulate({sched, 4, 8, 1}, uniform), b = mt::plan::simulate({sched, 4, 8, 1}, per_rank);
    EXPECT_DOUBLE_EQ(a.makespan, b.makespan) << sched;
    EXPECT_DOUBLE_EQ(a.bubble_fraction, b.bubble_fraction) << sched;
  }
}

TEST(SimulatorRankCosts, ASlowRankSetsThePace) {
  // gpipe, p = 2, m = 4, rank 1 twice as slow (forward 2, backward 4), rank 0 forward 1, backward 2:
  // rank 1's forwards run back to back from t = 1 to 9, its backwards from 9 to 25; rank 0's last backward
  // waits for rank 1's last (ends at 25) and runs 25..27. Busy = 12 + 24 = 36 of 2 x 27.
  mt::plan::CostModel c;
  c.stage_forward = {1, 2};
  c.stage_backward = {2, 4};
  auto r = mt::plan::simulate({"gpipe", 2, 4, 1}, c);
  EXPECT_DOUBLE_EQ(r.makespan, 27);
  EXPECT_DOUBLE_EQ(r.busy, 36);
  EXPECT_DOUBLE_EQ(r.bubble_fraction, 1 - 36.0 / 54.0);
  mt::plan::CostModel bad;
  bad.stage_forward = {1, 2, 3};
  bad.stage_backward = {1, 2, 3};
  EXPECT_THROW(mt::plan::simulate({"gpipe", 2, 4, 1}, bad), mt::InputError);
}

TEST(SimulatorRankCosts, PerStageCostsOfInterleavedChunks) {
  // Equal stage costs reproduce the uniform model (F = 1 per rank, so 1/V per chunk); a heavy last stage
  // (chunk 1 of rank 1, say the logits) puts its extra time on rank 1 only.
  mt::plan::CostModel even;
  even.stage_forward = {0.5, 0.5, 0.5, 0.5};
  even.stage_backward = {1, 1, 1, 1};
  auto u = mt::plan::simulate({"interleaved", 2, 4, 2}, mt::plan::CostModel{1.0, 2.0, 0.0});
  auto e = mt::plan::simulate({"interleaved", 2, 4, 2}, even);
  EXPECT_DOUBLE_EQ(u.makespan, e.makespan);
  mt::plan::CostModel heavy = even;
  heavy.stage_forward[3] = 1.5;
  heavy.stage_backward[3] = 3;
  auto h = mt::plan::simulate({"interleaved", 2, 4, 2}, heavy);
  // Stage 3 is chunk 1 of rank 1: all 4 x (1 + 2) extra time lands there, none on rank 0.
  EXPECT_DOUBLE_EQ(h.busy_per_rank[1], e.busy_per_rank[1] + 4 * (1.0 + 2.0));
  EXPECT_DOUBLE_EQ(h.busy_per_rank[0], e.busy_per_rank[0]);
  EXPECT_GT(h.makespan, e.makespan);
}

TEST(ActivationStorePeak, CountsMicroBatchesInFlight) {
  mt::nn::ActivationStore st;
  const size_t n = 1000, bytes = n * sizeof(float);
  for (int mb = 0; mb < 3; mb++) st.get(mb, "a", n);  // three micro-batches live at once
  EXPECT_EQ(st.peak_live_bytes(), 3 * bytes);
  st.release(0);
  st.release(1);
  EXPECT_EQ(st.live_bytes(), bytes);
  st.get(3, "a", n);  // reuses a freed buffer: live 2, peak stays 3
  EXPECT_EQ(st.live_bytes(), 2 * bytes);
  EXPECT_EQ(st.peak_live_bytes(), 3 * bytes);
  st.get(3, "a", 2 * n);  // resized in place: the old size no longer counts
  EXPECT_EQ(st.live_bytes(), 3 * bytes);
  st.get(4, "b", n);
  st.get(5, "b", n);
  EXPECT_EQ(st.peak_live_bytes(), 5 * bytes);
}

}  // namespace

namespace {

TEST(BubbleReport, MeasuredAndSimulatedFromRankStats) {
  // Two ranks, gpipe, m = 2, two timed lists. Rank 0: forward 2 ms and backward 4 ms per micro-batch (8 and 16
  // over the lists), span 30 ms; rank 1: forward 1, backward 2 (4 and 8), span 28 ms. Measured bubble =
  // 1 - (24 + 12) / (2 x 30) = 0.4. Stage costs per micro-batch: (2, 4) and (1, 2); messages 0.5 ms.
  mt::pipeline::PipelineStats r0, r1;
  r0.lists = r1.lists = 2;
  r0.span_us = 30000;
  r1.span_us = 28000;
  r0.forward_us = 8000;
  r0.backward_us = 16000;
  r1.forward_us = 4000;
  r1.backward_us = 8000;
  r0.chunk_forward_us = {8000};
  r0.chunk_backward_us = {16000};
  r1.chunk_forward_us = {4000};
  r1.chunk_backward_us = {8000};
  r1.latency_us = 1000;
  r1.latency_samples = 2;
  // Sends and posts: 3 sends of 0.2 ms in all and 2 posts of 0.1 ms; the mean over ranks and messages is charged.
  r0.send_us = 400;
  r0.sends = 2;
  r1.send_us = 200;
  r1.sends = 1;
  r1.post_us = 200;
  r1.posts = 2;
  // Through the float packing the trainer gathers with.
  std::vector<float> buf(mt::plan::packed_size(1));
  mt::plan::pack(r1, 1, buf.data());
  const mt::pipeline::PipelineStats r1b = mt::plan::unpack(buf.data(), 1);
  EXPECT_EQ(r1b.latency_samples, 2);
  EXPECT_EQ(r1b.sends, 1);
  EXPECT_EQ(r1b.posts, 2);
  EXPECT_NEAR(r1b.send_us, 200, 1e-3);
  EXPECT_NEAR(r1b.post_us, 200, 1e-3);
  EXPECT_DOUBLE_EQ(r1b.chunk_backward_us[0], 8000);
  const mt::pipeline::ScheduleSpec spec{"gpipe", 2, 2, 1};
  const auto rep = mt::plan::bubble_report(spec, {r0, r1b}, true);
  EXPECT_NEAR(rep.measured, 0.4, 1e-9);
  ASSERT_EQ(rep.cost.stage_forward.size(), 2u);
  EXPECT_NEAR(rep.cost.stage_forward[0], 2.0, 1e-6);
  EXPECT_NEAR(rep.cost.stage_backward[1], 2.0, 1e-6);
  EXPECT_NEAR(rep.cost.comm, 0.5, 1e-6);
  EXPECT_NEAR(rep.cost.send, 0.2, 1e-6);
  EXPECT_NEAR(rep.cost.post, 0.1, 1e-6);
  mt::plan::CostModel c = rep.cost;
  EXPECT_DOUBLE_EQ(rep.simulated, mt::plan::simulate(spec, c).bubble_fraction);
  c.send = c.post = 0;
  EXPECT_DOUBLE_EQ(rep.simulated_free_calls, mt::plan::simulate(spec, c).bubble_fraction);
  EXPECT_GT(rep.simulated, rep.simulated_free_calls);  // sends and posts on the critical path cost time
  c.comm = 0;
  EXPECT_DOUBLE_EQ(rep.simulated_free_messages, mt::plan::simulate(spec, c).bubble_fraction);
  EXPECT_GT(rep.simulated, rep.simulated_free_messages);  // messages on the critical path cost time
  EXPECT_DOUBLE_EQ(rep.ideal, 1.0 / 3.0);
  // Across hosts the clocks differ: no latency is used.
  EXPECT_DOUBLE_EQ(mt::plan::bubble_report(spec, {r0, r1b}, false).cost.comm, 0.0);
}

}  // namespace
