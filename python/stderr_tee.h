// StderrTee: while alive, whatever is written to file descriptor 2 (by this process and by the ranks it forks,
// which inherit it) still reaches the real stderr at once and is also kept, so that a failure the CLI reports
// only as a line on stderr ("meshtrain: rank 1 failed: ...") can become the message of a Python exception.
//
// fd 2 is pointed at a pipe; a reader thread copies the pipe to the saved stderr and into a buffer (the last
// kKeep bytes). The reader never blocks the caller: stop() restores fd 2, then lets the reader drain what is in
// the pipe and end after 100 ms without data, even if some process still holds the pipe's write end.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <thread>

namespace mt::py {

class StderrTee {
 public:
  StderrTee();  // throws mt::Error when the pipe or the dup fails
  ~StderrTee();
  StderrTee(const StderrTee&) = delete;
  StderrTee& operator=(const StderrTee&) = delete;

  // Restores fd 2 and joins the reader; idempotent.
  void stop();
  // The last line starting with `prefix` in what was written (without the newline); "" if none.
  std::string last_line_starting(const std::string& prefix);

 private:
  static constexpr size_t kKeep = 1 << 16;
  void read_loop();

  int read_fd_ = -1, saved_fd_ = -1;
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;
  std::mutex mu_;
  std::string kept_;
  std::thread reader_;
};

}  // namespace mt::py
