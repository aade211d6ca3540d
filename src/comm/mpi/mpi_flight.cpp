#include "comm/mpi/mpi_flight.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "comm/flight_files.h"
#include "comm/flight_recorder.h"
#include "comm/mpi/mpi_comm.h"
#include "core/env.h"
#include "core/error.h"

namespace mt::comm::mpi {

namespace {

flight::Ring* g_ring = nullptr;  // heap, never freed once a handler may read it
int g_size = 0;
char g_path[4096] = {};                    // "" = no file
std::atomic<char*> g_hosts_json{nullptr};  // heap, never freed (a handler may be reading it)
std::atomic<int> g_written{0};
struct sigaction g_old_term;
bool g_handler = false;

// g_written: 0 = not written, 1 = being written, 2 = written.
void on_term(int sig) {
  int expected = 0;
  if (g_written.compare_exchange_strong(expected, 1)) {
    if (g_ring && g_path[0])
      flight::write_rank_file(g_path, *g_ring, g_size, g_hosts_json.load(),
                              "ended by SIGTERM (mpirun ending the job: another rank failed or died)", -1, "");
    g_written.store(2);
  } else {
    // Another thread is writing the ring (this rank failed a moment ago): let it finish (at most 3 s), so that no
    // half-written temporary is left.
    for (int i = 0; i < 300 && g_written.load() == 1; i++) {
      timespec ts{0, 10'000'000};
      nanosleep(&ts, nullptr);
    }
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

void start_flight(int rank, int size, const std::string& flight_file, const std::string& fault) {
  const flight::FaultPoint f = flight::parse_fault(fault);
  if (!env_flag("MESHTRAIN_FLIGHT_RECORDER").value_or(true)) return;
  if (!g_ring) g_ring = new flight::Ring;
  flight::init_ring(g_ring, rank);
  flight::attach(g_ring, f);
  if (const char* h = std::getenv("MESHTRAIN_HOST"); h && *h) {
    std::memset(g_ring->host, 0, flight::kHostChars);
    std::strncpy(g_ring->host, h, flight::kHostChars - 1);
  }
  g_size = size;
  g_written.store(0);
  g_path[0] = 0;
  if (!flight_file.empty()) {
    const std::string p = flight::rank_file_path(flight_file, rank);
    MT_CHECK_INPUT(p.size() < sizeof g_path, "--metrics path too long for the flight recorder's file: ", p);
    std::memcpy(g_path, p.c_str(), p.size() + 1);
    // A ring left by an earlier run of the same path would be read as this job's.
    std::remove(p.c_str());
  }
  if (!g_handler) {
    struct sigaction sa {};
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &g_old_term);
    g_handler = true;
  }
}

void exchange_flight_hosts(MPI_Comm comm, double timeout_s) {
  if (!g_ring) return;
  int n = 0;
  MPI_Comm_size(comm, &n);
  std::vector<char> all(static_cast<size_t>(n) * flight::kHostChars);
  char mine[flight::kHostChars] = {};
  std::memcpy(mine, g_ring->host, flight::kHostChars - 1);
  MPI_Request req;
  check_mpi(MPI_Iallgather(mine, flight::kHostChars, MPI_CHAR, all.data(), flight::kHostChars, MPI_CHAR, comm, &req),
            "MPI_Iallgather");
  wait_request(&req, timeout_s, [] { return std::string("the flight recorder's exchange of host names"); });
  std::string j = "[";
  for (int r = 0; r < n; r++) {
    std::string h(&all[size_t(r) * flight::kHostChars],
                  strnlen(&all[size_t(r) * flight::kHostChars], flight::kHostChars));
    std::string e;
    for (char c : h) {
      if (c == '"' || c == '\\')
        e += '\\', e += c;
      else if (static_cast<unsigned char>(c) < 0x20)
        e += ' ';
      else
        e += c;
    }
    j += str(r ? ", \"" : "\"", e, "\"");
  }
  j += "]";
  // Set once per run; an earlier text is not freed (a handler on another thread may be reading it).
  g_hosts_json.store(strdup(j.c_str()));
}

std::string write_flight(const std::string& fate, int waited_world, const std::string& error) {
  if (!g_ring || !g_path[0]) return "";
  int expected = 0;
  if (!g_written.compare_exchange_strong(expected, 1)) return "";
  // SIGTERM is blocked on this thread while it writes (a handler here would wait for itself); delivered to another
  // thread, the handler waits for the write to end.
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, &old);
  const bool ok =
      flight::write_rank_file(g_path, *g_ring, g_size, g_hosts_json.load(), fate.c_str(), waited_world, error.c_str());
  g_written.store(2);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return ok ? std::string(g_path) : std::string();
}

void stop_flight() {
  if (g_handler) {
    sigaction(SIGTERM, &g_old_term, nullptr);
    g_handler = false;
  }
  if (g_ring) flight::attach(nullptr);
}

}  // namespace mt::comm::mpi
