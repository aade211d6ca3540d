// The parameter-server run (parallel/async/param_server.h): servers apply the steps, workers compute them on
// parameters at most --staleness versions old. The servers end each step with the run's StepTail
// (divergence checks, clipping, learning rate); a worker learns a step's loss and norm when the version it
// produced arrives, so the lead (worker 0) writes a step's row then. Evaluation and checkpoints wait for
// that version.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "core/error.h"
#include "parallel/async/param_server.h"
#include "train/run.h"

namespace mt::train {

namespace {

parallel::PsLayout layout_of(const Run& r) {
  const parallel::MeshGrid& g = r.mesh.grid();
  return {g.workers(), g.servers(), r.cfg.staleness};
}

void serve(Run& r, parallel::PsServer& server) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  server.publish({r.start, nan, nan, 0});
  for (int64_t s = r.start; s < r.cfg.steps; s++) {
    const double loss = server.gather(s) / (double)r.items_per_step;
    const double norm = server.grad_norm();
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      server.publish({s + 1, loss, norm, r.tail.lr(s)});  // a non-finite loss tells the workers to stop too
      server.flush();
    }
    const float lr = r.tail.finish(s, loss, norm, [&](float f) { server.scale_grad(f); });
    r.opt->step(server.slice(), server.grad(), server.segments(), lr, s);
    server.publish({s + 1, loss, norm, lr});
    r.sum.steps_run++;
    r.sum.final_loss = loss;
    if (r.cadence.save_after(s)) r.ckpt->save(s + 1);
    if (r.cadence.stop_after(s)) break;
  }
  server.flush();
}

// A worker's rows wait for the version their step produced: step -> row.
struct PendingRows {
  std::map<int64_t, nlohmann::json> rows;
  // Writes the rows that are whole (this worker's part and the servers'), in step order.
  void write(Run& r) {
    while (!rows.empty() && rows.begin()->second.contains("loss") && rows.begin()->second.contains("step")) {
      nlohmann::json& row = rows.begin()->second;
      const double loss = row["loss"];
      r.log->step(row, row["step"].get<int64_t>(), loss, row["lr"].get<double>(), row[r.log->items_key()].get<double>());
      r.sum.final_loss = loss;
      rows.erase(rows.begin());
    }
  }
};

struct WorkerTimes {
  std::vector<double> begun, staleness;  // per step: when it began computing (s), its staleness
};

WorkerTimes work(Run& r) {
  const int64_t end = r.cadence.end();
  parallel::PsWorker worker(*r.mesh.world(), r.task->params(), layout_of(r), end);  // `end`: its last version
  PendingRows pending;
  WorkerTimes times;
  auto on_version = [&](const parallel::VersionInfo& v) {
    if (v.version <= r.start) return;  // the starting parameters
    r.tail.check(v.version - 1, v.loss, v.norm);
    nlohmann::json& row = pending.rows[v.version - 1];
    row["loss"] = v.loss;
    row["grad_norm"] = v.norm;
    row["lr"] = v.lr;
  };
  const StepHooks hooks = r.sync->hooks();
  StepMeter meter(r, [&] { return r.mesh.world()->counters().total_sent(); });
  for (int64_t s = r.start; s < end; s++) {
    const auto t0 = StepClock::now();
    meter.start();  // the wait for fresh enough parameters counts in the step's time
    const int64_t have = worker.acquire(std::max<int64_t>(r.start, s - r.cfg.staleness), on_version);
    const double waited = StepClock::since(t0);
    pending.write(r);
    times.begun.push_back(trace::ChromeTrace::now_us() * 1e-6);
    times.staleness.push_back((double)(s - have));
    r.sync->begin_step();
    r.executor->run(s, r.layout.share(r.mesh.coord().dp, s), hooks,
                    [&](double loss_sum) {  // a worker's update: the push to the servers
                      r.straggler.pause(r.mesh.world_rank());
                      r.sync->reduce(s);
                      worker.push(s, loss_sum);
                    });
    nlohmann::json& row = pending.rows[s];
    meter.finish(s, row);
    row["step"] = s;
    row["wait_s"] = waited;        // this worker's wait for fresh enough parameters
    row["staleness"] = s - have;   // versions between the parameters used and step s
    const bool eval_now = r.cadence.eval_after(s), save_now = r.cadence.save_after(s);
    if (eval_now || save_now || s + 1 == end) {
      worker.acquire(s + 1, on_version);  // the parameters after step s, everywhere
      if (eval_now) (*r.evaluate)(s, pending.rows[s]);
    }
    pending.write(r);
    if (save_now) r.ckpt->save(s + 1);
  }
  worker.flush();
  pending.write(r);
  if (end < r.cfg.steps) r.log->message("stopped after step " + std::to_string(end) + " (--stop-at-step)");
  return times;
}

}  // namespace

nlohmann::json run_parameter_server(Run& r) {
  const parallel::PsLayout psl = layout_of(r);
  MT_ASSERT(r.ps_source, "a parameter-server run without its PsSource");
  PsSource& source = *r.ps_source;
  parallel::PsServer* server = nullptr;
  WorkerTimes times;
  if (r.mesh.server()) {
    source.set_server(std::make_unique<parallel::PsServer>(*r.mesh.world(), r.mesh.group(parallel::MeshGroup::side),
                                                           r.task->params(), psl, r.mesh.world_rank() - psl.workers));
    server = source.server();
    serve(r, *server);
  } else {
    times = work(r);
  }
  r.log->finish();
  const parallel::PsReport rep = parallel::measure_staleness(*r.mesh.world(), psl, server ? &server->stats() : nullptr,
                                                             times.begun, times.staleness, r.start, r.sum.steps_run);
  nlohmann::json j = {{"workers", psl.workers},           {"servers", psl.servers},
                      {"staleness_bound", psl.staleness},   {"max_staleness", rep.max_staleness},
                      {"mean_staleness", rep.mean_staleness}, {"staleness_counts", rep.staleness_counts}};
  if (rep.measured) j["max_ahead"] = rep.max_ahead;
  r.log->message(str("parameter server: staleness used max ", rep.max_staleness, ", mean ", rep.mean_staleness,
                     rep.measured ? str("; most steps any worker ran ahead of the slowest: ", rep.max_ahead) : "",
                     " (bound ", psl.staleness, ")"));
  return j;
}

}  // namespace mt::train
