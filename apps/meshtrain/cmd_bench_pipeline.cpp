// meshtrain bench pipeline: the pipeline executor on real ranks and real messages, with each stage's compute
// emulated by sleeping for a set time, against the simulator in the same run. Sleeping ranks do not compete
// for cores, so P ranks behave as on P dedicated cores even on a smaller machine: this isolates the schedule,
// the executor and the transport (what the simulator models) from the model's arithmetic.
//
//   meshtrain bench pipeline --stages 4 --forward-ms 20 --backward-ratio 2 --activation-kb 1024
//
// For each schedule and micro-batch count it prints the measured bubble (1 - summed compute / (p x the longest
// rank's span), first step excluded), the simulated one with the measured stage times, message latency and
// mean time of one send and one receive post on their own rank (the "msg", "send" and "post" ms columns), the
// simulated one with the nominal times (forward F, backward R F, free messages) and the ideal; and the step
// time (the longest rank's span per timed step) with its ratio to 1F1B's at the same m, whose steps alternate
// with the schedule's in the same job.
//
// Each step starts on every rank together (a barrier, as after a training step's reductions), so no list ends
// before rank p - 1 has waited for the p - 1 forwards ahead of its first: with F = B = W the zero-bubble
// schedules' step is at least (p - 1) F + 3m F (zb-v (p - 1) F / 2 + 3m F), 0.818x (0.773x) 1F1B's 3 (m + p - 1) F
// at p = 4, m = 8 (the "ideal" column, plan/simulator.h). The zero-bubble paper's "near zero" bubble is the
// steady state of steps run back to back without that synchronization (it validates the optimizer step after
// the fact), where one step's start skew overlaps the previous step's tail. The "b2b" columns measure that too:
// the same lists run --steps times in a row with no barrier between them (each rank starts its next step's list
// when it has finished its own), the time per step from the end of the first to the end of the last on the
// slowest rank, against 1F1B's measured the same way in the same job; "b2b sim" is the simulator's nominal figure
// for the same thing (three steps' lists joined, minus two). The b2b runs have no update at all between steps; a
// trained step's figure is the step column with clipping and the exact column without.
//
// The "exact" columns (1f1b, zb-h1, zb-h2: parallel/pipeline/sync_window.h) run the back-to-back window a trained
// exact step runs without clipping (train/sync_window_steps.h): --steps steps in one list per rank, each step's
// update U(t) inside it after the rank's last computation of the step and before its first of the next, and U(t)
// waiting only for the tied embedding's other copy (the last rank sends its copy, one float here, after its last
// input half of the step; rank 0 sends its own back at U(t)). Time per step: from the end of U(0) to the end of
// U(K-1) over K - 1, slowest rank; "/1f1b" against 1F1B's window run the same way; "exact sim" the replay of the
// window under that rule (plan/sync_window_sim.h, tied_wte_early) against 1F1B's. With clipping (the global norm
// before any update) no one-chunk list steps faster than (p - 1) F + m (F + B + W), the synchronized step's
// bound: the step column.
//
// pipedream-2bw runs without a flush (parallel/pipeline/no_flush.h): its --steps - 1 timed steps are one window
// (one list spanning them, the updates inside it costing nothing here; a first window of the same steps is not
// timed), against 1F1B's flushed steps; its bubble and step time are per window, its simulated columns replay
// the window.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/utsname.h>

#include "apps/meshtrain/commands.h"
#include "comm/launch.h"
#include "comm/shm/job.h"
#include "core/error.h"
#include "core/memory.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/no_flush.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/sync_window.h"
#include "plan/bubble.h"
#include "plan/simulator.h"
#include "plan/sync_window_sim.h"
#include "trace/chrome_trace.h"

