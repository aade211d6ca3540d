#include "trace/chrome_trace.h"

#include <sys/stat.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/fs.h"

namespace mt::trace {

void ChromeTrace::add(Track track, std::string name, const char* category, double t0_us, double t1_us) {
  if (!enabled_) return;
  events_.push_back({track, std::move(name), category, t0_us, t1_us});
}

std::string ChromeTrace::events_json() const {
  std::string out;
  auto meta = [&](const char* what, int tid, const std::string& name) {
    nlohmann::json m = {{"ph", "M"}, {"name", what}, {"pid", rank_}, {"tid", tid}, {"args", {{"name", name}}}};
    if (!out.empty()) out += ",\n";
    out += m.dump();
  };
  meta("process_name", 0, "rank " + std::to_string(rank_));
  meta("thread_name", 0, "compute");
  meta("thread_name", 1, "comm");
  meta("thread_name", 2, "p2p");
  meta("thread_name", 3, "io");
  for (const Event& e : events_) {
    nlohmann::json j = {{"name", e.name}, {"cat", e.category}, {"ph", "X"},           {"ts", e.t0},
                        {"dur", e.t1 - e.t0}, {"pid", rank_},    {"tid", (int)e.track}};
    out += ",\n" + j.dump();
  }
  return out;
}

void ChromeTrace::write_merged(const std::string& path, const std::vector<std::string>& bodies) {
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  for (const std::string& b : bodies) {
    if (b.empty()) continue;
    if (!first) out += ",\n";
    out += b;
    first = false;
  }
  out += "\n]}\n";
  write_file_atomic(path, out);
}

std::string trace_part_path(const std::string& target, int rank) {
  struct stat st;
  if (::stat(target.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    const std::string key = std::to_string((unsigned long long)st.st_dev) + "." + std::to_string((unsigned long long)st.st_ino);
    return (std::filesystem::temp_directory_path() / ("meshtrain_trace." + key + ".rank" + std::to_string(rank))).string();
  }
  return target + ".rank" + std::to_string(rank);
}

}  // namespace mt::trace
