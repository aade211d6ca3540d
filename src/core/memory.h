// Process memory as the kernel reports it.
#pragma once

#include <cstddef>
#include <cstdio>
#include <fstream>
#include <string>

namespace mt {

// Peak resident set size of this process (VmHWM), in bytes; 0 where /proc is unavailable.
inline size_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

// Resident set size of this process now (VmRSS), in bytes; 0 where /proc is unavailable.
inline size_t current_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

// Memory the kernel estimates can be given to new allocations without swapping (MemAvailable in
// /proc/meminfo), in bytes; 0 where unknown (then callers skip their check).
inline double available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("MemAvailable:", 0) == 0) return std::stod(line.substr(13)) * 1024;
  return 0;
}

// "12.3 GiB": a byte count for messages.
inline std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
  return buf;
}

}  // namespace mt
