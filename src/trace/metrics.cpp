#include "trace/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/fs.h"

namespace mt::trace {

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
  MT_CHECK_INPUT(fd >= 0, "cannot open metrics file ", path, ": ",
                 errno == ENXIO ? "no process is reading the FIFO" : std::strerror(errno));
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  fd_ = fd;
}

MetricsWriter MetricsWriter::resume_at(const std::string& path, int64_t step) {
  if (file_kind(path) == "regular file") {
    std::string kept, all = read_file(path);
    size_t pos = 0;
    while (pos < all.size()) {
      size_t end = all.find('\n', pos);
      if (end == std::string::npos) break;  // a torn last line (the crash): dropped
      const std::string line = all.substr(pos, end - pos);
      pos = end + 1;
      nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (row.is_object() && row.contains("step") && row["step"].is_number_integer() &&
          row["step"].get<int64_t>() < step)
        kept += line + "\n";
    }
    if (kept.size() != all.size()) write_file_atomic(path, kept);
  }
  return MetricsWriter(path, /*append=*/true);
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsWriter::write(const nlohmann::json& row) {
  if (fd_ < 0) return;
  const std::string line = row.dump() + "\n";
  // Where the row starts (-1 on a FIFO or device, which cannot be cut back).
  const off_t start = ::lseek(fd_, 0, SEEK_END);
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n > 0) {
      done += (size_t)n;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      const int err = n < 0 ? errno : ENOSPC;  // 0 bytes written: the device took nothing
      // Part of the row may be on disk (a full disk takes what fits): cut it off, so the file holds whole rows.
      const bool cut = start >= 0 && done > 0 && ::ftruncate(fd_, start) == 0;
      throw Error(str("cannot write metrics file ", path_, ": ", std::strerror(err),
                      done == 0 || cut ? " (the row was not written; the file ends with whole rows)"
                                       : " (a partial row was written)"));
    }
  }
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

Progress::Progress(int64_t first_step, int64_t total_steps, int every, bool enabled, const char* unit)
    : first_(first_step),
      total_(total_steps),
      every_(every < 1 ? 1 : every),
      unit_(unit),
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
  std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f | lr %.2e | %.0f %s/s | eta %s%s",
                (long long)step + 1, (long long)total_, loss, lr, tokens_per_s, unit_.c_str(),
                format_duration(eta).c_str(), extra.c_str());
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
