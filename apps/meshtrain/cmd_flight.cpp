// meshtrain flight: after a job under mpirun has failed, gathers the ranks' flight recorder rings (each rank wrote
// its own, M.flight.rank<R>.json, src/comm/mpi/mpi_flight.h) into the verdict the shm launcher prints, writes the
// combined M.flight.json and removes the per-rank files. scripts/hosts.sh runs it after a failed mpirun.
#include <cstdio>
#include <string>

#include "apps/meshtrain/commands.h"
#include "comm/flight_files.h"
#include "core/error.h"

namespace mt::cli {

void add_flight_command(CLI::App& app) {
  struct Args {
    std::string metrics;
    bool keep = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "flight", "after a failed job under mpirun: gather the ranks' flight recorder rings into the verdict");
  sub->add_option("--metrics", a->metrics, "the job's --metrics path M (rings: M.flight.rank<R>.json)")->required();
  sub->add_flag("--keep", a->keep, "keep the per-rank files");
  sub->callback([a] {
    const std::string combined = a->metrics + ".flight.json";
    const comm::flight::Gathered g = comm::flight::gather_rank_files(combined);
    if (g.size == 0) {
      std::fprintf(stderr,
                   "meshtrain flight: no rank wrote a ring (%s): the job did not fail, or it ran without "
                   "--metrics %s, or every rank was killed before writing\n",
                   comm::flight::rank_file_path(combined, 0).c_str(), a->metrics.c_str());
      throw CLI::RuntimeError(1);
    }
    comm::flight::write_flight_file(combined, g.views, g.verdict.line);
    // The headline, the likeliest cause first: a rank that wrote no ring (SIGKILLed: mpirun then ended the rest,
    // whose rings show them waiting or ended by SIGTERM), else a rank that failed by itself (an error that is not a
    // timeout, e.g. a full disk: the others then time out waiting for it), else the first rank that timed out and
    // whom it waited for (as the shm launcher prints it); when the waits all cross one link and no rank died, the
    // link (flight_verdict.h's rule) comes before that.
    int cause = -1, first = -1;
    for (int r = 0; r < g.size; r++) {
      if (cause < 0 && g.views[r].fate == "failed") cause = r;
      if (first < 0 && g.waited[r] >= 0) first = r;
    }
    if (!g.missing.empty()) {
      std::printf("meshtrain: rank %d (host %s) ended without writing its ring (killed, stopped, or cut off)\n",
                  g.missing[0], g.views[g.missing[0]].host.empty() ? "?" : g.views[g.missing[0]].host.c_str());
    } else if (cause >= 0) {
      std::printf("meshtrain: rank %d (host %s) failed: %s\n", cause, g.views[cause].host.c_str(),
                  g.errors[cause].c_str());
    } else if (!g.verdict.link.empty()) {  // every wait crosses one link (flight_verdict.h), no rank died
      std::printf("meshtrain: %s\n", g.verdict.link.c_str());
    } else if (first >= 0) {
      std::printf(
          "meshtrain: rank %d (host %s) did not respond within --comm-timeout: rank %d timed out waiting "
          "for it: %s\n",
          g.waited[first], g.views[g.waited[first]].host.c_str(), first, g.errors[first].c_str());
    }
    std::printf("  flight recorder: %s\n", g.verdict.line.c_str());
    // Every timed-out wait, with both hosts: waits that all cross between two hosts point at the link.
    for (int r = 0; r < g.size; r++) {
      const int w = g.waited[r];
      if (w < 0 || w >= g.size) continue;
      const int at = comm::flight::position(g.views[r].ops);
      std::printf("  rank %d (host %s) timed out waiting for rank %d (host %s)%s%s\n", r, g.views[r].host.c_str(), w,
                  g.views[w].host.c_str(), at >= 0 ? " in " : "",
                  at >= 0 ? comm::flight::describe_op(g.views[r].ops[at]).c_str() : "");
    }
    for (int r = 0; r < g.size; r++)  // other failures (a peer's death seen by MPI, a mismatch, a full disk)
      if (g.waited[r] < 0 && !g.errors[r].empty())
        std::printf("  rank %d (host %s): %s\n", r, g.views[r].host.c_str(), g.errors[r].c_str());
    for (int r : g.missing)
      std::printf("  rank %d (host %s) wrote no ring\n", r, g.views[r].host.empty() ? "?" : g.views[r].host.c_str());
    std::printf("  rings of %d rank(s) in %s\n", g.size - static_cast<int>(g.missing.size()), combined.c_str());
    if (!a->keep)
      for (int r = 0; r < g.size; r++) std::remove(comm::flight::rank_file_path(combined, r).c_str());
  });
}

}  // namespace mt::cli
