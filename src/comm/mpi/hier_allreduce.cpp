#include "comm/mpi/hier_allreduce.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <utility>
#include <vector>

#include "comm/mpi/mpi_comm.h"
#include "comm/reduce.h"
#include "core/env.h"
#include "core/error.h"

namespace mt::comm::mpi {

namespace {


constexpr int kChainTag = 1;
constexpr int kResultTag = 2;
// Floats per segment of a chunk in steps 2 and 3: 64,000 bytes, so that each segment with OpenMPI's match header
// fits the TCP BTL's eager limit (64 KiB) and goes out without a rendezvous round trip. MESHTRAIN_MPI_HIER_SEGMENT
// (floats) overrides it for measurements.
const int kSegment = static_cast<int>(env_int("MESHTRAIN_MPI_HIER_SEGMENT", 1, 1 << 28).value_or(16000));  // floats per pipelined segment of a chunk (256 KB)

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
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &lead, 1, MPI_INT, MPI_MIN, node), "MPI_Allreduce (host layout)");
  int mine[3] = {k, j, lead};
  std::vector<int> all(3 * static_cast<size_t>(n));
  check_mpi(MPI_Allgather(mine, 3, MPI_INT, all.data(), 3, MPI_INT, comm), "MPI_Allgather (host layout)");
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
  check_mpi(MPI_Comm_split(comm, host_, r, &node_), "MPI_Comm_split (host)");
  check_mpi(MPI_Comm_split(comm, local_, host_, &cross_), "MPI_Comm_split (across hosts)");
  MPI_Comm_set_errhandler(node_, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(cross_, MPI_ERRORS_RETURN);
  window_ = std::make_unique<NodeWindow>(node_);
}

HierAllReduce::~HierAllReduce() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  window_.reset();
  if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
  if (cross_ != MPI_COMM_NULL) MPI_Comm_free(&cross_);
}

std::unique_ptr<HierAllReduce> HierAllReduce::for_hosts_of(MPI_Comm comm) {
  int n = 0, r = 0;
  MPI_Comm_size(comm, &n);
  MPI_Comm_rank(comm, &r);
  if (n < 4) return nullptr;  // 2 hosts x 2 ranks at least
  MPI_Comm shared;
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, r, MPI_INFO_NULL, &shared), "MPI_Comm_split_type");
  int k = 0, j = 0;
  MPI_Comm_size(shared, &k);
  MPI_Comm_rank(shared, &j);
  int lead = r;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &lead, 1, MPI_INT, MPI_MIN, shared), "MPI_Allreduce (host layout)");
  // The same decision on every rank: the shape holds everywhere (node sizes equal, ranks contiguous).
  int ok = k >= 2 && k < n && n % k == 0 && j == r % k && lead == r - r % k ? 1 : 0, all_ok = 0;
  int kmin = k, kmax = k;
  check_mpi(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce (host layout)");
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &kmin, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce (host layout)");
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &kmax, 1, MPI_INT, MPI_MAX, comm), "MPI_Allreduce (host layout)");
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

  // 1. every input into its rank's slot of the host's shared window; pieces: chunk local_ of each, read in place.
  // The slot holds the input (n floats) and then, from float n, this rank's result chunk (step 4).
  NodeWindow& win = *window_;
  win.begin((n + static_cast<size_t>(cnt[0])) * sizeof(float), timeout_s, step("shared window inside the host"));
  std::memcpy(win.slot(local_), in, n * sizeof(float));
  win.sync(timeout_s, step("inputs inside the host"));
  auto piece = [&](int l) { return reinterpret_cast<const float*>(win.slot(l)) + dis[local_]; };

  // 2 and 3, in segments so that both directions of a link work at once: while segment s + 1 of the partial sum
  // travels forward along the chain, segment s of the result travels back in the broadcast.
  const int nseg = m == 0 ? 0 : static_cast<int>((static_cast<size_t>(m) + kSegment - 1) / kSegment);
  // The result chunk lands in this rank's slot after its input (broadcast into it, or summed there on the last
  // host), where the host-mates read it in step 4.
  std::vector<float> partial(host_ > 0 ? m : 0), acc(host_ < hosts_ - 1 ? m : 0);
  float* const result = reinterpret_cast<float*>(win.slot(local_)) + n;
  float* const sum = host_ == hosts_ - 1 ? result : acc.data();
  std::vector<MPI_Request> recvs(nseg, MPI_REQUEST_NULL), sends(nseg, MPI_REQUEST_NULL);
  // The result's segments: every other host receives them from the last one (receives posted up front).
  const int others = hosts_ - 1;
  std::vector<MPI_Request> results(host_ == hosts_ - 1 ? size_t(nseg) * others : size_t(nseg), MPI_REQUEST_NULL);
  auto seg = [&](int s) {  // (offset, length) of segment s of this rank's chunk
    return std::pair<size_t, int>(size_t(s) * kSegment, std::min<int>(kSegment, m - s * kSegment));
  };
  if (host_ > 0) {
    for (int s = 0; s < nseg; ++s) {
      check_mpi(MPI_Irecv(partial.data() + seg(s).first, seg(s).second, MPI_FLOAT, host_ - 1, kChainTag, cross_, &recvs[s]),
            "MPI_Irecv");
    }
  }
  if (host_ < hosts_ - 1) {
    for (int s = 0; s < nseg; ++s) {
      check_mpi(MPI_Irecv(result + seg(s).first, seg(s).second, MPI_FLOAT, hosts_ - 1, kResultTag, cross_, &results[s]),
            "MPI_Irecv");
    }
  }
  std::vector<const void*> srcs(k + (host_ > 0 ? 1 : 0));
  for (int s = 0; s < nseg; ++s) {
    const auto [off, len] = seg(s);
    int i = 0;
    if (host_ > 0) {
      wait_request(&recvs[s], timeout_s, step("partial sum from the previous host"));
      srcs[i++] = partial.data() + off;
    }
    for (int l = 0; l < k; ++l) srcs[i++] = piece(l) + off;
    reduce_into(sum + off, srcs.data(), i, static_cast<size_t>(len), DType::f32,
                op == ReduceOp::max ? ReduceOp::max : ReduceOp::sum, 1);
    if (host_ < hosts_ - 1) {
      check_mpi(MPI_Isend(sum + off, len, MPI_FLOAT, host_ + 1, kChainTag, cross_, &sends[s]), "MPI_Isend");
    }
    if (host_ == hosts_ - 1) {
      for (int g = 0; g < others; ++g) {
        check_mpi(MPI_Isend(result + off, len, MPI_FLOAT, g, kResultTag, cross_, &results[size_t(s) * others + g]),
              "MPI_Isend");
      }
    }
  }
  if (nseg > 0) {
    wait_requests(nseg, sends.data(), timeout_s, step("partial sum to the next host"), {}, nullptr);
    wait_requests(static_cast<int>(results.size()), results.data(), timeout_s, step("result from the last host"), {},
                  nullptr);
  }

  // 4. every rank copies the k result chunks out of the host-mates' slots.
  win.sync(timeout_s, step("results inside the host"));
  for (int l = 0; l < k; ++l) {
    std::memcpy(out + dis[l], reinterpret_cast<const float*>(win.slot(l)) + n, static_cast<size_t>(cnt[l]) * sizeof(float));
  }
}

}  // namespace mt::comm::mpi
