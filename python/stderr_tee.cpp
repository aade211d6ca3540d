#include "stderr_tee.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace mt::py {

StderrTee::StderrTee() {
  int fds[2];
  std::fflush(stderr);
  MT_REQUIRE(Error, ::pipe2(fds, O_CLOEXEC) == 0, "cannot create a pipe to capture stderr: ", std::strerror(errno));
  saved_fd_ = ::fcntl(2, F_DUPFD_CLOEXEC, 3);
  if (saved_fd_ < 0 || ::dup2(fds[1], 2) < 0) {
    const int e = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    if (saved_fd_ >= 0) ::close(saved_fd_);
    throw Error(str("cannot redirect stderr to capture it: ", std::strerror(e)));
  }
  ::close(fds[1]);  // fd 2 is now the only write end (dup2 clears O_CLOEXEC on it: forked ranks inherit it)
  read_fd_ = fds[0];
  reader_ = std::thread([this] { read_loop(); });
}

StderrTee::~StderrTee() { stop(); }

void StderrTee::read_loop() {
  char buf[4096];
  for (;;) {
    pollfd p = {read_fd_, POLLIN, 0};
    const int n = ::poll(&p, 1, 100);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      if (stopping_.load()) return;  // drained, and nobody is writing: done
      continue;
    }
    const ssize_t got = ::read(read_fd_, buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return;  // EOF: every write end is closed
    for (ssize_t off = 0; off < got;) {
      const ssize_t w = ::write(saved_fd_, buf + off, size_t(got - off));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;  // the real stderr is gone: keep capturing anyway
      off += w;
    }
    std::lock_guard<std::mutex> lock(mu_);
    kept_.append(buf, size_t(got));
    if (kept_.size() > 2 * kKeep) kept_.erase(0, kept_.size() - kKeep);
  }
}

void StderrTee::stop() {
  if (stopped_) return;
  stopped_ = true;
  std::fflush(stderr);
  ::dup2(saved_fd_, 2);  // closes the pipe's write end held as fd 2
  stopping_.store(true);
  reader_.join();
  ::close(read_fd_);
  ::close(saved_fd_);
}

std::string StderrTee::last_line_starting(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string found;
  size_t start = 0;
  while (start < kept_.size()) {
    size_t end = kept_.find('\n', start);
    if (end == std::string::npos) end = kept_.size();
    if (kept_.compare(start, prefix.size(), prefix) == 0) found = kept_.substr(start, end - start);
    start = end + 1;
  }
  return found;
}

}  // namespace mt::py
