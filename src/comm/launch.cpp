#include "comm/launch.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <numeric>

#include "comm/flight_recorder.h"
#include "comm/flight_files.h"
#include "comm/flight_verdict.h"
#include "comm/shm/job.h"
#include "comm/shm/bind.h"
#include "comm/shm/shm_comm.h"
#include "core/env.h"
#include "core/error.h"
#include "core/shared_heap.h"
#ifdef MESHTRAIN_HAVE_MPI
#include "comm/mpi/mpi_comm.h"
#endif

namespace mt::comm {

namespace {

constexpr size_t kArenaBytes = size_t{64} << 30;  // virtual; pages are taken only when touched
constexpr long kSharedHeapSliceMb = 16 << 10;      // each rank's slice of the shared heap: address space, 16 GiB

// Signals the supervisor forwards to the workers (and reports as an interruption). SIGHUP: the terminal went
// away; handled like SIGTERM so that the ranks end and the job's memory is released the same way.
constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP};

// Signal forwarding: the handler may only touch these.
volatile sig_atomic_t g_signal = 0;
pid_t g_children[shm::kMaxRanks];
volatile sig_atomic_t g_nchildren = 0;

void forward_signal(int sig) {
  g_signal = sig;
  for (int i = 0; i < g_nchildren; ++i) {
    if (g_children[i] > 0) kill(g_children[i], sig);
  }
}

std::string describe_status(int st) {
  if (WIFSIGNALED(st) && WTERMSIG(st) == SIGPIPE)
    return "its output was closed (SIGPIPE: the reader of stdout or stderr, e.g. `head`, went away)";
  if (WIFSIGNALED(st)) {
    int s = WTERMSIG(st);
    const char* name = sigabbrev_np(s);
    return str("killed by signal ", s, " (SIG", name ? name : "?", ")");
  }
  if (WIFEXITED(st)) return str("exited with code ", WEXITSTATUS(st));
  return "ended";
}

// 'T' (stopped) or 't' (traced) in /proc/PID/stat's state field.
bool is_stopped(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (!f) return false;
  char buf[512] = {};
  const size_t got = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const char* close_paren = got ? std::strrchr(buf, ')') : nullptr;  // the command may hold spaces and ')'
  return close_paren && close_paren[1] == ' ' && (close_paren[2] == 'T' || close_paren[2] == 't');
}

[[noreturn]] void run_worker(shm::Job& job, uint64_t region, int r, int n, pid_t parent, const LaunchOptions& o,
                             const std::function<void(Communicator&)>& body, flight::Ring* ring,
                             const flight::FaultPoint& fault) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // the supervisor died: so do we
  if (getppid() != parent) _exit(1);
  flight::attach(ring, fault);
  for (int s : kForwarded) signal(s, SIG_DFL);
  signal(SIGPIPE, SIG_DFL);  // a closed output ends the rank; the supervisor reports it (describe_status)
  job.block().pids[r] = getpid();
  set_fatal_sink(job.block().rank_error[r], shm::kErrorChars);  // a signal handler's last words
  shm::bind_rank(r, job.block().bind_width);  // before any thread of the rank starts: they inherit it
  shared_heap::enter_rank(r);
  int code = 0;
  std::unique_ptr<shm::ShmCommunicator> world;
  try {
    std::vector<int> ranks(n);
    std::iota(ranks.begin(), ranks.end(), 0);
    world = std::make_unique<shm::ShmCommunicator>(&job, region, r, ranks, "world");
    world->set_timeout(o.timeout_s);
    world->set_algorithm(o.algo);
    body(*world);
    world.reset();
  } catch (const std::exception& e) {
    // Record first (so that peers and our own queued operations stop waiting), then tear down.
    // Not printed here: the supervisor prints the first failure once (ranks' lines would interleave).
    job.set_rank_error(r, e.what());
    const auto* timeout = dynamic_cast<const CommTimeoutError*>(&e);
    if (timeout) {
      // The rank waited for may itself be waiting for another: name the end of the chain, the one stalled.
      const std::vector<int> chain = job.wait_chain(timeout->waited_world_rank());
      std::string why = e.what();
      for (size_t i = 1; i < chain.size(); i++)
        why += str("; world rank ", chain[i - 1], " was itself waiting for world rank ", chain[i]);
      job.fail(r, why, chain.back());
    } else {
      job.fail(r, e.what());
    }
    code = 1;
    try {
      world.reset();
    } catch (...) {
    }
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(code);
}

LaunchResult run_shm(const LaunchOptions& o, const std::function<void(Communicator&)>& body) {
  const int n = o.nproc < 1 ? 1 : o.nproc;
  shm::Job job(n, kArenaBytes);
  job.block().bind_width = shm::job_bind_width(n, o.threads_per_rank);
  uint64_t region = shm::ShmCommunicator::create_region(job, n);
  // The shared heap (core/shared_heap.h): made before the fork so that every rank maps it at the same address.
  // MESHTRAIN_SHARED_HEAP_MB sets each rank's slice of address space (0: no heap, every buffer private).
  const long heap_mb = env_int("MESHTRAIN_SHARED_HEAP_MB", 0, long(1) << 30).value_or(kSharedHeapSliceMb);
  const bool heap = n > 1 && heap_mb > 0 && shared_heap::create(n, size_t(heap_mb) << 20);
  struct HeapGuard {
    bool on;
    ~HeapGuard() {
      if (on) shared_heap::destroy();
    }
  } heap_guard{heap};
  const flight::FaultPoint fault = flight::parse_fault(o.fault);
  // MESHTRAIN_FLIGHT_RECORDER=0 turns the recorder off (to measure what it costs: docs/faults.md).
  const bool recording = env_flag("MESHTRAIN_FLIGHT_RECORDER").value_or(true);
  // The flight recorder's rings: in the job's segment, so this process reads them whatever becomes of a rank.
  auto* rings = static_cast<flight::Ring*>(job.at(job.allocate(sizeof(flight::Ring) * n)));
  for (int r = 0; r < n; ++r) flight::init_ring(&rings[r], r);
  LaunchResult res;
  std::vector<std::string> fate(n);  // what became of each rank by the first failure (the verdict names it)
  res.rank_status.assign(n, 0);

  struct sigaction sa = {};
  struct sigaction ign = {};
  struct sigaction old[std::size(kForwarded)] = {};
  struct sigaction old_pipe = {};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  g_signal = 0;
  g_nchildren = 0;
  for (size_t i = 0; i < std::size(kForwarded); i++) sigaction(kForwarded[i], &sa, &old[i]);
  // A closed stdout/stderr must not kill the supervisor before it has ended the ranks: writes fail (EPIPE)
  // instead, and a rank that dies of SIGPIPE is reported (exit 128 + SIGPIPE).
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  sigaction(SIGPIPE, &ign, &old_pipe);

  std::fflush(nullptr);
  const pid_t parent = getpid();
  std::vector<pid_t> pids(n, -1);
  std::vector<int> pidfds(n, -1);
  std::vector<bool> alive(n, false);
  std::string fork_error;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) run_worker(job, region, r, n, parent, o, body, recording ? &rings[r] : nullptr, fault);
    if (pid < 0) {
      fork_error = str("fork of rank ", r, " failed: ", std::strerror(errno));
      break;
    }
    pids[r] = pid;
    g_children[r] = pid;
    g_nchildren = r + 1;
    alive[r] = true;
    pidfds[r] = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  }
  if (const char* path = std::getenv("MESHTRAIN_PIDS_FILE"); path && *path && fork_error.empty()) {
    // Tests and operators that signal one rank (SIGSTOP, SIGKILL) find it here: "rank pid" per line.
    std::string text;
    for (int r = 0; r < n; ++r) text += str(r, " ", pids[r], "\n");
    if (FILE* f = std::fopen(path, "w")) {
      std::fputs(text.c_str(), f);
      std::fclose(f);
    }
  }
  if (!fork_error.empty()) {
    job.fail(-1, fork_error);
    res.failure = fork_error;
    res.exit_code = 1;
  }

  using Clock = std::chrono::steady_clock;
  bool have_failure = !fork_error.empty();
  Clock::time_point kill_at = have_failure ? Clock::now() : Clock::time_point::max();
  auto record_failure = [&](int r, const std::string& why) {
    if (have_failure) return;
    have_failure = true;
    int fr;
    std::string fwhy;
    if (job.failed(&fr, &fwhy) && fr >= 0) {  // a rank that threw recorded itself: that is the root cause
      res.failed_rank = fr;
      res.failure = fwhy;
      res.waited_rank = job.waited_rank();
    } else {
      job.fail(r, why);
      res.failed_rank = r;
      res.failure = why;
    }
    res.exit_code = 1;
    kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.grace_s));
  };

  int remaining = 0;
  for (int r = 0; r < n; ++r) remaining += alive[r] ? 1 : 0;
  bool killed = false;
  while (remaining > 0) {
    std::vector<pollfd> fds;
    std::vector<int> who;
    for (int r = 0; r < n; ++r) {
      if (alive[r] && pidfds[r] >= 0) {
        fds.push_back({pidfds[r], POLLIN, 0});
        who.push_back(r);
      }
    }
    poll(fds.data(), fds.size(), 50);  // EINTR (a forwarded signal) just loops
    // Checked before reaping: workers killed by the forwarded signal are its victims, not the cause.
    if (g_signal && !have_failure) {
      int s = g_signal;
      const char* name = sigabbrev_np(s);
      record_failure(-1, str("interrupted by SIG", name ? name : "?"));
      res.exit_code = 128 + s;
    }
    for (int r = 0; r < n; ++r) {
      if (!alive[r]) continue;
      int st = 0;
      pid_t got = waitpid(pids[r], &st, WNOHANG);
      if (got == 0) continue;
      alive[r] = false;
      g_children[r] = -1;
      --remaining;
      if (pidfds[r] >= 0) close(pidfds[r]);
      res.rank_status[r] = st;
      if (!have_failure && got > 0) {
        int fr = -1;
        std::string fwhy;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) fate[r] = "finished";
        else if (job.failed(&fr, &fwhy) && fr == r && job.waited_rank() >= 0)  // the witness of a stall
          fate[r] = str("timed out waiting for rank ", job.waited_rank());
        else fate[r] = describe_status(st);
      }
      if (got < 0 || !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
        std::string why = describe_status(st);
        std::string err = job.rank_error(r);
        if (!err.empty()) why = err;
        const bool first = !have_failure;
        record_failure(r, why);
        if (first && WIFSIGNALED(st) && WTERMSIG(st) == SIGPIPE) res.exit_code = 128 + SIGPIPE;  // as a shell's
      }
      job.set_exited(r, st);  // after the failure record: see ShmCommunicator::poll_failure
    }
    if (!killed && remaining > 0 && Clock::now() >= kill_at) {
      for (int r = 0; r < n; ++r) {
        if (!alive[r]) continue;
        if (fate[r].empty() && res.exit_code < 128)
          fate[r] = is_stopped(pids[r]) ? "stopped (SIGSTOP or another stop signal)"
                                        : str("still running ", o.grace_s, " s after the failure");
        kill(pids[r], SIGKILL);
      }
      killed = true;
    }
  }
  g_nchildren = 0;
  for (size_t i = 0; i < std::size(kForwarded); i++) sigaction(kForwarded[i], &old[i], nullptr);
  sigaction(SIGPIPE, &old_pipe, nullptr);
  for (int r = 0; r < n; ++r) res.rank_errors.push_back(job.rank_error(r));
  char host[flight::kHostChars] = {};
  gethostname(host, sizeof host - 1);
  res.host = host;
  for (int r = 0; r < n; ++r)
    if (rings[r].lost.load()) res.lost_ranks.push_back(r);
  if (res.exit_code != 0 && res.exit_code < 128) {  // a failure, not an interruption: where was every rank?
    std::vector<flight::RankView> views(n);
    for (int r = 0; r < n; ++r) {
      views[r].rank = r;
      views[r].host = res.host;
      views[r].fate = fate[r] == "finished" ? "" : fate[r];
      views[r].ops = flight::snapshot(rings[r]);
    }
    flight::Verdict v = flight::verdict(views);
    // The verdict is printed only when some rank is inside an operation (a stall, a dead peer): a failure every
    // rank met between operations (a diverged loss, a closed pipe) has its one message already.
    bool inside = false;
    for (const flight::RankView& rv : views) inside = inside || flight::position(rv.ops) >= 0;
    if (inside) res.verdict = v.line;
    res.odd_ranks = v.odd;
    if (!o.flight_file.empty()) flight::write_flight_file(o.flight_file, views, v.line);
  }
  shm::sweep_segments(getpid());
  return res;
}

}  // namespace

