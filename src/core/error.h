// Errors. Two kinds, kept apart on purpose:
//  - a broken invariant is a bug in meshtrain: MT_ASSERT prints file:line and the failing expression, then
//    aborts (no unwinding through half-updated state);
//  - a failure of the world (bad flag, bad file, peer gone, deadline passed) is an exception derived from
//    mt::Error whose message names the thing at fault (file, tensor, flag, rank) and, where it helps, what
//    to do next. The CLI turns it into a one-line message and exit code 1.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace mt {

// Concatenates any streamable values: str("tensor ", name, " has ", n, " elements").
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  if constexpr (sizeof...(Args) > 0) (os << ... << args);
  return os.str();
}

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad user input: a flag, a file's contents, a tensor in a file.
class InputError : public Error {
 public:
  using Error::Error;
};

// A communication failure: peer exited, deadline passed, mismatched collective.
class CommError : public Error {
 public:
  using Error::Error;
};

// A deadline passed while waiting for a peer: carries the world rank waited for, so the job's headline can
// name the rank that stalled rather than the one that noticed.
class CommTimeoutError : public CommError {
 public:
  CommTimeoutError(const std::string& msg, int waited_world_rank) : CommError(msg), waited_(waited_world_rank) {}
  int waited_world_rank() const { return waited_; }

 private:
  int waited_;
};

// Training diverged (non-finite loss or gradient).
class DivergedError : public Error {
 public:
  using Error::Error;
};

// Last words from a signal handler (async-signal-safe): the parts joined in a stack buffer. A process that has a
// sink (a rank of a launched job: its slot in the job's shared block, so the launcher reports the reason once)
// gets them there; otherwise they go to stderr as "meshtrain: error: <parts>\n" in one write, so that processes
// sharing stderr do not interleave their lines.
void set_fatal_sink(char* buf, size_t bytes);
void fatal_message(const char* const* parts, int nparts);

[[noreturn]] void assert_fail(const char* file, int line, const char* expr, const std::string& msg);

}  // namespace mt

#define MT_ASSERT(cond, ...)                                                    \
  do {                                                                          \
    if (!(cond)) ::mt::assert_fail(__FILE__, __LINE__, #cond, ::mt::str(__VA_ARGS__)); \
  } while (0)

// Throws ErrType with the concatenated message when cond is false.
#define MT_REQUIRE(ErrType, cond, ...)                   \
  do {                                                   \
    if (!(cond)) throw ErrType(::mt::str(__VA_ARGS__));  \
  } while (0)
#define MT_CHECK_INPUT(cond, ...) MT_REQUIRE(::mt::InputError, cond, __VA_ARGS__)
