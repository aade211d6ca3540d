#include "train/elastic.h"

#include <cstdio>
#include <filesystem>
#include <system_error>

#include "checkpoint/checkpoint.h"
#include "core/error.h"

namespace mt::train {

namespace {

std::string list(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); i++) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

// The most ranks in [lo, hi] the flags accept with dp derived (world / (tp * pp)); 0 when none.
int fewer_ranks(TrainConfig& c, int hi, int lo, std::string* last_error) {
  for (int n = hi; n >= lo && n >= 1; n--) {
    c.nproc = n;
    c.dp = 0;
    try {
      c.validate(n);
      return n;
    } catch (const InputError& e) {
      *last_error = str(n, " ranks: ", e.what());
    }
  }
  return 0;
}

}  // namespace

std::string flight_file(const TrainConfig& cfg) { return cfg.metrics.empty() ? "" : cfg.metrics + ".flight.json"; }

RestartPlan plan_restart(const TrainConfig& failed, const comm::LaunchResult& r, int restarts_done) {
  RestartPlan p;
  if (r.exit_code == 0 || failed.max_restarts == 0) return p;  // no restarts asked for: nothing to say
  if (r.exit_code >= 128) {
    p.message = "interrupted: not restarted";
    return p;
  }
  if (restarts_done >= failed.max_restarts) {
    p.message = str("giving up after ", restarts_done, " restart(s) (--max-restarts ", failed.max_restarts, ")");
    return p;
  }
  p.next = failed;
  std::string ranks_note;
  if (!r.lost_ranks.empty()) {
    const int left = failed.nproc - static_cast<int>(r.lost_ranks.size());
    const std::string lost = str("the place of rank(s) ", list(r.lost_ranks), " is lost");
    if (failed.min_nproc == 0) {
      p.message = str(lost, " and --min-nproc is not given: not restarted with fewer ranks");
      return p;
    }
    std::string why;
    const int n = fewer_ranks(p.next, left, failed.min_nproc, &why);
    if (n == 0) {
      p.message = str(lost, ", and no number of ranks from ", left, " down to --min-nproc ", failed.min_nproc,
                      " fits the flags (", why, "): not restarted");
      return p;
    }
    ranks_note = str(" (", lost, "; ", left, " left, ", n, " used)");
  }
  std::string from = "from the start (no complete checkpoint yet)";
  try {
    const std::string path = checkpoint::resolve_checkpoint(failed.checkpoint_dir);
    p.next.resume = failed.checkpoint_dir;
    from = str("from ", path);
  } catch (const InputError&) {
    // Nothing complete in --checkpoint-dir: the first attempt's own start again (its --resume, if any).
    if (failed.resume.empty()) p.next.overwrite_checkpoints = true;  // what is there, that attempt wrote
  }
  p.restart = true;
  p.message = str("restart ", restarts_done + 1, " of ", failed.max_restarts, ": ", from, " with ", p.next.nproc,
                  " rank(s)", ranks_note);
  return p;
}

int run_elastic(const TrainConfig& cfg,
                const std::function<comm::LaunchResult(const TrainConfig&, bool first)>& attempt) {
  TrainConfig c = cfg;
  for (int done = 0;; done++) {
    const comm::LaunchResult r = attempt(c, done == 0);
    if (r.exit_code == 0) {
      // A restart finished the job: the rings of the failure it recovered from go (an unbroken job wrote none).
      if (done > 0 && !flight_file(c).empty()) {
        std::error_code ec;
        std::filesystem::remove(flight_file(c), ec);
        if (ec)
          std::fprintf(stderr, "meshtrain: could not remove %s after the restart finished: %s\n",
                       flight_file(c).c_str(), ec.message().c_str());
      }
      return 0;
    }
    RestartPlan p = plan_restart(c, r, done);
    if (!p.message.empty()) std::fprintf(stderr, "meshtrain: %s\n", p.message.c_str());
    if (!p.restart) return r.exit_code;
    p.next.max_restarts = cfg.max_restarts;
    c = std::move(p.next);
  }
}

}  // namespace mt::train
