// PipeDream-2BW's split exchange (train/split_exchange.h) on 2 forked shm ranks as the two stages of a pipeline
// (the world is the pp and the replica group, a split of it the tie group; dp 1). Each rank holds a tied tensor
// "wte" [4, 3] (summed over the tie group; only stage 0's copy counted in the norm) and a tensor of its own
// "w" [5]; per step s its gradient and loss part are made up from (rank, s).
//   - Outcome: the reduced gradient, the loss sum and the norm equal, bit for bit, the blocking exchange's
//     arithmetic written out here (tied copies a + b, the loss and the norm's squares summed as float over the
//     ranks as sum_across does, each segment's norm squared and added in segment order).
//   - No update waits for the other rank's update: rank 1 starts steps 0 and 1 and finishes step 0, then tells
//     rank 0, which has started both steps and only polls (no finish) until that message arrives. An exchange
//     that issued its collectives at finish (a blocking update) never lets rank 1 finish first: rank 0's wait
//     for the message then runs into its deadline and the test fails.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "nn/params.h"
#include "optim/optimizer.h"
#include "shm_ranks.h"
#include "train/split_exchange.h"

namespace {

using mt::train::SplitExchange;

constexpr size_t kWte = 12, kW = 5;

float grad_of(int rank, int64_t s, size_t k) { return 0.03125f * (float)((rank * 7 + (int)s * 3 + (int)k) % 11) - 0.1f; }
double loss_of(int rank, int64_t s) { return rank == 1 ? 2.5 + 0.25 * (double)s : 0.0; }  // the last stage's

void fill(mt::nn::ParamRegistry& p, int rank, int64_t s) {
  p.zero_grad();
  float* g = p.grad();
  for (size_t k = 0; k < p.size(); k++) g[k] = grad_of(rank, s, k);
}

// What the blocking exchange computes for step s, from both ranks' parts.
struct Expected {
  std::vector<float> grad;  // this rank's registry after the exchange
  double loss = 0, norm = 0;
};
Expected expected(int rank, int64_t s) {
  Expected e;
  for (size_t k = 0; k < kWte + kW; k++) e.grad.push_back(grad_of(rank, s, k));
  for (size_t k = 0; k < kWte; k++) e.grad[k] = grad_of(0, s, k) + grad_of(1, s, k);
  e.loss = (double)((float)loss_of(0, s) + (float)loss_of(1, s));
  double sq[2];
  for (int r = 0; r < 2; r++) {
    double wte = mt::optim::global_norm(e.grad.data(), kWte);  // (the summed copy: the same on both ranks)
    std::vector<float> w(kW);
    for (size_t k = 0; k < kW; k++) w[k] = grad_of(r, s, kWte + k);
    double nw = mt::optim::global_norm(w.data(), kW);
    double total = wte * wte + nw * nw;
    sq[r] = r == 0 ? total : total - wte * wte;  // rank 1's copy of wte is not counted
  }
  e.norm = std::sqrt(std::max(0.0, (double)((float)sq[0] + (float)sq[1])));
  return e;
}

void check(mt::nn::ParamRegistry& p, const SplitExchange::Outcome& o, int rank, int64_t s) {
  const Expected e = expected(rank, s);
  MT_ASSERT(o.loss_sum == e.loss, "rank ", rank, " step ", s, ": loss ", o.loss_sum, " != ", e.loss);
  MT_ASSERT(o.norm == e.norm, "rank ", rank, " step ", s, ": norm ", o.norm, " != ", e.norm);
  for (size_t k = 0; k < p.size(); k++)
    MT_ASSERT(p.grad()[k] == e.grad[k], "rank ", rank, " step ", s, ": gradient[", k, "] ", p.grad()[k], " != ",
             e.grad[k]);
}

TEST(SplitExchange2bw, OutcomeOfEachStepAndNoUpdateWaitsForAnother) {
  auto res = mt::test::run_shm_ranks(2, [](mt::comm::Communicator& world) {
    world.set_timeout(20);
    const int r = world.rank();
    auto tie = world.split(0, r, "tie");
    mt::nn::ParamRegistry p;
    mt::nn::Param& wte = p.add("wte", {4, 3});
    wte.replicas.summed = true;
    wte.replicas.counted = r == 0;
    p.add("w", {5});
    p.finalize();
    SplitExchange xs(p, mt::optim::segments_of(p), {tie.get(), nullptr, &world, &world});
    for (int64_t s : {0, 1}) {
      fill(p, r, s);
      xs.start(s, loss_of(r, s));
    }
    uint8_t token = 0;
    if (r == 1) {
      const SplitExchange::Outcome o = xs.finish(0, p.grad());
      check(p, o, r, 0);
      token = 1;
      world.send(&token, 1, mt::comm::DType::u8, 0, 7);
    } else {
      // Polls only (as between computations), until rank 1 says it has finished step 0's exchange.
      mt::comm::Request got = world.irecv(&token, 1, mt::comm::DType::u8, 1, 7);
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
      while (!got.test()) {
        xs.poll();
        MT_ASSERT(std::chrono::steady_clock::now() < until,
                 "rank 1 did not finish step 0's exchange while rank 0 had not reached its own finish");
      }
      got.wait();
      const SplitExchange::Outcome o = xs.finish(0, p.grad());
      check(p, o, r, 0);
    }
    const SplitExchange::Outcome o1 = xs.finish(1, p.grad());
    check(p, o1, r, 1);
    MT_ASSERT(xs.in_flight() == 0, "steps left in flight");
  });
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

}  // namespace