namespace mt::cli {

namespace {

struct BenchPipelineArgs {
  int stages = 4, virtual_stages = 2, steps = 4;
  std::vector<std::string> schedules = pipeline::schedule_names();  // every registered generator
  std::vector<int> micro_batches;  // default: p and 2p
  double forward_ms = 20, backward_ratio = 2, activation_kb = 1024, comm_timeout = 120;
  double weight_share = 0.5;  // the weight half's share of a split backward (zero-bubble schedules)
  bool no_overrun_credit = false;  // each sleep on its own (its overrun paid per computation)
  bool message_copy = false;       // no forward_into / backward_into: the executor copies each output into its message
};

// Stage work as sleeps: forward F / V per chunk, backward R F / V (split: input half (1 - w) R F / V, weight half
// w R F / V); the activation is a real buffer. A sleep overruns its time by the host's timer slack and wake-up
// delay (0.1-1 ms each on the loaded 2-core guest), which a real computation does not: paid per computation, it
// would charge a list of 6m chunk computations per rank (zb-v) three times what 1F1B's 2m pay. So each sleep is
// shortened by what the rank's sleeps so far have overrun in all (never below zero), and a rank's emulated
// compute adds up to its nominal total however finely it is cut; --no-overrun-credit turns this off.
class SleepRunner : public pipeline::StageRunner {
 public:
  SleepRunner(const BenchPipelineArgs& a, int V, size_t n) : a_(a), V_(V), out_(n, 1.0f), grad_(n, 1.0f) {}
  size_t activation_count() const override { return out_.size(); }
  const float* forward(int, int, const float*) override {
    sleep_ms(a_.forward_ms / V_);
    return out_.data();
  }
  // A computation writes its output, here straight into the executor's message buffer (no copy at the send); the
  // write is part of the forward's nominal time, so the sleep is that much shorter.
  bool forward_into(int, int, const float*, float* out) override {
    if (a_.message_copy) return false;
    write_then_sleep(out, a_.forward_ms / V_);
    return true;
  }
  bool backward_into(int, int, const float*, bool input_half, float* out) override {
    if (a_.message_copy) return false;
    write_then_sleep(out, (input_half ? 1 - a_.weight_share : 1.0) * a_.backward_ratio * a_.forward_ms / V_);
    return true;
  }
  const float* backward(int, int, const float*) override {
    sleep_ms(a_.backward_ratio * a_.forward_ms / V_);
    return grad_.data();
  }
  const float* backward_input(int, int, const float*) override {
    sleep_ms((1 - a_.weight_share) * a_.backward_ratio * a_.forward_ms / V_);
    return grad_.data();
  }
  void backward_weight(int, int) override { sleep_ms(a_.weight_share * a_.backward_ratio * a_.forward_ms / V_); }

 private:
  void write_then_sleep(float* out, double ms) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    std::fill(out, out + out_.size(), 1.0f);
    sleep_ms(ms - std::chrono::duration<double, std::milli>(clock::now() - t0).count());
  }
  void sleep_ms(double ms) {
    using clock = std::chrono::steady_clock;
    const double want = a_.no_overrun_credit ? ms : std::max(0.0, ms - overrun_ms_);
    const auto t0 = clock::now();
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(want));
    const double got = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    overrun_ms_ = std::max(0.0, overrun_ms_ + got - ms);  // this computation's excess over its nominal time
  }
  const BenchPipelineArgs& a_;
  double overrun_ms_ = 0;  // what this rank's sleeps have overrun in all, not yet paid back
  int V_;
  std::vector<float> out_, grad_;
};

