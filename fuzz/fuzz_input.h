// Shared by the fuzz targets: the readers take paths (they map or read whole files), so each input is
// written to a scratch file first. One scratch directory per process, removed at exit.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace mt::fuzz {

// The process's scratch directory under $TMPDIR (or /tmp), created on first use.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* t = std::getenv("TMPDIR");
    std::filesystem::path d = std::filesystem::path(t && *t ? t : "/tmp") /
                              ("meshtrain_fuzz." + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return dir;
}

// Writes bytes to scratch_dir()/name (replacing it) and returns the path.
inline std::string write_input(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = (scratch_dir() / name).string();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

// Splits an input into n parts: each part but the last is preceded by a 2-byte little-endian length
// (clamped to what is left), so one input can hold several files (a checkpoint's three, a run's three).
struct Parts {
  const uint8_t* data;
  size_t size;
  std::string next(bool last) {
    size_t n = size;
    if (!last) {
      n = size >= 2 ? size_t(data[0]) | size_t(data[1]) << 8 : 0;
      const size_t skip = size >= 2 ? 2 : size;
      data += skip;
      size -= skip;
      if (n > size) n = size;
    }
    std::string out(reinterpret_cast<const char*>(data), n);
    data += n;
    size -= n;
    return out;
  }
};

}  // namespace mt::fuzz