void validate(const LaunchOptions& o) {
  MT_REQUIRE(InputError, o.backend == "auto" || o.backend == "shm" || o.backend == "mpi", "--backend '", o.backend,
             "' is not one of auto, shm, mpi");
  MT_REQUIRE(InputError, o.nproc >= 0 && o.nproc <= shm::kMaxRanks, "--nproc ", o.nproc, " is out of range 1..",
             shm::kMaxRanks);
  MT_REQUIRE(InputError, o.timeout_s > 0, "--comm-timeout must be > 0 seconds, got ", o.timeout_s);
  MT_REQUIRE(InputError, o.grace_s >= 0, "grace period must be >= 0 seconds, got ", o.grace_s);
}

bool under_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

std::string resolve_backend(const LaunchOptions& o) {
  if (o.backend != "auto") return o.backend;
  return under_mpirun() ? "mpi" : "shm";
}

LaunchResult run_ranks(const LaunchOptions& o, const std::function<void(Communicator& world)>& body) {
  validate(o);
  if (resolve_backend(o) == "mpi") {
#ifdef MESHTRAIN_HAVE_MPI
    return mpi::run_body(o, body);
#else
    throw InputError("--backend mpi: this meshtrain was built without MPI (install OpenMPI and rebuild), or use "
                     "--backend shm");
#endif
  }
  return run_shm(o, body);
}

