// meshtrain simulate: replay a pipeline schedule's action lists under the simulator's cost model, print
// utilization and bubble beside the textbook figure, optionally the lists themselves and a swimlane SVG.
//
//   meshtrain simulate --schedule gpipe --stages 4 --micro-batches 8                 utilization 72.7%
//   meshtrain simulate --schedule interleaved --stages 4 --micro-batches 8 --virtual-stages 2 --svg s.svg
//   meshtrain simulate --schedule 1f1b --stages 2 --micro-batches 3 --actions        the lists, per rank
//   meshtrain simulate --from-summary run.json --svg s.svg     replay a real run (`train --pp --summary`):
//                                                               its schedule, measured stage times and latency
//   meshtrain simulate --schedule zb-h2 --stages 4 --micro-batches 8 --steps 4
//                                   K steps back to back (1f1b, zb-h1, zb-h2: parallel/pipeline/sync_window.h), the
//                                   time per step under each rule the step's update may wait by (plan/sync_window_sim.h)
//
// The lists are the ones the executor runs (pipeline::make_schedule), so what this prints is what a real
// run should approach when forward and backward times match the cost model.
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/meshtrain/commands.h"
#include "core/error.h"
#include "core/fs.h"
#include "parallel/pipeline/micro_window.h"
#include "parallel/pipeline/no_flush.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_generator.h"
#include "parallel/pipeline/sync_window.h"
#include "plan/sim_swimlane.h"
#include "plan/simulator.h"
#include "plan/sync_window_sim.h"
#include "plan/window_sim.h"
#include "trace/swimlane_svg.h"

namespace mt::cli {

namespace {

struct SimulateArgs {
  pipeline::ScheduleSpec spec;
  plan::CostModel cost;
  std::string svg;
  std::string from_summary;
  bool actions = false;
  int steps = 1;  // > 1: pipedream-2bw's window of that many steps without a flush (parallel/pipeline/no_flush.h)
  double measured_bubble = -1;  // from the summary
};

// Takes the schedule and the measured costs (per stage, ms; message latency) of a `train --summary` file.
void load_summary(SimulateArgs& a) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(a.from_summary));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(str(a.from_summary, " is not JSON: ", e.what()));
  }
  MT_CHECK_INPUT(j.contains("pipeline") && j["pipeline"].is_object(), a.from_summary,
                 " has no \"pipeline\" section: write it with `meshtrain train --pp P --summary FILE` (P > 1)");
  const nlohmann::json& p = j["pipeline"];
  try {
    a.spec = {p.at("schedule").get<std::string>(), p.at("stages").get<int>(), p.at("micro_batches").get<int>(),
              p.at("virtual_stages").get<int>()};
    a.cost.stage_forward = p.at("stage_forward_ms").get<std::vector<double>>();
    a.cost.stage_backward = p.at("stage_backward_ms").get<std::vector<double>>();
    a.cost.comm = p.value("message_latency_ms", 0.0);
    a.cost.send = p.value("message_send_ms", 0.0);  // absent in older summaries: free
    a.cost.post = p.value("message_post_ms", 0.0);
    // Each stage's measured weight half (split schedules; absent in older summaries: the share splits then).
    if (p.contains("stage_weight_ms") && !p["stage_weight_ms"].empty())
      a.cost.stage_weight = p["stage_weight_ms"].get<std::vector<double>>();
    // What each rank took for each of its chunks (absent in older summaries: each stage's mean stands then).
    if (p.contains("rank_chunk_forward_ms") && !p["rank_chunk_forward_ms"].empty()) {
      a.cost.rank_chunk_forward = p["rank_chunk_forward_ms"].get<std::vector<double>>();
      a.cost.rank_chunk_backward = p.at("rank_chunk_backward_ms").get<std::vector<double>>();
      if (p.contains("rank_chunk_weight_ms") && !p["rank_chunk_weight_ms"].empty())
        a.cost.rank_chunk_weight = p["rank_chunk_weight_ms"].get<std::vector<double>>();
    }
    a.measured_bubble = p.at("bubble_measured").get<double>();
  } catch (const nlohmann::json::exception& e) {
    throw InputError(str(a.from_summary, ": the pipeline section is incomplete: ", e.what()));
  }
  // The values themselves, named by key (the flags they replace were not given).
  const std::pair<const char*, int> counts[] = {
      {"stages", a.spec.stages}, {"micro_batches", a.spec.micro_batches}, {"virtual_stages", a.spec.virtual_stages}};
  for (const auto& [key, v] : counts)
    MT_CHECK_INPUT(v >= 1, a.from_summary, ": pipeline.", key, " is ", v, "; it must be >= 1");
  // One entry per stage of the placement: p V, but p under chimera (each stage held twice, one per route).
  const size_t boxes = size_t(a.spec.stages) * size_t(a.spec.virtual_stages);
  const size_t stages = size_t(pipeline::placement_of(a.spec).stages());
  const char* what = stages == boxes ? "stages x virtual_stages" : "stages (chimera: each stage held twice)";
  MT_CHECK_INPUT(a.cost.stage_forward.size() == stages && a.cost.stage_backward.size() == stages, a.from_summary,
                 ": pipeline.stage_forward_ms and stage_backward_ms must have ", what, " = ", stages,
                 " entries, got ", a.cost.stage_forward.size(), " and ", a.cost.stage_backward.size());
  MT_CHECK_INPUT(a.cost.stage_weight.empty() || a.cost.stage_weight.size() == stages, a.from_summary,
                 ": pipeline.stage_weight_ms must have ", what, " = ", stages, " entries, got ",
                 a.cost.stage_weight.size());
  MT_CHECK_INPUT(a.cost.rank_chunk_forward.empty() ||
                     (a.cost.rank_chunk_forward.size() == boxes && a.cost.rank_chunk_backward.size() == boxes &&
                      (a.cost.rank_chunk_weight.empty() || a.cost.rank_chunk_weight.size() == boxes)),
                 a.from_summary, ": pipeline.rank_chunk_forward_ms, rank_chunk_backward_ms and rank_chunk_weight_ms ",
                 "must have stages x virtual_stages = ", boxes, " entries (rank_chunk_weight_ms may be empty), got ",
                 a.cost.rank_chunk_forward.size(), ", ", a.cost.rank_chunk_backward.size(), " and ",
                 a.cost.rank_chunk_weight.size());
}

