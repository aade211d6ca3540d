// The flight recorder under the MPI backend: each rank records into a ring in its own memory (ranks on other
// hosts share nothing with it) and writes that ring to its own file when it fails or is told to end; the files
// are gathered into the verdict after mpirun has ended (`meshtrain flight`, src/comm/flight_files.h).
//
// When a rank writes its ring (P = the flight file's path, `--metrics M` gives `M.flight.json`; the rank's file is
// `M.flight.rank<R>.json`):
//   - it fails: a deadline passed (fate "timed out waiting for rank W"), or any other error (a peer's death seen
//     by MPI as a failed request, a mismatch, a full disk): written before MPI_Abort;
//   - it receives SIGTERM: what OpenMPI's daemons send to the ranks that are still running when the job is
//     aborted (another rank failed or died); the handler writes the ring (async-signal-safe) and ends the process
//     by SIGTERM as before. A SIGKILLed rank, a stopped one (until the launcher kills it) and one whose host's
//     link is down (when the file system it writes to is remote) write nothing: the gatherer names them.
// A rank writes its ring at most once (the first of these).
//
// Host names: a rank's host is MESHTRAIN_HOST when set (scripts/hosts_rsh.sh sets it to the namespace's name,
// since namespaces share one hostname), else gethostname(). Every rank's host is exchanged once at start
// (MPI_Iallgather under the deadline) so the gatherer can name the host of a rank that wrote nothing.
// MESHTRAIN_FLIGHT_RECORDER=0 turns recording off (and with it MESHTRAIN_FAULT), as under the shm launcher.
#pragma once

#include <mpi.h>

#include <string>

namespace mt::comm::mpi {

// Attaches a ring for world rank `rank` of `size` (fault: "RANK:K:KIND" or ""), remembers where to write it
// (flight_file "" = record but write no file) and installs the SIGTERM handler. No-op when recording is off.
void start_flight(int rank, int size, const std::string& flight_file, const std::string& fault);
// Exchanges every rank's host name over `comm` (a world duplicate; deadline timeout_s) for the rank files.
void exchange_flight_hosts(MPI_Comm comm, double timeout_s);
// Writes the ring now (once per process; later calls and SIGTERM do nothing). Returns the file written, or "".
std::string write_flight(const std::string& fate, int waited_world, const std::string& error);
// Detaches the ring and restores SIGTERM's previous handling (after a successful run).
void stop_flight();

}  // namespace mt::comm::mpi
