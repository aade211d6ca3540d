// meshtrain simulate: replays a pipeline schedule's action lists under the cost model, prints utilization
// and bubble fraction (beside the closed form for gpipe and 1f1b), optionally the per-rank action lists,
// and writes the swimlane diagram as SVG.
#include <cstdio>

#include "apps/meshtrain/commands.h"
#include "core/fs.h"
#include "parallel/pipeline/schedule.h"
#include "plan/simulator.h"
#include "trace/swimlane_svg.h"

namespace mt::cli {

void add_simulate_command(CLI::App& app) {
  struct Args {
    pipeline::ScheduleSpec spec{"1f1b", 4, 8, 1};
    plan::CostModel cost;
    std::string svg;
    bool actions = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("simulate", "simulate a pipeline schedule: utilization, bubble, swimlane SVG");
  sub->add_option("--schedule", a->spec.name, "gpipe | 1f1b | interleaved")->capture_default_str();
  sub->add_option("--stages", a->spec.stages, "pipeline ranks p")->capture_default_str();
  sub->add_option("--micro-batches", a->spec.micro_batches, "micro-batches m")->capture_default_str();
  sub->add_option("--virtual-stages", a->spec.virtual_stages, "chunks per rank V (interleaved)")->capture_default_str();
  sub->add_option("--backward-ratio", a->cost.backward_ratio, "backward time / forward time")->capture_default_str();
  sub->add_option("--comm", a->cost.comm, "message latency, in units of one stage's forward")->capture_default_str();
  sub->add_option("--svg", a->svg, "write the swimlane diagram here");
  sub->add_flag("--actions", a->actions, "print each rank's action list");
  sub->callback([a] {
    auto lists = pipeline::make_schedule(a->spec);
    pipeline::check_schedule(a->spec, lists);
    plan::Simulation sim = plan::simulate(a->spec, lists, a->cost);
    const auto& sp = a->spec;
    std::printf("schedule %s, p=%d, m=%d, V=%d, backward/forward %.3g, comm %.3g\n", sp.name.c_str(), sp.stages,
                sp.micro_batches, sp.virtual_stages, a->cost.backward_ratio, a->cost.comm);
    std::printf("makespan %.4g, busy %.4g of %.4g rank-time\n", sim.makespan, sim.busy, sim.makespan * sp.stages);
    std::printf("utilization %.1f%%, bubble fraction %.4f", 100 * sim.utilization, sim.bubble);
    if (sp.name != "interleaved")
      std::printf(" (closed form (p-1)/(m+p-1) = %.4f)", (double)(sp.stages - 1) / (sp.micro_batches + sp.stages - 1));
    std::printf("\n");
    if (a->actions) {
      for (size_t j = 0; j < lists.size(); j++) {
        std::printf("rank %zu:", j);
        for (const auto& x : lists[j]) {
          if (x.kind == pipeline::ActionKind::forward || x.kind == pipeline::ActionKind::backward)
            std::printf(" %c%d", x.kind == pipeline::ActionKind::forward ? 'F' : 'B', x.micro_batch);
          else
            std::printf(" %s(%d>%d)", pipeline::action_name(x.kind), x.micro_batch, x.peer);
          if (sp.virtual_stages > 1) std::printf(".%d", x.chunk);
        }
        std::printf("\n");
      }
    }
    if (!a->svg.empty()) {
      char title[160];
      std::snprintf(title, sizeof title, "%s  p=%d m=%d V=%d  utilization %.1f%%  bubble %.3f", sp.name.c_str(),
                    sp.stages, sp.micro_batches, sp.virtual_stages, 100 * sim.utilization, sim.bubble);
      write_file_atomic(a->svg, trace::swimlane_svg(sim, title, sp.virtual_stages > 1));
      std::printf("wrote %s\n", a->svg.c_str());
    }
  });
}

}  // namespace mt::cli