// The trained window's tie (train/sync_window_steps.h): the last rank sends its copy of the tied embedding's
// gradient (one float here) to rank 0 after its last input half (or whole backward) of each step; rank 0 sends
// its own back at its update. The runner wraps the sleeping one on every rank and sends on the last.
class TieSender : public pipeline::StageRunner {
 public:
  static constexpr int kTag = 1 << 30;  // beyond the executor's tags (kind, micro-batch, stage)
  TieSender(pipeline::StageRunner& r, comm::Communicator& world, int m)
      : r_(r), world_(world), m_(m), last_(world.size() > 1 && world.rank() == world.size() - 1) {}
  ~TieSender() override { req_.wait(); }
  size_t activation_count() const override { return r_.activation_count(); }
  const float* forward(int c, int i, const float* in) override { return r_.forward(c, i, in); }
  bool forward_into(int c, int i, const float* in, float* out) override { return r_.forward_into(c, i, in, out); }
  bool backward_into(int c, int i, const float* d, bool input_half, float* out) override {
    if (!r_.backward_into(c, i, d, input_half, out)) return false;
    sent(i);
    return true;
  }
  const float* backward(int c, int i, const float* d) override {
    const float* g = r_.backward(c, i, d);
    sent(i);
    return g;
  }
  const float* backward_input(int c, int i, const float* d) override {
    const float* g = r_.backward_input(c, i, d);
    sent(i);
    return g;
  }
  void backward_weight(int c, int i) override { r_.backward_weight(c, i); }
  // U(t): rank 0 sends its copy and receives the last rank's; the last rank receives rank 0's; others nothing.
  void update() {
    const int p = world_.size();
    if (p == 1) return;
    if (world_.rank() == 0) {
      req_.wait();
      req_ = world_.isend(&mine_, 1, comm::DType::f32, p - 1, kTag);
      world_.recv(&got_, 1, comm::DType::f32, p - 1, kTag);
    } else if (last_) {
      world_.recv(&got_, 1, comm::DType::f32, 0, kTag);
    }
  }

 private:
  void sent(int i) {
    if (!last_ || i % m_ != m_ - 1) return;
    req_.wait();
    req_ = world_.isend(&mine_, 1, comm::DType::f32, 0, kTag);
  }
  pipeline::StageRunner& r_;
  comm::Communicator& world_;
  int m_;
  bool last_;
  float mine_ = 1, got_ = 0;
  comm::Request req_;
};

// k copies of a step's lists run back to back as one list per rank: copy c's micro-batches numbered c m .. c m + m - 1,
// the step-end optimizer_step only after the last copy (for the simulator: the steps without a barrier between).
pipeline::Schedule back_to_back(const pipeline::Schedule& one, int m, int k) {
  pipeline::Schedule out{one.placement, pipeline::ActionLists(one.lists.size())};
  for (size_t j = 0; j < one.lists.size(); j++)
    for (int c = 0; c < k; c++)
      for (pipeline::Action a : one.lists[j]) {
        if (a.kind == pipeline::ActionKind::optimizer_step && a.micro_batch < 0 && c + 1 < k) continue;
        if (a.micro_batch >= 0) a.micro_batch += c * m;
        out.lists[j].push_back(a);
      }
  return out;
}

// The simulated time per step of lists run back to back (three steps minus two, so the first step's fill is out).
double simulated_back_to_back(const pipeline::ScheduleSpec& spec, const plan::CostModel& cost) {
  const pipeline::Schedule one = pipeline::make_schedule(spec);
  auto run = [&](int k) {
    pipeline::ScheduleSpec joined = spec;
    joined.micro_batches = k * spec.micro_batches;
    return plan::simulate(joined, back_to_back(one, spec.micro_batches, k), cost).makespan;
  };
  return run(3) - run(2);
}

// The simulated time per step of the exact back-to-back window as trained (no clipping: updates waiting for the
// tied embedding's other copy, sent after the last stage's last input half), K = 4.
double simulated_exact_window(const pipeline::ScheduleSpec& spec, const plan::CostModel& cost) {
  const int K = 4;
  return plan::simulate_sync_window(spec, K, pipeline::sync_window_schedule(spec, K), cost,
                                    plan::StepUpdateWait::tied_wte_early)
      .step();
}