std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}

std::string pct(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * x);
  return buf;
}

// --steps K with 1f1b, zb-h1 or zb-h2: the back-to-back window (sync_window.h) replayed under each update rule
// (sync_window_sim.h), its steady-state time per step against 1F1B's flushed step and the one-chunk bound.
void run_sync_window_replay(const SimulateArgs& a) {
  MT_CHECK_INPUT(a.from_summary.empty(), "--steps ", a.steps, " with --from-summary: the back-to-back replay of --schedule ",
                 a.spec.name, " takes the nominal costs only (--backward-ratio, --weight-share, --comm-cost)");
  MT_CHECK_INPUT(a.steps >= 2, "--steps must be >= 2 for a time per step, got ", a.steps);
  const pipeline::ScheduleSpec& spec = a.spec;
  const int p = spec.stages, m = spec.micro_batches;
  const pipeline::Schedule w = pipeline::sync_window_schedule(spec, a.steps);
  const double one = plan::simulate({"1f1b", p, m, 1}, a.cost).makespan;
  std::printf("schedule %s: p = %d stages, m = %d micro-batches, %d steps back to back (each rank's one-step list per "
              "step, the step's update U(t) after the rank's last computation of it and before its first of the next)\n",
              spec.name.c_str(), p, m, a.steps);
  std::printf("cost: forward %s per stage, backward %s x forward%s, message %s\n", num(a.cost.forward).c_str(),
              num(a.cost.backward_ratio).c_str(),
              spec.name == "1f1b" ? ""
                                  : str(" (split: input half ", num(1 - a.cost.weight_share), ", weight half ",
                                        num(a.cost.weight_share), " of it)").c_str(),
              num(a.cost.comm).c_str());
  std::printf("time per step in the steady state (U(K-1) - U(K-2)), against 1f1b's flushed step %s:\n",
              num(one).c_str());
  const std::pair<plan::StepUpdateWait, const char*> rules[] = {
      {plan::StepUpdateWait::local, "local updates (each stage's own gradient: no clipping, no tied copies)"},
      {plan::StepUpdateWait::norm_chain, "global norm passed up the pipeline (clipping, non-finite checks)"},
      {plan::StepUpdateWait::blocking, "blocking collective over the ranks (the trainer's reductions today)"},
      {plan::StepUpdateWait::tied_ends, "tied embedding only, wte's gradient in the last stage's W (before)"},
      {plan::StepUpdateWait::tied_wte_early, "tied embedding, wte's gradient in the last stage's I (as trained)"}};
  for (const auto& [rule, what] : rules) {
    const double t = plan::simulate_sync_window(spec, a.steps, w, a.cost, rule).step();
    std::printf("  %-74s %s (%sx)\n", what, num(t).c_str(), num(t / one).c_str());
  }
  const double F = a.cost.forward, C = a.cost.comm;
  const double bound = (p - 1) * (F + C) + m * F * (1 + a.cost.backward_ratio);
  std::printf("one-chunk bound under the norm (clipping): (p-1)(F+C) + m(F+B) = %s (%sx): rank p-1's step "
              "work starts p-1 forwards after rank 0's update, which waits for rank p-1's last computation\n",
              num(bound).c_str(), num(bound / one).c_str());
}

