#include "train/ps_sync.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "train/run.h"

namespace mt::train {

namespace {

// The summary's "ps" section and its closing line (collective over the world: every rank's records).
ExchangeReport ps_report(const parallel::Mesh& mesh, const parallel::PsLayout& psl,
                         const parallel::PsServerStats* server, const std::vector<double>& begun,
                         const std::vector<double>& staleness, int64_t start, int64_t steps) {
  const parallel::PsReport rep =
      parallel::measure_staleness(*mesh.world(), psl, server, begun, staleness, start, steps);
  nlohmann::json j = {{"workers", psl.workers},
                      {"servers", psl.servers},
                      {"staleness_bound", psl.staleness},
                      {"max_staleness", rep.max_staleness},
                      {"mean_staleness", rep.mean_staleness},
                      {"staleness_counts", rep.staleness_counts}};
  if (rep.measured) j["max_ahead"] = rep.max_ahead;
  std::string line = str("parameter server: staleness used max ", rep.max_staleness, ", mean ", rep.mean_staleness,
                         rep.measured ? str("; most steps any worker ran ahead of the slowest: ", rep.max_ahead) : "",
                         " (bound ", psl.staleness, ")");
  return {"ps", std::move(j), std::move(line)};
}

class PsWorkerSync : public GradSync {
 public:
  PsWorkerSync(const parallel::Mesh& m, parallel::DataParallel& store, nn::ParamRegistry& p, trace::ChromeTrace* t,
               const parallel::PsLayout& layout, int64_t last_version, const StepTail& tail)
      : GradSync(m, store, p, t), layout_(layout), worker_(*m.world(), p, layout, last_version), tail_(tail) {}
  void begin_run(int64_t first) override { start_ = first; }
  void begin_step(int64_t s) override {
    const auto t0 = StepClock::now();
    const int64_t have = worker_.acquire(std::max<int64_t>(start_, s - layout_.staleness), on_version());
    waited_ = StepClock::since(t0);
    staleness_now_ = s - have;
    begun_.push_back(trace::ChromeTrace::now_us() * 1e-6);
    staleness_.push_back((double)staleness_now_);
    engine_.refresh_mirror();  // the parameters of version `have` arrived in place
    engine_.begin_step();
  }
  void reduce(int64_t) override { engine_.finish_backward(); }
  void step(int64_t s, double loss_sum, double, const StepTail&, optim::Optimizer&) override {
    reduce(s);
    worker_.push(s, loss_sum);  // the servers apply it; the outcome comes with version s + 1
  }
  void settle(int64_t s) override {
    worker_.acquire(s + 1, on_version());
    engine_.refresh_mirror();
  }
  void end_run() override { worker_.flush(); }
  uint64_t bytes_sent() const override { return mesh_.world()->counters().total_sent(); }
  void annotate(nlohmann::json& row) const override {
    row["wait_s"] = waited_;            // this worker's wait for fresh enough parameters
    row["staleness"] = staleness_now_;  // versions between the parameters used and the step
  }
  ExchangeReport report(int64_t start, int64_t steps) override {
    return ps_report(mesh_, layout_, nullptr, begun_, staleness_, start, steps);
  }

 private:
  // Each step's version, in order, as every server has sent it: step version - 1's outcome.
  std::function<void(const parallel::VersionInfo&)> on_version() {
    return [this](const parallel::VersionInfo& v) {
      if (v.version <= start_) return;  // the starting parameters
      tail_.check(v.version - 1, v.loss, v.norm);
      if (!sink_) return;
      StepOutcome out;
      out.loss = v.loss;
      out.norm = v.norm;
      out.lr = (float)v.lr;
      sink_(v.version - 1, out);
    };
  }
  parallel::PsLayout layout_;
  parallel::PsWorker worker_;
  const StepTail& tail_;
  int64_t start_ = 0, staleness_now_ = 0;
  double waited_ = 0;
  std::vector<double> begun_, staleness_;  // per step: when it began computing (s), its staleness
};

class PsServerSync : public GradSync {
 public:
  PsServerSync(const parallel::Mesh& m, parallel::DataParallel& store, nn::ParamRegistry& p, trace::ChromeTrace* t,
               const parallel::PsLayout& layout, std::shared_ptr<parallel::PsServer> server)
      : GradSync(m, store, p, t), layout_(layout), server_(std::move(server)) {}
  void begin_run(int64_t first) override {
    server_->reload();  // the registry holds the resumed parameters, if any
    const double nan = std::numeric_limits<double>::quiet_NaN();
    server_->publish({first, nan, nan, 0});
  }
  void begin_step(int64_t) override {}
  void reduce(int64_t) override {}
  void step(int64_t s, double, double items, const StepTail& tail, optim::Optimizer& opt) override {
    StepOutcome out;
    out.loss = server_->gather(s) / items;
    out.norm = server_->grad_norm();
    if (!std::isfinite(out.loss) || !std::isfinite(out.norm)) {
      server_->publish({s + 1, out.loss, out.norm, tail.lr(s)});  // the workers stop on it too
      server_->flush();
    }
    out.lr = tail.finish(s, out.loss, out.norm, [&](float f) { server_->scale_grad(f); });
    opt.step(server_->slice(), server_->grad(), server_->segments(), out.lr, s);
    server_->publish({s + 1, out.loss, out.norm, out.lr});
    if (sink_) sink_(s, out);
  }
  void end_run() override { server_->flush(); }
  uint64_t bytes_sent() const override { return mesh_.world()->counters().total_sent(); }
  ExchangeReport report(int64_t start, int64_t steps) override {
    return ps_report(mesh_, layout_, &server_->stats(), {}, {}, start, steps);
  }

 private:
  parallel::PsLayout layout_;
  std::shared_ptr<parallel::PsServer> server_;
};

class ServerSteps : public StepExecutor {
 public:
  void run(int64_t, const BatchShare&, const StepHooks&, const StepUpdate& update) override { update(0.0, {}); }
  bool calls_hooks() const override { return false; }
};

}  // namespace

PsParts make_ps_parts(const parallel::Mesh& mesh, parallel::DataParallel& store, nn::ParamRegistry& params,
                      const parallel::PsLayout& layout, int64_t last_version, const StepTail& tail,
                      trace::ChromeTrace* tracer) {
  MT_ASSERT(mesh.world() && mesh.grid().servers() == layout.servers, "a parameter-server run without its servers");
  PsParts parts;
  std::shared_ptr<parallel::PsServer> server;
  if (mesh.server()) {
    server = std::make_shared<parallel::PsServer>(*mesh.world(), mesh.group(parallel::MeshGroup::side), params, layout,
                                                  mesh.world_rank() - layout.workers);
    parts.sync = std::make_unique<PsServerSync>(mesh, store, params, tracer, layout, server);
  } else {
    parts.sync = std::make_unique<PsWorkerSync>(mesh, store, params, tracer, layout, last_version, tail);
  }
  parts.source =
      std::make_unique<PsSource>(*mesh.world(), store, layout, params.size(), mesh.world_rank(), std::move(server));
  return parts;
}

std::unique_ptr<StepExecutor> make_server_executor() { return std::make_unique<ServerSteps>(); }

}  // namespace mt::train