// Every flag on its own, named, before any rank starts; then the memory the activations need against the machine.
void check_args(const BenchPipelineArgs& a, const std::vector<int>& ms) {
  MT_CHECK_INPUT(a.stages >= 1 && a.stages <= comm::shm::kMaxRanks, "--stages ", a.stages, " is out of range 1..",
                 comm::shm::kMaxRanks, " (one forked rank per stage)");
  MT_CHECK_INPUT(a.steps >= 2, "--steps must be >= 2 (the first is not timed), got ", a.steps);
  MT_CHECK_INPUT(a.virtual_stages >= 1, "--virtual-stages must be >= 1, got ", a.virtual_stages);
  for (int m : ms) MT_CHECK_INPUT(m >= 1, "--micro-batches must be >= 1, got ", m);
  // Upper bounds: a step sleeps about m x (1 + R) x F; beyond a minute per micro-batch nothing is measured.
  MT_CHECK_INPUT(a.forward_ms > 0 && a.forward_ms <= 60000, "--forward-ms must be in (0, 60000], got ", a.forward_ms);
  MT_CHECK_INPUT(a.backward_ratio >= 0 && a.backward_ratio <= 100, "--backward-ratio must be in [0, 100], got ",
                 a.backward_ratio);
  MT_CHECK_INPUT(a.weight_share >= 0 && a.weight_share <= 1, "--weight-share must be in [0, 1], got ",
                 a.weight_share);
  MT_CHECK_INPUT(a.activation_kb > 0 && std::isfinite(a.activation_kb), "--activation-kb must be finite and > 0, got ",
                 a.activation_kb);
  MT_CHECK_INPUT(a.comm_timeout > 0, "--comm-timeout must be > 0 seconds, got ", a.comm_timeout);
  // Each rank holds its output and gradient buffers and, per micro-batch and chunk in flight, up to an
  // activation received, a gradient received and a gradient sent (gpipe keeps all m in flight): about
  // (2 + 3 m V) activations per rank, p ranks.
  const int m_max = *std::max_element(ms.begin(), ms.end());
  const double bytes = a.activation_kb * 1024, need = bytes * a.stages * (2.0 + 3.0 * m_max * a.virtual_stages),
               avail = available_memory_bytes();
  MT_CHECK_INPUT(avail == 0 || need <= avail, "--activation-kb ", a.activation_kb, " needs about ", gib(need),
                 " (up to 2 + 3 x ", m_max, " micro-batches x ", a.virtual_stages, " chunks activations of ",
                 gib(bytes), " on each of ", a.stages, " ranks) but this machine has ", gib(avail),
                 " available (MemAvailable in /proc/meminfo); lower --activation-kb, --micro-batches or --stages");
}