void run_simulate(SimulateArgs& a) {
  if (!a.from_summary.empty()) load_summary(a);
  MT_CHECK_INPUT(!a.spec.name.empty() && a.spec.stages > 0 && a.spec.micro_batches > 0,
                 "simulate needs --schedule, --stages and --micro-batches (or --from-summary FILE)");
  MT_CHECK_INPUT(a.cost.weight_share >= 0 && a.cost.weight_share <= 1, "--weight-share must be in [0, 1], got ",
                 a.cost.weight_share);  // also NaN, which the flag's range check lets through
  if (a.steps > 1 && pipeline::sync_window_applies(a.spec)) return run_sync_window_replay(a);
  // --steps K (pipedream-2bw): the window of K steps without a flush, replayed as one list over K m micro-batches
  // (its step updates cost nothing here); `step` is the per-step spec, `spec` the one the replay sees.
  // pipedream and pipemare (micro): the window of parallel/pipeline/micro_window.h, its per-micro-batch updates
  // in the list (costing nothing here).
  const bool micro = pipeline::find_schedule(a.spec.name).micro_updates() !=
                     pipeline::ScheduleGenerator::MicroUpdates::none;
  MT_CHECK_INPUT(a.steps == 1 || a.spec.name == "pipedream-2bw" || micro, "--steps ", a.steps,
                 " replays several steps without a flush (pipedream-2bw, pipedream, pipemare) or back to back (1f1b, "
                 "zb-h1, zb-h2); --schedule ",
                 a.spec.name, " flushes after every step, so each of its steps replays as the one-step list");
  const pipeline::ScheduleSpec step = a.spec;
  const bool window = a.steps > 1;
  const pipeline::ScheduleSpec spec = window ? pipeline::window_spec(step, a.steps) : step;
  const pipeline::Schedule listed = !window ? pipeline::make_schedule(step)
                                    : micro ? pipeline::micro_window_schedule(step, a.steps)
                                            : pipeline::no_flush_schedule(step, a.steps);
  if (window && micro)
    pipeline::check_micro_window(step, a.steps, listed);
  else if (window)
    pipeline::check_no_flush(step, a.steps, listed);
  const pipeline::Schedule schedule = window && !micro ? pipeline::without_step_updates(listed) : listed;
  const plan::SimResult r = plan::simulate(spec, schedule, a.cost);
  const int p = spec.stages, m = spec.micro_batches, V = spec.virtual_stages;
  bool split = false;  // the lists hold split backwards (zero-bubble schedules)
  for (const auto& list : schedule.lists)
    for (const pipeline::Action& x : list) split = split || x.kind == pipeline::ActionKind::backward_weight;

  std::printf("schedule %s: p = %d stages, m = %d micro-batches, V = %d chunk%s per rank\n", spec.name.c_str(), p,
              step.micro_batches, V, V > 1 ? "s" : "");
  if (window)
    std::printf("%d steps of %d micro-batches without a flush (step t+1's forwards fill step t's cool-down; %s "
                "inside the list, costing nothing here), replayed as one list of K m = %d micro-batches\n",
                a.steps, step.micro_batches, micro ? "an update after every micro-batch's backward" : "each step's update",
                m);
  const int routes = schedule.placement.routes();  // 2: every stage held twice (chimera), a chunk is a stage
  if (a.cost.stage_forward.empty()) {
    std::printf("cost: forward %s per %s, backward %s x forward, message %s\n", num(a.cost.forward).c_str(),
                routes > 1 ? "stage (one chunk)"
                : V > 1    ? str("rank (", num(a.cost.forward / V), " per chunk)").c_str()
                           : "stage",
                num(a.cost.backward_ratio).c_str(), num(a.cost.comm).c_str());
    if (a.cost.send > 0 || a.cost.post > 0)
      std::printf("cost of a message on its ranks: send %s, post %s (computing nothing: bubble)\n",
                  num(a.cost.send).c_str(), num(a.cost.post).c_str());
    if (split)
      std::printf("cost of the split backward: input half (I) %s, weight half (W) %s per %s\n",
                  num((1 - a.cost.weight_share) * a.cost.backward_ratio * a.cost.forward / V).c_str(),
                  num(a.cost.weight_share * a.cost.backward_ratio * a.cost.forward / V).c_str(),
                  V > 1 ? "chunk" : "stage");
  } else {
    std::printf("cost (measured, ms per micro-batch): message %s, send %s and post %s on their rank\n",
                num(a.cost.comm).c_str(), num(a.cost.send).c_str(), num(a.cost.post).c_str());
    for (size_t s = 0; s < a.cost.stage_forward.size(); s++)
      std::printf("  stage %zu (rank %d, chunk %d): forward %s, backward %s%s\n", s,
                  schedule.placement.slot(0, (int)s).rank, schedule.placement.slot(0, (int)s).chunk,
                  num(a.cost.stage_forward[s]).c_str(), num(a.cost.stage_backward[s]).c_str(),
                  split && !a.cost.stage_weight.empty()
                      ? str(" (input half ", num(a.cost.stage_backward[s] - a.cost.stage_weight[s]), ", weight half ",
                            num(a.cost.stage_weight[s]), ", measured)").c_str()
                      : "");
    if (split && a.cost.stage_weight.empty())
      std::printf("  the split backward: input half (I) %s, weight half (W) %s of each stage's backward (assumed, "
                  "not measured)\n",
                  num(1 - a.cost.weight_share).c_str(), num(a.cost.weight_share).c_str());
    if (!a.cost.rank_chunk_forward.empty()) {  // these replace the stage means above in the replay
      std::printf("  replayed per (rank, chunk) as each rank took them:\n");
      for (int j = 0; j < p; j++)
        for (int c = 0; c < V; c++) {
          const size_t k = (size_t)j * V + c;
          const double bw = a.cost.rank_chunk_backward[k];
          std::printf("  rank %d chunk %d (stage %d): forward %s, backward %s%s\n", j, c,
                      schedule.placement.stage_of(j, c), num(a.cost.rank_chunk_forward[k]).c_str(), num(bw).c_str(),
                      split && !a.cost.rank_chunk_weight.empty()
                          ? str(" (input half ", num(bw - a.cost.rank_chunk_weight[k]), ", weight half ",
                                num(a.cost.rank_chunk_weight[k]), ", measured)").c_str()
                          : "");
        }
    }
  }
  if (a.actions) {
    for (int j = 0; j < p; j++) {
      std::printf("rank %d: %s\n", j, pipeline::compute_summary(listed[j], V).c_str());
      for (size_t k = 0; k < listed[j].size(); k++)
        std::printf("  %4zu  %s\n", k, pipeline::to_string(listed[j][k]).c_str());
    }
  }
  std::printf("makespan %s\n", num(r.makespan).c_str());
  std::printf("utilization %s (busy %s of %s)\n", pct(r.utilization).c_str(), num(r.busy).c_str(),
              num(p * r.makespan).c_str());
  const bool zb_v = spec.name == "zb-v", zb_h = spec.name == "zb-h1" || spec.name == "zb-h2";
  if (routes == 2)
    std::printf("bubble fraction %s (Chimera's (p-2)/(2m+p-2) = %d/%d = %s, with F = B and m a multiple of p)\n",
                pct(r.bubble_fraction).c_str(), p - 2, 2 * m + p - 2, pct(plan::theoretical_bubble(spec)).c_str());
  else if (zb_h || zb_v)  // the least any list reaches with the ranks starting the step together (simulator.h)
    std::printf("bubble fraction %s (zero-bubble bound at F = B = W, ranks starting the step together: "
                "(p-1)/(%s+p-1) = %d/%d = %s)\n",
                pct(r.bubble_fraction).c_str(), zb_v ? "6m" : "3m", p - 1, (zb_v ? 6 : 3) * m + p - 1,
                pct(plan::theoretical_bubble(spec)).c_str());
  else
    std::printf("bubble fraction %s (ideal (p-1)/(%s+p-1) = %d/%d = %s)\n", pct(r.bubble_fraction).c_str(),
                V > 1 ? "V*m" : "m", p - 1, V * m + p - 1, pct(plan::theoretical_bubble(spec)).c_str());
  if (a.measured_bubble >= 0 && window)
    std::printf("measured bubble of the run: %s (its steps flushed: not comparable with this window)\n",
                pct(a.measured_bubble).c_str());
  else if (a.measured_bubble >= 0)
    std::printf("measured bubble of the run: %s (%+.1f percentage points from the simulation)\n",
                pct(a.measured_bubble).c_str(), 100 * (a.measured_bubble - r.bubble_fraction));
  if (window) {
    // Against 1F1B's flushed steps of the same costs, and the steady state: what one more step adds.
    const plan::SimResult one = plan::simulate({"1f1b", p, step.micro_batches, 1}, a.cost);
    const pipeline::ScheduleSpec shorter = pipeline::window_spec(step, a.steps - 1);
    const plan::SimResult less = plan::simulate(
        shorter,
        micro ? pipeline::micro_window_schedule(step, a.steps - 1)
              : pipeline::without_step_updates(pipeline::no_flush_schedule(step, a.steps - 1)),
        a.cost);
    const double added = r.makespan - less.makespan, work = r.busy - less.busy;
    std::printf("1f1b, %d flushed steps: makespan %s (%s per step), bubble %s; this window: %s per step (%sx 1f1b's)\n",
                a.steps, num(a.steps * one.makespan).c_str(), num(one.makespan).c_str(),
                pct(one.bubble_fraction).c_str(), num(r.makespan / a.steps).c_str(),
                num(r.makespan / (a.steps * one.makespan)).c_str());
    std::printf("steady state: step %d adds %s to the makespan for %s of work on %d ranks: bubble %s per step\n",
                a.steps, num(added).c_str(), num(work).c_str(), p, pct(added > 0 ? 1 - work / (p * added) : 0).c_str());
    if (micro) {  // the schedule's in-flight count and the stash it implies (micro_window.h)
      const auto list_of = [](const std::vector<int>& v) {
        std::string s;
        for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
        return "[" + s + "]";
      };
      std::printf("in flight per rank: %s; weight versions per rank with stashing: %s (pipedream), without: 1 "
                  "(pipemare)\n",
                  list_of(pipeline::in_flight_counts(listed)).c_str(),
                  list_of(pipeline::stash_depths(listed, true)).c_str());
      // As a run has them: each update a collective over the stages (its micro-batch's gradient norm).
      const plan::SimResult blocking = plan::simulate_micro_window(step, a.steps, listed, a.cost);
      std::printf("with the updates as blocking collectives over all ranks (each micro-batch's norm): makespan %s "
                  "(bubble %s, %sx 1f1b's flushed steps)\n",
                  num(blocking.makespan).c_str(), pct(blocking.bubble_fraction).c_str(),
                  num(blocking.makespan / (a.steps * one.makespan)).c_str());
    } else {
      // The same window with its updates in it: waiting for the norm (started after each rank's last backward of
      // the step) as designed, and as blocking collectives over every rank (the step's exchange as it is today).
      const plan::SimResult normed = plan::simulate_window(step, a.steps, listed, a.cost, plan::UpdateWait::norm_started);
      const plan::SimResult blocking = plan::simulate_window(step, a.steps, listed, a.cost, plan::UpdateWait::all_reached);
      std::printf("with the updates in the list: waiting for the norm, makespan %s (bubble %s); as blocking collectives "
                  "over all ranks, makespan %s (bubble %s, %sx 1f1b's flushed steps)\n",
                  num(normed.makespan).c_str(), pct(normed.bubble_fraction).c_str(), num(blocking.makespan).c_str(),
                  pct(blocking.bubble_fraction).c_str(), num(blocking.makespan / (a.steps * one.makespan)).c_str());
    }
  }
  for (int j = 0; j < p; j++)
    std::printf("rank %d: busy %s, idle %s, peak in-flight activations %d%s\n", j, num(r.busy_per_rank[j]).c_str(),
                num(r.makespan - r.busy_per_rank[j]).c_str(), pipeline::peak_in_flight(schedule[j]),
                V > 1 ? " (micro-batch, chunk) pairs" : "");
  std::fflush(stdout);
  if (!a.svg.empty()) {
    write_file_atomic(a.svg, trace::swimlane_svg(plan::swimlane_of(spec, a.cost, r)));
    std::fprintf(stderr, "wrote %s\n", a.svg.c_str());
  }
}

}  // namespace

