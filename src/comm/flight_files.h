// Flight recorder rings as per-rank files, and the verdict gathered from them: how a job under mpirun (ranks on
// several hosts, no shared memory between them) gives the same verdict as the shm launcher (flight_verdict.h).
//
// Under MPI every rank records into a ring in its own memory (src/comm/mpi/mpi_flight.h). When it fails (a
// deadline passed, a peer died, an error) or is told to end by mpirun (SIGTERM, which OpenMPI's daemons send to
// the surviving ranks when one rank fails), it writes its ring to `<P>.rank<R>.json` (P = the flight file's path
// without ".json": with --metrics M, `M.flight.rank3.json`). After mpirun has ended, `meshtrain flight --metrics M`
// (gather_rank_files) reads them, names the ranks that wrote nothing (killed, stopped, or behind a cut link:
// SIGKILL and a link down leave no chance to write), computes the verdict over all ranks, writes the combined
// `M.flight.json` (the shm launcher's format) and removes the per-rank files.
//
// The per-rank file (one JSON object):
//   {"rank": R, "size": N, "host": "...", "pid": ..., "fate": "...", "waited_for": W (-1: none), "error": "...",
//    "hosts": ["h of rank 0", ...] (every rank's host, exchanged at start; [] when unknown),
//    "ops": [{"id", "group", "op", "seq", "bytes", "peer", "root", "state", "t_queued_ns", "t_started_ns",
//             "t_done_ns"}, ...]}
// write_rank_file is async-signal-safe (open, write, rename, close; no allocation, no locale, no stdio), so a
// SIGTERM handler may call it; it reads the ring with the same id check as snapshot() (an entry rewritten while
// read is left out).
#pragma once

#include <string>
#include <vector>

#include "comm/flight_recorder.h"
#include "comm/flight_verdict.h"

namespace mt::comm::flight {

// `<flight_file without a trailing ".json">.rank<R>.json`.
std::string rank_file_path(const std::string& flight_file, int rank);

// Writes `ring` to `path` (through `path`.tmp, renamed into place). hosts_json: a JSON array text (may be null:
// "[]"); fate, error: plain text (escaped here; null = ""). Returns false when the file could not be written.
// Async-signal-safe.
bool write_rank_file(const char* path, const Ring& ring, int world_size, const char* hosts_json, const char* fate,
                     int waited_world, const char* error);

struct Gathered {
  int size = 0;                     // the job's ranks (from the files), 0 when none was found
  std::vector<RankView> views;      // one per rank, in rank order (a rank without a file: no ops, fate says so)
  std::vector<int> missing;         // ranks that wrote no ring
  std::vector<std::string> errors;  // per rank: its error text ("" when none or missing)
  std::vector<int> waited;          // per rank: the world rank it timed out waiting for, or -1
  Verdict verdict;
  bool inside = false;  // some rank is inside an operation (the verdict is worth printing)
};

// Reads `<P>.rank<R>.json` for R = 0.. (size from the first file found; at most kMaxGatherRanks), builds the
// verdict. Throws InputError naming the file for a malformed or inconsistent one. size 0 when there is none.
Gathered gather_rank_files(const std::string& flight_file);
constexpr int kMaxGatherRanks = 4096;

// The shm launcher's combined file (docs/faults.md): {"verdict": ..., "ranks": [...]}.
void write_flight_file(const std::string& path, const std::vector<RankView>& views, const std::string& verdict);

}  // namespace mt::comm::flight
