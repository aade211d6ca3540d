#include "comm/mpi/hier_allreduce.h"

#include <climits>
#include <vector>

#include "comm/mpi/mpi_comm.h"
#include "comm/reduce.h"
#include "core/env.h"
#include "core/error.h"

namespace mt::comm::mpi {

namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw CommError(str(what, " failed: ", std::string(msg, len)));
}

constexpr int kChainTag = 1;

}  // namespace

HierAllReduce::HierAllReduce(MPI_Comm comm, MPI_Comm node) {
  int n = 0, r = 0, k = 0, j = 0;
  MPI_Comm_size(comm, &n);
  MPI_Comm_rank(comm, &r);
  MPI_Comm_size(node, &k);
  MPI_Comm_rank(node, &j);
  // Every rank learns every rank's (node size, node rank, lowest rank on its node) to check the shape: host h
  // holds exactly the ranks h k .. h k + k - 1.
  int lead = r;
  check(MPI_Allreduce(MPI_IN_PLACE, &lead, 1, MPI_INT, MPI_MIN, node), "MPI_Allreduce (host layout)");
  int mine[3] = {k, j, lead};
  std::vector<int> all(3 * static_cast<size_t>(n));
  check(MPI_Allgather(mine, 3, MPI_INT, all.data(), 3, MPI_INT, comm), "MPI_Allgather (host layout)");
  for (int p = 0; p < n; ++p) {
    const int* q = &all[3 * static_cast<size_t>(p)];
    MT_REQUIRE(CommError, q[0] == k && q[1] == p % k && q[2] == p - p % k, "hierarchical all-reduce: rank ", p,
               " is local rank ", q[1], " of ", q[0], " on the host whose lowest rank is ", q[2], ", but rank ", r,
               "'s host has ", k, " ranks: hosts must hold equal, contiguous ranges of ranks");
  }
  MT_REQUIRE(CommError, n % k == 0, "hierarchical all-reduce: ", n, " ranks in hosts of ", k);
  per_host_ = k;
  hosts_ = n / k;
  host_ = r / k;
  local_ = j;
  check(MPI_Comm_split(comm, host_, r, &node_), "MPI_Comm_split (host)");
  check(MPI_Comm_split(comm, local_, host_, &cross_), "MPI_Comm_split (across hosts)");
  MPI_Comm_set_errhandler(node_, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(cross_, MPI_ERRORS_RETURN);
}

HierAllReduce::~HierAllReduce() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
  if (cross_ != MPI_COMM_NULL) MPI_Comm_free(&cross_);
}

std::unique_ptr<HierAllReduce> HierAllReduce::for_hosts_of(MPI_Comm comm) {
  if (env_flag("MESHTRAIN_MPI_HIER") == false) return nullptr;
  int n = 0, r = 0;
  MPI_Comm_size(comm, &n);
  MPI_Comm_rank(comm, &r);
  if (n < 4) return nullptr;  // 2 hosts x 2 ranks at least
  MPI_Comm shared;
  check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, r, MPI_INFO_NULL, &shared), "MPI_Comm_split_type");
  int k = 0, j = 0;
  MPI_Comm_size(shared, &k);
  MPI_Comm_rank(shared, &j);
  int lead = r;
  check(MPI_Allreduce(MPI_IN_PLACE, &lead, 1, MPI_INT, MPI_MIN, shared), "MPI_Allreduce (host layout)");
  // The same decision on every rank: the shape holds everywhere (node sizes equal, ranks contiguous).
  int ok = k >= 2 && k < n && n % k == 0 && j == r % k && lead == r - r % k ? 1 : 0, all_ok = 0;
  int kmin = k, kmax = k;
  check(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce (host layout)");
  check(MPI_Allreduce(MPI_IN_PLACE, &kmin, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce (host layout)");
  check(MPI_Allreduce(MPI_IN_PLACE, &kmax, 1, MPI_INT, MPI_MAX, comm), "MPI_Allreduce (host layout)");
  std::unique_ptr<HierAllReduce> out;
  if (all_ok && kmin == kmax) out = std::make_unique<HierAllReduce>(comm, shared);
  MPI_Comm_free(&shared);
  return out;
}

void HierAllReduce::run(const float* in, float* out, size_t n, ReduceOp op, double timeout_s,
                        const std::function<std::string()>& what) {
  const int k = per_host_;
  MT_REQUIRE(CommError, n <= static_cast<size_t>(INT_MAX), what(), ": ", n, " elements exceed MPI's int counts");
  std::vector<int> cnt(k), dis(k);
  for (int l = 0; l < k; ++l) {
    const Shard s = shard_of(n, k, l);
    cnt[l] = static_cast<int>(s.count);
    dis[l] = static_cast<int>(s.offset);
  }
  const int m = cnt[local_];
  auto step = [&](const char* name) { return [&what, name] { return str(what(), ", ", name); }; };

  // 1. pieces[l]: chunk local_ of local rank l's input.
  std::vector<float> pieces(static_cast<size_t>(k) * m);
  std::vector<int> rcnt(k, m), rdis(k);
  for (int l = 0; l < k; ++l) rdis[l] = l * m;
  MPI_Request req;
  check(MPI_Ialltoallv(in, cnt.data(), dis.data(), MPI_FLOAT, pieces.data(), rcnt.data(), rdis.data(), MPI_FLOAT,
                       node_, &req),
        "MPI_Ialltoallv");
  wait_request(&req, timeout_s, step("all-to-all inside the host"));

  // 2. the chain: continue the previous host's partial fold with this host's pieces, in rank order.
  std::vector<float> partial(host_ > 0 ? m : 0), acc(m);
  std::vector<const void*> srcs;
  if (host_ > 0) {
    check(MPI_Irecv(partial.data(), m, MPI_FLOAT, host_ - 1, kChainTag, cross_, &req), "MPI_Irecv");
    wait_request(&req, timeout_s, step("partial sum from the previous host"));
    srcs.push_back(partial.data());
  }
  for (int l = 0; l < k; ++l) srcs.push_back(pieces.data() + static_cast<size_t>(l) * m);
  if (m > 0) {
    reduce_into(acc.data(), srcs.data(), static_cast<int>(srcs.size()), static_cast<size_t>(m), DType::f32,
                op == ReduceOp::max ? ReduceOp::max : ReduceOp::sum, 1);
  }
  if (host_ < hosts_ - 1) {
    check(MPI_Isend(acc.data(), m, MPI_FLOAT, host_ + 1, kChainTag, cross_, &req), "MPI_Isend");
    wait_request(&req, timeout_s, step("partial sum to the next host"));
  }

  // 3. the last host's chunk to every host; 4. the k chunks to every rank of the host.
  check(MPI_Ibcast(acc.data(), m, MPI_FLOAT, hosts_ - 1, cross_, &req), "MPI_Ibcast");
  wait_request(&req, timeout_s, step("broadcast from the last host"));
  check(MPI_Iallgatherv(acc.data(), m, MPI_FLOAT, out, cnt.data(), dis.data(), MPI_FLOAT, node_, &req),
        "MPI_Iallgatherv");
  wait_request(&req, timeout_s, step("all-gather inside the host"));
}

}  // namespace mt::comm::mpi