int launch(const LaunchOptions& o, const std::function<void(Communicator& world)>& body) {
  return launch_result(o, body).exit_code;
}

LaunchResult launch_result(const LaunchOptions& o, const std::function<void(Communicator& world)>& body) {
  LaunchResult r = run_ranks(o, body);
  if (r.exit_code != 0) {
    // stderr may be the pipe whose closing ended the job: the write fails instead of killing this process.
    struct sigaction ign = {}, old = {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &old);
    print_failure_headline(r.failed_rank, r.waited_rank, r.failure);
    // Under the headline, indented: one message per failed job, its detail on the next line.
    if (!r.verdict.empty()) std::fprintf(stderr, "  flight recorder: %s\n", r.verdict.c_str());
    sigaction(SIGPIPE, &old, nullptr);
  }
  return r;
}

void print_failure_headline(int failed_rank, int waited_rank, const std::string& failure) {
  if (waited_rank >= 0) {  // the stalled rank first, then who noticed and in which operation
    std::fprintf(stderr, "meshtrain: rank %d did not respond within --comm-timeout (stalled, dead, or not calling "
                 "the operation): rank %d timed out waiting for it: %s\n", waited_rank, failed_rank, failure.c_str());
  } else if (failed_rank >= 0) {
    std::fprintf(stderr, "meshtrain: rank %d failed: %s\n", failed_rank, failure.c_str());
  } else {
    std::fprintf(stderr, "meshtrain: %s\n", failure.c_str());
  }
}

}  // namespace mt::comm