void run_bench_pipeline(const BenchPipelineArgs& a) {
  const int p = a.stages;
  std::vector<int> ms = a.micro_batches.empty() ? std::vector<int>{p, 2 * p} : a.micro_batches;
  check_args(a, ms);
  struct utsname host {};
  uname(&host);
  std::printf("host: kernel %s %s (compute is emulated by sleeping: no instruction set involved)\n", host.release,
              host.machine);
  std::printf("pipeline executor with emulated compute: p = %d ranks, forward %.3g ms per rank, backward %.3g x "
              "(split: input half %.3g, weight half %.3g of it), activation %.0f KB, %d steps (first not timed), "
              "%s%s\n",
              p, a.forward_ms, a.backward_ratio, 1 - a.weight_share, a.weight_share, a.activation_kb, a.steps,
              a.no_overrun_credit ? "each sleep its full time (--no-overrun-credit)"
                                  : "sleeps credited with the rank's earlier overrun",
              a.message_copy ? ", outputs copied into their messages by the executor (--message-copy)" : "");
  std::printf("%-12s %3s %2s %9s %10s %9s %8s %8s %7s %7s %7s %9s %8s %9s %9s %8s %8s %9s %8s %9s\n", "schedule",
              "m", "V", "measured", "simulated", "nominal", "ideal", "diff pp", "msg ms", "send ms", "post ms",
              "step ms", "/1f1b", "sim 1/2", "b2b ms", "/1f1b", "b2b sim", "exact ms", "/1f1b", "exact sim");
  std::fflush(stdout);
  for (const std::string& name : a.schedules) {
    for (int m : ms) {
      // zb-v: two chunks in a V; chimera: one stage of each of its two pipelines
      const int V = name == "interleaved" ? a.virtual_stages : name == "zb-v" || name == "chimera" ? 2 : 1;
      const pipeline::ScheduleSpec spec{name, p, m, V};
      // Every registered schedule by default: one that cannot build this (p, m) (chimera: odd p or m) is skipped
      // with its reason; a schedule named in --schedules is refused.
      if (a.schedules == pipeline::schedule_names()) {
        try {
          pipeline::validate(spec);
        } catch (const InputError& e) {
          std::printf("%-12s %3d %2d skipped: %s\n", name.c_str(), m, V, e.what());
          continue;
        }
      }
      pipeline::validate(spec);
      // The peer of the ratio column: 1F1B at the same m, its steps alternating with this schedule's in the same
      // job, so a slower spell of the machine falls on both.
      const bool with_peer = name != "1f1b";
      const pipeline::ScheduleSpec peer{"1f1b", p, m, 1};
      comm::LaunchOptions lo;
      lo.nproc = p;
      lo.backend = "shm";
      lo.timeout_s = a.comm_timeout;
      const int rc = comm::launch(lo, [&](comm::Communicator& world) {
        const size_t n = (size_t)(a.activation_kb * 1024 / sizeof(float));
        // pipedream-2bw: the timed steps as one window without a flush (run twice: the first is not timed).
        const bool window = name == "pipedream-2bw";
        const int window_steps = a.steps - 1;
        const pipeline::ScheduleSpec run_spec = window ? pipeline::window_spec(spec, window_steps) : spec;
        const pipeline::Schedule lists =
            window ? pipeline::no_flush_schedule(spec, window_steps) : pipeline::make_schedule(spec);
        if (window) pipeline::check_no_flush(spec, window_steps, lists);
        const pipeline::Schedule peer_lists = with_peer ? pipeline::make_schedule(peer) : pipeline::Schedule{};
        // A chunk's share of the rank's forward F: 1 / V, or a whole stage when the placement holds each stage
        // twice (chimera: each micro-batch passes one of the rank's two chunks, F per stage as under 1F1B).
        SleepRunner runner(a, V / lists.placement.routes(), n), peer_runner(a, 1, n);
        pipeline::PipelineStats st, peer_st;
        pipeline::PipelineExecutor ex, peer_ex;
        for (int s = 0; s < a.steps; s++) {
          pipeline::PipelineStats one, peer_one;
          if (with_peer) {
            world.barrier();
            peer_ex.run(peer, peer_lists, world, peer_runner, &peer_one);
            if (s > 0) peer_st.add(peer_one);
          }
          world.barrier();  // steps start together, as after a training step's reductions
          if (window && s > 1) continue;  // its two windows ran
          ex.run(run_spec, lists, world, runner, &one);
          if (s > 0) st.add(one);
        }
        // Back to back: --steps runs of the lists with no barrier between them, 1F1B's block then this schedule's;
        // per rank, the time from the end of its first run to the end of its last, per step.
        auto back_to_back_ms = [&](const pipeline::ScheduleSpec& sp, const pipeline::Schedule& ls,
                                   pipeline::StageRunner& r, pipeline::PipelineExecutor& e) {
          world.barrier();
          double first = 0, last = 0;
          for (int s = 0; s < a.steps; s++) {
            e.run(sp, ls, world, r, nullptr);
            (s == 0 ? first : last) = trace::ChromeTrace::now_us();
          }
          return float((last - first) / 1e3 / (a.steps - 1));
        };
        const float b2b_peer = with_peer ? back_to_back_ms(peer, peer_lists, peer_runner, peer_ex) : 0.0f;
        const float b2b = back_to_back_ms(spec, lists, runner, ex);
        // The exact window as trained without clipping (train/sync_window_steps.h): one list of --steps steps,
        // each U(t) the tied copies' exchange between rank 0 and the last rank (TieSender).
        const bool exact = pipeline::sync_window_applies(spec);
        auto exact_window_ms = [&](const pipeline::ScheduleSpec& sp, pipeline::StageRunner& inner,
                                   pipeline::PipelineExecutor& e) {
          const pipeline::Schedule w = pipeline::sync_window_schedule(sp, a.steps);
          pipeline::check_sync_window(sp, a.steps, w);
          std::vector<double> ends;
          TieSender r(inner, world, sp.micro_batches);
          world.barrier();
          e.run(pipeline::window_spec(sp, a.steps), w, world, r, nullptr, nullptr, [&] {
            r.update();
            ends.push_back(trace::ChromeTrace::now_us());
          });
          MT_ASSERT((int)ends.size() == a.steps, "an exact window of ", a.steps, " steps ran ", ends.size(), " updates");
          return float((ends.back() - ends.front()) / 1e3 / (a.steps - 1));
        };
        const float exact_peer = exact && with_peer ? exact_window_ms(peer, peer_runner, peer_ex) : 0.0f;
        const float exact_mine = exact ? exact_window_ms(spec, runner, ex) : 0.0f;
        // Every rank's stats on rank 0: this schedule's, then the peer's.
        auto gather = [&](const pipeline::PipelineStats& mine_st, int chunks) {
          const size_t k = plan::packed_size(chunks);
          std::vector<float> mine(k), all(k * p);
          plan::pack(mine_st, chunks, mine.data());
          world.all_gather(mine.data(), all.data(), all.size(), comm::DType::f32);
          std::vector<pipeline::PipelineStats> ranks;
          for (int j = 0; j < p; j++) ranks.push_back(plan::unpack(&all[k * j], chunks));
          return ranks;
        };
        const std::vector<pipeline::PipelineStats> ranks = gather(st, V);
        const std::vector<pipeline::PipelineStats> peer_ranks = with_peer ? gather(peer_st, 1) : ranks;
        // The slowest rank's back-to-back step, this schedule's and the peer's.
        float mine_b2b[4] = {b2b, with_peer ? b2b_peer : b2b, exact_mine, with_peer ? exact_peer : exact_mine};
        std::vector<float> all_b2b(4 * (size_t)p);
        world.all_gather(mine_b2b, all_b2b.data(), all_b2b.size(), comm::DType::f32);
        double b2b_ms = 0, b2b_peer_ms = 0, exact_ms = 0, exact_peer_ms = 0;
        for (int j = 0; j < p; j++) {
          b2b_ms = std::max(b2b_ms, (double)all_b2b[4 * j]);
          b2b_peer_ms = std::max(b2b_peer_ms, (double)all_b2b[4 * j + 1]);
          exact_ms = std::max(exact_ms, (double)all_b2b[4 * j + 2]);
          exact_peer_ms = std::max(exact_peer_ms, (double)all_b2b[4 * j + 3]);
        }
        if (world.rank() != 0) return;
        plan::BubbleReport b = plan::bubble_report(run_spec, ranks, true);
        plan::CostModel nominal_cost;
        nominal_cost.forward = a.forward_ms;
        nominal_cost.backward_ratio = a.backward_ratio;
        nominal_cost.weight_share = a.weight_share;
        double nominal = plan::simulate(spec, nominal_cost).bubble_fraction;
        if (window) {  // the window's own list (make_schedule(run_spec) is 2BW's flushed list over K m micro-batches)
          const pipeline::Schedule flat = pipeline::without_step_updates(lists);
          b.simulated = plan::simulate(run_spec, flat, b.cost).bubble_fraction;
          nominal = plan::simulate(run_spec, flat, nominal_cost).bubble_fraction;
        }
        // The step time: the longest rank's span, per timed step.
        auto step_ms = [&](const std::vector<pipeline::PipelineStats>& rs) {
          double span_us = 0;
          for (const pipeline::PipelineStats& r : rs) span_us = std::max(span_us, r.span_us);
          return span_us / 1e3 / (a.steps - 1);  // a window: one list of a.steps - 1 steps
        };
        // Last column: the simulation with each measured backward split in halves by assumption (split schedules).
        char half[16] = "-";
        if (b.simulated_half_split >= 0) std::snprintf(half, sizeof half, "%.1f%%", 100 * b.simulated_half_split);
        // The simulator's back-to-back step against 1F1B's, both with the nominal times.
        const double b2b_sim =
            simulated_back_to_back(spec, nominal_cost) / simulated_back_to_back(peer, nominal_cost);
        char exact_cols[64] = "        -        -         -";
        if (exact)
          std::snprintf(exact_cols, sizeof exact_cols, "%9.1f %8.3f %9.3f", exact_ms, exact_ms / exact_peer_ms,
                        simulated_exact_window(spec, nominal_cost) / simulated_exact_window(peer, nominal_cost));
        std::printf("%-12s %3d %2d %8.1f%% %9.1f%% %8.1f%% %7.1f%% %+8.1f %7.2f %7.2f %7.2f %9.1f %8.3f %8s %9.1f %8.3f "
                    "%8.3f %s\n",
                    name.c_str(), m, V, 100 * b.measured, 100 * b.simulated, 100 * nominal, 100 * b.ideal,
                    100 * (b.measured - b.simulated), b.cost.comm, b.cost.send, b.cost.post, step_ms(ranks),
                    step_ms(ranks) / step_ms(peer_ranks), half, b2b_ms, b2b_ms / b2b_peer_ms, b2b_sim, exact_cols);
        if (std::getenv("MESHTRAIN_BENCH_DEBUG"))
          for (int j = 0; j < p; j++)
            std::printf("   rank %d: span %.1f busy %.1f wait %.1f send %.1f post %.1f other %.1f ms\n", j,
                        ranks[j].span_us / 1e3, (ranks[j].forward_us + ranks[j].backward_us) / 1e3,
                        ranks[j].wait_us / 1e3, ranks[j].send_us / 1e3, ranks[j].post_us / 1e3,
                        (ranks[j].span_us - ranks[j].forward_us - ranks[j].backward_us - ranks[j].wait_us -
                         ranks[j].send_us - ranks[j].post_us) / 1e3);
        std::fflush(stdout);
      });
      if (rc != 0) throw Error(str("bench pipeline: ", name, " m=", m, " failed"));
    }
  }
}

}  // namespace