void add_simulate_command(CLI::App& app) {
  auto a = std::make_shared<SimulateArgs>();
  CLI::App* sub = app.add_subcommand(
      "simulate", "replay a pipeline schedule under a cost model: utilization, bubble, swimlane SVG");
  a->spec.name.clear();
  a->spec.stages = a->spec.micro_batches = 0;
  sub->add_option("--schedule", a->spec.name, pipeline::schedule_names_joined(" | "));
  sub->add_option("--stages", a->spec.stages, "p: pipeline stages (ranks)")->check(kPositiveInt);
  sub->add_option("--micro-batches", a->spec.micro_batches, "m: micro-batches per step")->check(kPositiveInt);
  sub->add_option("--virtual-stages", a->spec.virtual_stages,
                  "V: model chunks per rank (interleaved needs >= 2, m a multiple of p)")
      ->capture_default_str()->check(kPositiveInt);
  sub->add_option("--backward-ratio", a->cost.backward_ratio, "R: backward time / forward time")
      ->capture_default_str()->check(finite_non_negative("backward ratio"));
  sub->add_option("--weight-share", a->cost.weight_share,
                  "w: the weight-gradient half's share of a split backward (zero-bubble schedules; the input half "
                  "takes 1 - w)")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  sub->add_option("--comm-cost", a->cost.comm,
                  "time of one activation or gradient message, in units of a rank's forward time (all its chunks)")
      ->capture_default_str()->check(finite_non_negative("message cost"));
  sub->add_option("--send-cost", a->cost.send,
                  "time one send takes on its own rank (the copy and the transport call), in the same units")
      ->capture_default_str()->check(finite_non_negative("send cost"));
  sub->add_option("--post-cost", a->cost.post, "time one receive post takes on its own rank, in the same units")
      ->capture_default_str()->check(finite_non_negative("post cost"));
  sub->add_option("--svg", a->svg, "write the swimlane diagram here (SVG)");
  sub->add_option("--from-summary", a->from_summary,
                  "replay a real run: the schedule, measured stage times, message latency and send / post times of a "
                  "`meshtrain train --pp P --summary FILE` (replaces the flags above)");
  sub->add_flag("--actions", a->actions, "print every rank's action list");
  sub->add_option("--steps", a->steps,
                  "K: replay K steps as one list without a flush (pipedream-2bw only), beside 1F1B's K flushed steps")
      ->capture_default_str()->check(CLI::Range(1, 100000));
  sub->callback([a] { run_simulate(*a); });
}

}  // namespace mt::cli
