// Launching ranks: the one entry point a subcommand uses to run its work on N ranks, with either backend.
//
//   mt::comm::LaunchOptions o;  o.nproc = 4;  o.backend = "auto";  o.timeout_s = 300;
//   int rc = mt::comm::launch(o, [&](mt::comm::Communicator& world) { ... });
//   return rc;  // 0 when every rank's body returned normally
//
// shm (one host, the default outside mpirun): the calling process becomes the supervisor. It creates the
// job's shared memory, forks nproc workers, and each worker runs body(world) and exits 0, or records its error
// in the job (not on stderr: N ranks' lines would interleave) and exits 1 if the body throws. The supervisor
// forwards SIGINT/SIGTERM/SIGHUP to the workers, ignores SIGPIPE (a rank killed by it is reported, exit 141),
// reaps every one (no zombies), and on the first failure records it in the job, which turns every other rank's
// pending or next communication into a CommError naming the failed rank; after a grace period it SIGKILLs what
// is left. It then removes any shared memory of the job (in fact none is ever visible in /dev/shm, see
// shm/job.h) and returns non-zero; launch() prints the first failure once. A rank that times out names the end
// of the chain of waits it sits in (rank 2 waits for 3, which waits for 1: rank 1 is the stalled one).
// With MESHTRAIN_PIDS_FILE set, the supervisor writes "rank pid" lines there once every worker is forked (to
// signal one rank: tests, debugging). Every worker records its communication in a flight recorder ring in the
// job's segment (flight_recorder.h); after a failure the supervisor reads all rings, also of dead or stopped
// ranks, and returns the verdict naming the odd ranks out (flight_verdict.h, docs/faults.md).
//
// mpi (under mpirun, detected from OMPI_COMM_WORLD_SIZE / PMI_SIZE / PMIX_RANK, or backend "mpi"): body runs
// in this process with the MPI world; rank and size come from MPI. MPI is initialised on first use (thread
// level MULTIPLE) and finalised at exit. If the body throws, the error is printed as "rank R: <error>" and
// the job is aborted with MPI_Abort so that no rank waits for it.
//
// What a body may assume under shm: it runs in a forked child of the caller. It sees a copy of the caller's
// memory at the time of launch (read-only inputs can simply be captured) but no threads of the caller
// survive the fork (do not rely on thread pools, loggers with threads or locks held by other threads), and
// nothing it writes is visible to the caller except through files, stdout and stderr. It must not call
// exit(); returning or throwing ends the rank. `world` and its splits live until the body returns.
// Libraries with thread pools must survive fork: OpenBLAS does (it re-creates its pool through
// pthread_atfork); with N ranks on N cores give each rank one BLAS thread (OPENBLAS_NUM_THREADS=1) or the
// ranks will fight for cores. Waits spin for a short time before sleeping, less when nproc exceeds cores.
//
// launch() and run_ranks() are not reentrant: call them from one thread, one job at a time (a forked body
// must not launch again). Under shm, wrap nothing around the body that depends on the caller's threads.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace mt::comm {

struct LaunchOptions {
  int nproc = 0;                 // shm: number of workers (0 means 1); mpi: 0, or the MPI world size
  std::string backend = "auto";  // "auto" | "shm" | "mpi"
  double timeout_s = 300;        // deadline of every blocking communication call (--comm-timeout)
  double grace_s = 2;            // after a failure, how long other ranks get to report before SIGKILL
  Algo algo = Algo::automatic;   // all-reduce algorithm override (benchmarks)
  // an injected fault, "RANK:K:KIND" (flight_recorder.h parse_fault; tests set it from MESHTRAIN_FAULT).
  std::string fault;
  // when set and the job fails, every rank's flight recorder ring is written here (JSON, docs/faults.md); under MPI
  // each rank writes its own ring beside it (flight_files.h rank_file_path) and `meshtrain flight` gathers them.
  std::string flight_file;
  // Compute threads each rank runs (train's --threads). shm: the ranks bind to CPUs of their own when ranks x this
  // fits the CPUs this process may use (comm/shm/bind.h; MESHTRAIN_SHM_BIND=0 turns it off, =1 forces it).
  int threads_per_rank = 1;
};

// Rejects bad option values with an InputError that names them. launch() calls it first.
void validate(const LaunchOptions& o);
// True when this process was started by mpirun (or another PMI launcher).
bool under_mpirun();
// "shm" or "mpi": what backend "auto" means here.
std::string resolve_backend(const LaunchOptions& o);

struct LaunchResult {
  int exit_code = 0;             // 0 success; 1 a rank failed; 128+signal when interrupted
  int failed_rank = -1;          // world rank of the first failure
  int waited_rank = -1;          // when that failure is a timeout: the world rank it waited for
  std::string failure;           // its error, or how it died ("killed by signal 9 (SIGKILL)")
  std::vector<int> rank_status;  // shm: per rank, the wait() status from waitpid
  std::vector<std::string> rank_errors;  // shm: per rank, the error it reported ("" if none)
  std::string verdict;           // shm, on failure: the flight recorder's verdict (flight_verdict.h), else ""
  std::vector<int> odd_ranks;    // the verdict's odd ranks out
  std::vector<int> lost_ranks;   // ranks that marked their place lost (injected "lose" fault): not restartable
  std::string host;              // shm: this host's name (every rank's)
};

// Runs body on every rank and returns what happened, printing nothing itself (tests use it).
LaunchResult run_ranks(const LaunchOptions& o, const std::function<void(Communicator& world)>& body);
// run_ranks, then on failure prints "meshtrain: rank R failed: <why>" to stderr (for a timeout: "meshtrain:
// rank W did not respond within --comm-timeout ...: rank R timed out waiting for it: <why>"), then the flight
// recorder's verdict ("meshtrain: flight recorder: all ranks but 3 entered ..."); returns exit_code.
// launch_result() is the same and returns the whole result (the restarting launcher reads lost_ranks).
LaunchResult launch_result(const LaunchOptions& o, const std::function<void(Communicator& world)>& body);
int launch(const LaunchOptions& o, const std::function<void(Communicator& world)>& body);
// The one headline format for a failed job (both backends): waited_rank >= 0 for a timeout, failed_rank -1 when
// no rank is to blame.
void print_failure_headline(int failed_rank, int waited_rank, const std::string& failure);

}  // namespace mt::comm
