#include "trace/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace mt::trace {

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  MT_CHECK_INPUT(f_, "cannot open metrics file ", path, ": ", std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::write(const nlohmann::json& row) {
  if (!f_) return;
  std::string line = row.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
    throw Error(str("cannot write metrics file ", path_, ": ", std::strerror(errno)));
}

namespace {
std::string format_duration(double s) {
  if (s < 0 || s > 1e7) return "?";
  long t = (long)(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}
}  // namespace

Progress::Progress(int64_t first_step, int64_t total_steps, int every, bool enabled)
    : first_(first_step),
      total_(total_steps),
      every_(every < 1 ? 1 : every),
      enabled_(enabled),
      tty_(isatty(STDERR_FILENO)),
      start_(std::chrono::steady_clock::now()) {}

void Progress::step(int64_t step, double loss, float lr, double tokens_per_s, const std::string& extra) {
  if (!enabled_) return;
  bool last = step + 1 == total_;
  if (!tty_ && !last && (step + 1) % every_ != 0 && step != first_) return;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  int64_t done = step + 1 - first_;
  double eta = done > 0 ? elapsed / done * (double)(total_ - step - 1) : -1;
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f | lr %.2e | %.0f tok/s | eta %s%s",
                (long long)step + 1, (long long)total_, loss, lr, tokens_per_s, format_duration(eta).c_str(),
                extra.c_str());
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", buf);
    dirty_ = true;
  } else {
    std::fprintf(stderr, "%s\n", buf);
  }
  std::fflush(stderr);
}

void Progress::message(const std::string& line) {
  if (!enabled_) return;
  if (dirty_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s\n", line.c_str());
  dirty_ = false;
}

void Progress::finish() {
  if (enabled_ && dirty_) std::fprintf(stderr, "\n");
  dirty_ = false;
}

}  // namespace mt::trace
