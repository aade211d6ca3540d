#include "comm/mpi/hier_allgather.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "comm/mpi/mpi_comm.h"
#include "comm/mpi/node_window.h"
#include "comm/types.h"
#include "core/error.h"

namespace mt::comm::mpi {

void hier_all_gather(const HierAllReduce& hosts, const void* send, void* recv, size_t n, size_t elem,
                     double timeout_s, const std::function<std::string()>& what) {
  const int H = hosts.hosts(), k = hosts.per_host(), h = hosts.host(), j = hosts.local(), ranks = H * k;
  MT_REQUIRE(CommError, n * elem <= static_cast<size_t>(INT_MAX), what(), ": ", n * elem,
             " bytes exceed MPI's int counts");
  char* out = static_cast<char*>(recv);
  auto bytes = [&](int p) { return static_cast<int>(shard_of(n, ranks, p).count * elem); };
  auto offset = [&](int p) { return static_cast<int>(shard_of(n, ranks, p).offset * elem); };
  auto step = [&](const char* name) { return [&what, name] { return str(what(), ", ", name); }; };

  // 1. shards (g, j) for every host g, straight into place.
  std::vector<int> cnt(H), dis(H);
  for (int g = 0; g < H; ++g) {
    cnt[g] = bytes(g * k + j);
    dis[g] = offset(g * k + j);
  }
  const int me = h * k + j;
  const void* sbuf = send == out + offset(me) ? MPI_IN_PLACE : send;
  MPI_Request req;
  check_mpi(MPI_Iallgatherv(sbuf, cnt[h], MPI_BYTE, out, cnt.data(), dis.data(), MPI_BYTE, hosts.cross(), &req),
        "MPI_Iallgatherv (across hosts)");
  wait_request(&req, timeout_s, step("all-gather across hosts"));

  // 2. local rank l's pack in its slot of the host's shared window: shards (0, l), .., (H-1, l), in host order.
  size_t pack_max = 0;
  for (int l = 0; l < k; ++l) {
    size_t p = 0;
    for (int g = 0; g < H; ++g) p += static_cast<size_t>(bytes(g * k + l));
    pack_max = std::max(pack_max, p);
  }
  NodeWindow& win = hosts.window();
  win.begin(pack_max, timeout_s, step("shared window inside the host"));
  char* mine = win.slot(j);
  for (int g = 0, at = 0; g < H; at += bytes(g * k + j), ++g) std::memcpy(mine + at, out + offset(g * k + j), bytes(g * k + j));
  win.sync(timeout_s, step("all-gather inside the host"));
  for (int l = 0; l < k; ++l) {
    if (l == j) continue;
    const char* pack = win.slot(l);
    for (int g = 0, at = 0; g < H; at += bytes(g * k + l), ++g) {
      std::memcpy(out + offset(g * k + l), pack + at, bytes(g * k + l));
    }
  }
}

}  // namespace mt::comm::mpi
