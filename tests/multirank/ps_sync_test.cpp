// The parameter server's exchanges (train/ps_sync.h) driven the way the step loop drives every exchange
// (begin_run, then per step begin_step, the executor calling step, settle; end_run, report), on 3 forked
// ranks: workers 0 and 1, server 2, staleness bound 0, SGD without momentum at lr 0.5, no clipping.
// Worker r's gradient of flat element i at step s is r + 1 + i + s and its loss sum r + 1 + s, all small
// integers, so the exact data-parallel step is known in closed form: the summed gradient 3 + 2 i + 2 s, the
// mean loss (3 + 2 s) / 4 over 4 items, and the parameters p - 0.5 (3 + 2 i + 2 s), exact in float32.
#include "train/ps_sync.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/error.h"
#include "optim/optimizer.h"
#include "parallel/data/data_parallel.h"
#include "parallel/mesh/mesh.h"
#include "shm_ranks.h"

namespace {

using namespace mt::train;

constexpr int kSteps = 2;
constexpr double kItems = 4;

void check_outcomes(const std::map<int64_t, StepOutcome>& got, size_t n, const char* who) {
  MT_REQUIRE(mt::Error, got.size() == kSteps, who, " got ", got.size(), " outcomes, want ", kSteps);
  for (const auto& [s, o] : got) {
    double sq = 0;
    for (size_t i = 0; i < n; i++) sq += (3.0 + 2.0 * i + 2.0 * s) * (3.0 + 2.0 * i + 2.0 * s);
    MT_REQUIRE(mt::Error, o.loss == (3.0 + 2.0 * s) / kItems, who, " step ", s, " loss ", o.loss);
    MT_REQUIRE(mt::Error, std::fabs(o.norm - std::sqrt(sq)) <= 1e-12 * std::sqrt(sq), who, " step ", s, " norm ",
               o.norm, ", want ", std::sqrt(sq));
    MT_REQUIRE(mt::Error, o.lr == 0.5f, who, " step ", s, " lr ", o.lr);
  }
}

TEST(PsSync, StalenessZeroWorkersGetTheExactDataParallelStep) {
  auto res = mt::test::run_shm_ranks(
      3,
      [&](mt::comm::Communicator& world) {
        mt::parallel::Mesh mesh(&world, mt::parallel::MeshGrid(3, 2, 1, 1, 1));
        const mt::parallel::PsLayout layout{2, 1, 0};
        mt::nn::ParamRegistry params;
        params.add("a", {5});
        params.add("b", {2, 3}, {}, 1);
        mt::parallel::DataParallel store(params, nullptr, {});
        store.initialize([&](mt::nn::Param& p) {
          for (size_t i = 0; i < p.numel; i++) p.data[i] = 10.0f + (float)(p.offset + i);
        });
        const size_t n = params.size();
        mt::trace::ChromeTrace tracer;
        StepTail tail(0, mt::optim::LrSchedule{0.5, 0.5, 0, 100});
        PsParts parts = make_ps_parts(mesh, store, params, layout, kSteps, tail, &tracer);
        GradSync& sync = *parts.sync;
        std::map<int64_t, StepOutcome> outcomes;
        sync.set_outcome_sink([&](int64_t s, const StepOutcome& o) { outcomes[s] = o; });
        const bool server = mesh.server();
        mt::optim::Sgd opt(server ? n : 0, {0.0f, 0.0f});
        // A server's executor computes nothing: it calls the update once, with no loss of its own.
        std::unique_ptr<StepExecutor> server_steps = make_server_executor();
        const int r = world.rank();
        sync.begin_run(0);
        for (int64_t s = 0; s < kSteps; s++) {
          sync.begin_step(s);
          int updates = 0;
          auto update = [&](double loss_sum, UpdatePart) {
            updates++;
            sync.step(s, loss_sum, kItems, tail, opt);
          };
          if (server) {
            server_steps->run(s, BatchShare::even(0, 1, 1), sync.hooks(), update);
          } else {
            for (mt::nn::Param& p : params.params())
              for (size_t i = 0; i < p.numel; i++) p.grad_acc()[i] = (float)(r + 1 + p.offset + i + s);
            update(r + 1.0 + s, {});
          }
          MT_REQUIRE(mt::Error, updates == 1, "step ", s, ": ", updates, " updates");
          sync.settle(s);
          if (!server) {
            nlohmann::json row;
            sync.annotate(row);
            MT_REQUIRE(mt::Error, row.value("staleness", -1) == 0, "worker ", r, " step ", s, ": ", row.dump());
          }
        }
        sync.end_run();
        check_outcomes(outcomes, n, server ? "server" : "worker");
        if (!server)  // the parameters after both steps, taken from the server's versions
          for (size_t i = 0; i < n; i++) {
            const float want = 10.0f + (float)i - 0.5f * (3.0f + 2.0f * i) - 0.5f * (5.0f + 2.0f * i);
            MT_REQUIRE(mt::Error, params.data()[i] == want, "worker ", r, " [", i, "] = ", params.data()[i], ", want ",
                       want);
          }
        const ExchangeReport rep = sync.report(0, kSteps);  // collective over the world
        MT_REQUIRE(mt::Error,
                   rep.key == "ps" && rep.section["max_staleness"] == 0 &&
                       rep.section["staleness_counts"] == nlohmann::json::array({2 * kSteps}),
                   "report ", rep.key, " ", rep.section.dump());
      },
      60);
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

}  // namespace
