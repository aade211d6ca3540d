// Process memory as the kernel reports it.
#pragma once

#include <cstddef>
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

}  // namespace mt
