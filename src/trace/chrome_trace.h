// Chrome trace events (the JSON that Perfetto and chrome://tracing open): one process track per rank,
// threads "compute", "comm" (collectives), "p2p" (pipeline sends and receives) and "io" (offload tiers' reads
// and writes, recorded on their I/O thread and added by the main thread). Each rank records in memory; at the end every rank writes its part and
// rank 0 merges them into one file. Times are CLOCK_MONOTONIC microseconds, shared by all processes of a
// host, so the ranks' tracks line up.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace mt::trace {

enum class Track : int { compute = 0, comm = 1, p2p = 2, io = 3 };

class ChromeTrace {
 public:
  static double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  void enable(int rank) {
    enabled_ = true;
    rank_ = rank;
  }
  bool enabled() const { return enabled_; }
  // A complete event [t0, t1) on a track.
  void add(Track track, std::string name, const char* category, double t0_us, double t1_us);
  // This rank's events as a JSON array body (no brackets), for merging.
  std::string events_json() const;
  // Writes {"traceEvents": [...]} from the given per-rank bodies, atomically.
  static void write_merged(const std::string& path, const std::vector<std::string>& bodies);

 private:
  struct Event {
    Track track;
    std::string name;
    const char* category;
    double t0, t1;
  };
  bool enabled_ = false;
  int rank_ = 0;
  std::vector<Event> events_;
};

// RAII: an event on the compute track from construction to destruction.
class TraceScope {
 public:
  TraceScope(ChromeTrace* t, std::string name, const char* category)
      : t_(t && t->enabled() ? t : nullptr), name_(std::move(name)), cat_(category), t0_(ChromeTrace::now_us()) {}
  ~TraceScope() {
    if (t_) t_->add(Track::compute, std::move(name_), cat_, t0_, ChromeTrace::now_us());
  }

 private:
  ChromeTrace* t_;
  std::string name_;
  const char* cat_;
  double t0_;
};

// Where rank r writes its events before rank 0 merges them into `target`: `target.rankR` beside a regular
// (or new) target; for a device or FIFO target (--trace /dev/null) in the temp directory, named by the
// target's device and inode, instead of creating files in /dev. Every rank computes the same names.
std::string trace_part_path(const std::string& target, int rank);

}  // namespace mt::trace