void add_bench_pipeline_command(CLI::App& bench) {
  auto a = std::make_shared<BenchPipelineArgs>();
  CLI::App* sub = bench.add_subcommand(
      "pipeline", "pipeline executor on real ranks with emulated (sleeping) stage compute vs the simulator");
  sub->add_option("--stages", a->stages, "p: pipeline ranks (forked, shared memory)")->capture_default_str();
  sub->add_option("--schedules", a->schedules, "which schedules")->delimiter(',')->capture_default_str();
  sub->add_option("--micro-batches", a->micro_batches, "m values (default p and 2p)")->delimiter(',');
  sub->add_option("--virtual-stages", a->virtual_stages, "V for interleaved (zb-v and chimera run 2)")->capture_default_str();
  sub->add_option("--forward-ms", a->forward_ms, "forward time of one rank's share per micro-batch")
      ->capture_default_str();
  sub->add_option("--backward-ratio", a->backward_ratio, "backward / forward")->capture_default_str();
  sub->add_option("--weight-share", a->weight_share,
                  "w: the weight half's share of a split backward (zero-bubble schedules; the input half takes 1 - w)")
      ->capture_default_str();
  sub->add_option("--activation-kb", a->activation_kb, "size of each activation message")->capture_default_str();
  sub->add_option("--steps", a->steps, "steps per configuration (the first is not timed)")->capture_default_str();
  sub->add_option("--comm-timeout", a->comm_timeout, "deadline of every wait (s)")->capture_default_str();
  sub->add_flag("--no-overrun-credit", a->no_overrun_credit,
                "sleep each computation's full time (by default a sleep is shortened by what the rank's earlier "
                "sleeps overran, so emulated compute adds up to its nominal total)");
  sub->add_flag("--message-copy", a->message_copy,
                "the emulated forward and backward keep their outputs in buffers of their own and the executor copies "
                "them into the messages, as for a runner without forward_into / backward_into (A/B of that path)");
  sub->callback([a] { run_bench_pipeline(*a); });
}

}  // namespace mt::cli
