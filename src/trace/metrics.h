// Per-step metrics as JSON lines, and the terminal progress line.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace mt::trace {

// Appends one JSON object per line with one write(2) each, so a crash loses at most the current line; a
// failed write (a full disk) truncates a regular file back to its last whole row before throwing.
class MetricsWriter {
 public:
  MetricsWriter() = default;
  // append = false truncates the file. Throws mt::InputError naming the path if it cannot be opened. Opens
  // without blocking, so a FIFO nobody reads is an error at once; devices (/dev/null) are written in place.
  MetricsWriter(const std::string& path, bool append);
  // For a run resumed at `step`: rewrites the file (atomically, when it is a regular file) without the rows
  // of steps >= step and of any torn last line, so that after a crash and resume it reads as one run; then
  // appends. Costs one read and one write of the file at start.
  static MetricsWriter resume_at(const std::string& path, int64_t step);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  MetricsWriter(MetricsWriter&& o) noexcept : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}
  MetricsWriter& operator=(MetricsWriter&& o) noexcept {
    std::swap(fd_, o.fd_);
    std::swap(path_, o.path_);
    return *this;
  }
  // The row and its newline, or nothing: throws mt::Error naming the file and the errno text otherwise.
  void write(const nlohmann::json& row);
  bool enabled() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
  std::string path_;
};

// "step 12/100 | loss 3.2145 | lr 3.00e-04 | 1,234 tok/s | eta 1m20s" on stderr: redrawn in place on a
// terminal, one line every `every` steps (and the last) otherwise.
class Progress {
 public:
  // unit: what the throughput counts ("tok" for GPT, "ex" for the MLP's examples).
  Progress(int64_t first_step, int64_t total_steps, int every, bool enabled, const char* unit = "tok");
  void step(int64_t step, double loss, float lr, double tokens_per_s, const std::string& extra = "");
  void message(const std::string& line);  // a line of its own (eval results), not overwritten
  void finish();

 private:
  int64_t first_, total_;
  int every_;
  std::string unit_;
  bool enabled_, tty_, dirty_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace mt::trace
