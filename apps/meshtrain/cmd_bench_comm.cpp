// meshtrain bench comm: collective bandwidth in the style of nccl-tests, against OpenMPI in the same run.
//
//   meshtrain bench comm --nproc 2                      shm backend, 4 KB .. 256 MB, every collective below
//   mpirun -np 2 meshtrain bench comm                   the MPI backend (our wrapper around MPI)
//
// Operations (--ops): all_reduce, reduce_scatter, all_gather, broadcast (root 0), all_to_all, all_to_all_v
// (even split, through the v interface). For every size: warm up, then run for a time budget cut into
// batches of ~2 ms; time = the slowest rank's mean per call in its fastest batch (a shared host's other
// work lands in some batches, not all; both peers are timed by the same function).
//   S = the full buffer: all_reduce, reduce_scatter, all_gather, broadcast;
//       one rank's send buffer (n blocks of S/n): all_to_all, all_to_all_v          (as nccl-tests)
//   algbw = S / time
//   busbw = algbw * 2(n-1)/n  all_reduce
//           algbw * (n-1)/n   reduce_scatter, all_gather, all_to_all(_v)
//           algbw * 1         broadcast
// Results are checked (small integers, exact) after the timed loop unless --no-check.
//
// The peer: unless --no-mpi-peer, the command then starts `mpirun -np N <this binary> bench comm
// --mpi-native ...`, which times OpenMPI's own MPI_Allreduce / MPI_Reduce_scatter / MPI_Allgatherv /
// MPI_Bcast / MPI_Alltoall / MPI_Alltoallv at the same sizes, and prints the ratio of bus bandwidths (ours /
// OpenMPI's). --rounds R repeats both sides R times, alternating, and keeps each side's best time per size.
// It also prints the single-thread memcpy bandwidth, the yardstick for a shared-memory collective.
//
// --bound (shm backend; all_gather, all_to_all, all_to_all_v): after each such row, the same ranks time the copy
// bound of a single-copy collective at that size, back to back with the row: each rank reads the (n-1) peers'
// shards of S/n (all_to_all(_v): the peer's block for this rank) straight from their send buffers the way our
// single-copy paths do (with loads where the buffers are in the job's shared heap, --buffers shared; else with
// process_vm_readv, the kernel's copy, which OpenMPI's CMA path uses too) and copies its own shard with memcpy, all
// ranks at once, with no synchronisation between calls (time_op's per-batch maximum only). No collective moving
// these bytes between processes by one copy of that kind can be faster on the host at that moment. Columns: bnd(us), ours/bnd and mpi/bnd =
// the bound's time / that side's time (1.00 = at the bound; above 1 where a side beats it, e.g. from caches at
// small sizes or when the bound's batch met a slow moment).
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <map>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "apps/meshtrain/commands.h"
#include "comm/copy.h"
#include "comm/launch.h"
#include "comm/shm/job.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/shared_heap.h"
#include "comm/shm/cma.h"
#include "tensor/buffer.h"
#ifdef MESHTRAIN_HAVE_MPI
#include <mpi.h>
#endif

namespace mt::cli {

namespace {

using comm::Communicator;
using comm::DType;
using comm::OpKind;
using comm::ReduceOp;
using Clock = std::chrono::steady_clock;

struct BenchConfig {
  comm::LaunchOptions launch;
  std::string ops = "all_reduce,reduce_scatter,all_gather,broadcast,all_to_all,all_to_all_v";
  std::string dtype = "f32";
  std::string algo = "auto";
  std::string min_bytes = "4K", max_bytes = "256M";
  double seconds_per_size = 0.25;
  int rounds = 1;
  bool check = true;
  bool mpi_peer = true;
  bool mpi_native = false;  // internal: this process is the OpenMPI peer under mpirun
  bool bound = false;       // --bound: time the single-copy bound after each all_gather / all_to_all(_v) row
  std::string stores = "auto";
  std::string buffers = "shared";  // --buffers: the send and receive buffers in the job's shared heap, or private
};

// --stores: how copies into shared memory are stored (comm/copy.h CopyInPolicy); several give one row each
// per size, measured back to back, so the modes are compared in the same minute of a drifting host.
constexpr int kStoresAuto = 0, kStoresOrdinary = 1, kStoresStreaming = 2;
constexpr const char* kStoresNames[] = {"auto", "ord", "nt"};
std::vector<int> parse_stores(const std::string& list) {
  std::vector<int> modes;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item == "auto") modes.push_back(kStoresAuto);
    else if (item == "ordinary") modes.push_back(kStoresOrdinary);
    else if (item == "streaming") modes.push_back(kStoresStreaming);
    else MT_CHECK_INPUT(false, "--stores: '", item, "' is not one of auto, ordinary, streaming");
  }
  MT_CHECK_INPUT(!modes.empty(), "--stores is empty: give auto, ordinary and/or streaming");
  return modes;
}

// A size flag: a number with an optional K, M or G suffix (binary). Values that do not fit in 2^62 bytes are
// refused here, before any conversion to an integer could wrap; what fits the machine is checked in run_bench.
size_t parse_bytes(const std::string& flag, const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  MT_CHECK_INPUT(end != s.c_str(), flag, " '", s, "': use a number with an optional K, M or G suffix");
  const std::string unit = end;
  double m = 1;
  if (unit == "K" || unit == "KB" || unit == "k") m = 1024;
  else if (unit == "M" || unit == "MB") m = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB") m = 1024.0 * 1024 * 1024;
  else
    MT_CHECK_INPUT(unit.empty(), flag, " '", s, "': use a number with an optional K, M or G suffix");
  MT_CHECK_INPUT(v > 0, flag, " '", s, "' must be positive");
  MT_CHECK_INPUT(std::isfinite(v) && v * m < 0x1p62, flag, " '", s,
                 "' is too large: a message size must be below 2^62 bytes (4 EiB)");
  return static_cast<size_t>(v * m);
}

constexpr const char* kOpNames = "all_reduce, reduce_scatter, all_gather, broadcast, all_to_all, all_to_all_v";

std::vector<OpKind> parse_ops(const std::string& s) {
  std::vector<OpKind> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item == "all_reduce") out.push_back(OpKind::all_reduce);
    else if (item == "reduce_scatter") out.push_back(OpKind::reduce_scatter);
    else if (item == "all_gather") out.push_back(OpKind::all_gather);
    else if (item == "broadcast") out.push_back(OpKind::broadcast);
    else if (item == "all_to_all") out.push_back(OpKind::all_to_all);
    else if (item == "all_to_all_v") out.push_back(OpKind::all_to_all_v);
    else throw InputError(str("--ops: unknown operation '", item, "' (choose from ", kOpNames, ")"));
  }
  MT_CHECK_INPUT(!out.empty(), "--ops is empty");
  return out;
}

double bus_factor(OpKind k, int n) {
  if (n <= 1 || k == OpKind::broadcast) return 1.0;
  return k == OpKind::all_reduce ? 2.0 * (n - 1) / n : double(n - 1) / n;
}

// One measured row; rank 0 fills these in shared memory for the supervisor to print.
struct Row {
  int op;
  uint64_t bytes;  // the size asked for (the table's key)
  uint64_t moved;  // S: bytes one call moves (all_to_all rounds to whole blocks)
  double time_us;
  int ok;  // 1 correct, 0 wrong, -1 not checked
  int algo;
  int nt_pct;  // share of rank 0's copies into shared memory made with streaming stores (comm/copy.h), -1 none
  int stores;  // kStoresAuto / kStoresOrdinary / kStoresStreaming
  double bound_us;  // --bound: the single-copy bound's time at this size (header), else -1
};
constexpr int kMaxRows = 512;
constexpr double kStartupWarmSeconds = 0.3;
struct Results {
  int nrows;
  Row rows[kMaxRows];
  int shared_buffers;                           // rank 0's buffers lie in the shared heap
  comm::shm::PeerReads reads;                   // rank 0's single-copy reads of peers' memory, by path
};

std::vector<size_t> sizes_of(const BenchConfig& c) {
  std::vector<size_t> out;
  for (size_t s = parse_bytes("--min-bytes", c.min_bytes); s <= parse_bytes("--max-bytes", c.max_bytes); s *= 2)
    out.push_back(s);
  return out;
}

float pattern(int r, size_t i) { return float(r + 1) + float(i % 7); }
// all_to_all: element i of the block rank r sends to rank q (exact in bf16: at most 127).
float a2a_pattern(int r, int q, int n, size_t i) { return float((r * n + q) % 120 + 1) + float(i % 7); }
bool is_a2a(OpKind k) { return k == OpKind::all_to_all || k == OpKind::all_to_all_v; }

// Time one op at one size: returns the slowest rank's mean microseconds per call in its fastest batch. The
// budget is cut into batches of about kBatchSeconds (at least one call, at least kMinBatches batches): on a
// shared host another process's time slice lands in some batches and not in others, and the fastest batch
// is the collective's own speed. Both peers are timed by this function.
constexpr double kBatchSeconds = 2e-3;
constexpr int kMinBatches = 5, kMaxBatches = 500;
template <typename Run, typename Sync>
double time_op(int rank, double budget_s, Run&& run, Sync&& max_over_ranks) {
  for (int i = 0; i < 2; ++i) run();  // warm-up (page faults, caches)
  auto t0 = Clock::now();
  run();
  const double one = std::max(std::chrono::duration<double>(Clock::now() - t0).count(), 1e-7);
  // Every rank must run the same number of iterations: rank 0's choice wins.
  double per = std::clamp(kBatchSeconds / one, 1.0, 100000.0);
  double batches = std::clamp(budget_s / (per * one), double(kMinBatches), double(kMaxBatches));
  per = max_over_ranks(rank == 0 ? per : 0.0);
  batches = max_over_ranks(rank == 0 ? batches : 0.0);
  const long iters = static_cast<long>(per);
  double best = 1e300;
  // On a loaded host a call can take far longer than the warm-up said: stop after kMaxBudgets budgets, when
  // rank 0 says so (every rank must run the same calls).
  constexpr double kMaxBudgets = 3;
  const auto start = Clock::now();
  for (int b = 0; b < static_cast<int>(batches); ++b) {
    t0 = Clock::now();
    for (long i = 0; i < iters; ++i) run();
    best = std::min(best, std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / double(iters));
    const bool over = std::chrono::duration<double>(Clock::now() - start).count() > kMaxBudgets * budget_s;
    if (b + 1 >= kMinBatches && max_over_ranks(rank == 0 && over ? 1.0 : 0.0) > 0) break;
  }
  return max_over_ranks(best);
}

double memcpy_gbps(size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  if (b[bytes / 2] != 1) std::abort();
  return double(bytes) / best / 1e9;
}

// Bytes one call moves per rank, S in the header's formulas: all_to_all(_v) sends whole blocks of
// bytes / n (rounded down to elements).
uint64_t moved_bytes(OpKind k, size_t bytes, size_t e, int n) {
  return is_a2a(k) ? uint64_t(bytes / e / size_t(n)) * n * e : uint64_t(bytes / e) * e;
}

bool has_bound(OpKind k) { return k == OpKind::all_gather || is_a2a(k); }

// Runs every op and size on `w`; rank 0 records rows.
void bench_body(Communicator& w, const BenchConfig& cfg, Results* out) {
  const int n = w.size(), r = w.rank();
  const DType t = comm::parse_dtype(cfg.dtype.c_str());
  const size_t e = comm::dtype_size(t);
  const std::vector<size_t> sizes = sizes_of(cfg);
  const size_t max_count = sizes.empty() ? 0 : sizes.back() / e;
  // --buffers shared (the default): both buffers in the job's shared heap, as training allocates the send buffers of
  // its gathers and all-to-alls (AlignedBuffer::shared), so peers read them with ordinary loads; private: ordinary
  // memory, read through the kernel (process_vm_readv) like OpenMPI's (which has no shared heap: under mpirun the
  // buffers are private either way).
  const size_t buf_bytes = max_count * e + 64;
  const bool shared = cfg.buffers == "shared";
  AlignedBuffer send_buf = shared ? AlignedBuffer::shared(buf_bytes / 4 + 1) : AlignedBuffer(buf_bytes / 4 + 1);
  AlignedBuffer recv_buf = shared ? AlignedBuffer::shared(buf_bytes / 4 + 1) : AlignedBuffer(buf_bytes / 4 + 1);
  char* send = reinterpret_cast<char*>(send_buf.data());
  char* recv = reinterpret_cast<char*>(recv_buf.data());
  auto set = [&](char* buf, size_t i, float v) {
    if (t == DType::f32) {
      std::memcpy(&buf[i * 4], &v, 4);
    } else {
      comm::bf16_t h = comm::f32_to_bf16(v);
      std::memcpy(&buf[i * 2], &h, 2);
    }
  };
  auto get = [&](size_t i) {
    if (t == DType::f32) {
      float v;
      std::memcpy(&v, &recv[i * 4], 4);
      return v;
    }
    comm::bf16_t h;
    std::memcpy(&h, &recv[i * 2], 2);
    return comm::bf16_to_f32(h);
  };
  auto max_over_ranks = [&](double v) {
    float f = float(v);
    w.all_reduce(&f, &f, 1, DType::f32, ReduceOp::max);
    return double(f);
  };
  // A freshly forked job runs slow for its first ~0.1 s (seen on the EPYC KVM host of this work with every
  // build: the first row, a 4 KB all-reduce, at 6.4-7.4 us instead of 0.8 in half the runs, fine with a 0.5 s
  // budget): spend that on barriers before timing anything. Rank 0 decides when, every 64, so all ranks
  // make the same calls.
  const auto warm_start = Clock::now();
  for (long b = 1;; ++b) {
    w.barrier();
    const bool done = std::chrono::duration<double>(Clock::now() - warm_start).count() > kStartupWarmSeconds;
    if (b % 64 == 0 && max_over_ranks(r == 0 && done ? 1.0 : 0.0) > 0) break;
  }
  // --bound: every rank's pid and send buffer address (the buffer is never reallocated).
  struct Peer {
    uint64_t pid, addr;
  };
  std::vector<Peer> peers(static_cast<size_t>(n));
  if (cfg.bound) {
    const Peer mine{uint64_t(getpid()), reinterpret_cast<uint64_t>(send)};
    w.all_gather(&mine, peers.data(), sizeof(Peer) * size_t(n), DType::u8);
  }
  const std::vector<int> store_modes = parse_stores(cfg.stores);
  comm::CopyInPolicy auto_stores = comm::copy_in_policy();  // --stores auto keeps its state across rows
  for (OpKind k : parse_ops(cfg.ops)) {
    for (size_t bytes : sizes) {
      const size_t count = bytes / e;
      const size_t cpr = count / size_t(n);  // all_to_all: elements per block
      if (is_a2a(k)) {
        for (int q = 0; q < n; ++q) {
          for (size_t i = 0; i < cpr; ++i) set(send, q * cpr + i, a2a_pattern(r, q, n, i));
        }
      } else if (k != OpKind::broadcast) {
        for (size_t i = 0; i < count; ++i) set(send, i, pattern(r, i));
      }
      comm::Shard own = comm::shard_of(count, n, r);
      const std::vector<size_t> counts(n, cpr);
      auto run = [&] {
        switch (k) {
          case OpKind::all_reduce: w.all_reduce(send, recv, count, t, ReduceOp::sum); break;
          case OpKind::reduce_scatter: w.reduce_scatter(send, recv, count, t, ReduceOp::sum); break;
          case OpKind::broadcast: w.broadcast(recv, count, t, 0); break;
          case OpKind::all_to_all: w.all_to_all(send, recv, cpr, t); break;
          case OpKind::all_to_all_v:
            w.all_to_all_v(send, counts.data(), nullptr, recv, counts.data(), nullptr, t);
            break;
          default: w.all_gather(send + own.offset * e, recv, count, t); break;
        }
      };
      for (int mode : store_modes) {
        // Outputs start wrong (NaN; broadcast: -1 off the root), so a row checks its own calls only.
        std::memset(recv, 0xFF, buf_bytes);
        if (k == OpKind::broadcast) {
          for (size_t i = 0; i < count; ++i) set(recv, i, r == 0 ? pattern(0, i) : -1.f);
        }
        comm::CopyInPolicy& stores = comm::copy_in_policy();
        stores = mode == kStoresAuto ? auto_stores : comm::CopyInPolicy::fixed(mode == kStoresStreaming);
        const int64_t nt0 = stores.streamed_copies(), ord0 = stores.ordinary_copies();
        double us = time_op(r, cfg.seconds_per_size, run, max_over_ranks);
        const int64_t nt = stores.streamed_copies() - nt0, all = nt + stores.ordinary_copies() - ord0;
        if (mode == kStoresAuto) auto_stores = stores;
        // Whether recv holds this collective's output on every rank (a collective call on w).
        auto recv_ok_everywhere = [&] {
          int ok = 1;
          const float tri = float(n * (n + 1) / 2);
          size_t m = k == OpKind::reduce_scatter ? own.count : is_a2a(k) ? cpr * n : count;
          for (size_t i = 0; i < m && ok; ++i) {
            size_t gi = k == OpKind::reduce_scatter ? own.offset + i : i;
            float want = tri + float(n) * float(gi % 7);
            if (k == OpKind::all_gather) {
              int owner = 0;
              while (owner + 1 < n && comm::shard_of(count, n, owner + 1).offset <= gi) ++owner;
              want = pattern(owner, gi);
            } else if (k == OpKind::broadcast) {
              want = pattern(0, i);
            } else if (is_a2a(k)) {
              want = a2a_pattern(int(i / cpr), r, n, i % cpr);
            }
            if (get(i) != want) ok = 0;
          }
          float bad = ok ? 0.f : 1.f;
          w.all_reduce(&bad, &bad, 1, DType::f32, ReduceOp::max);
          return bad == 0.f;
        };
        int ok = -1;
        if (cfg.check) ok = recv_ok_everywhere() ? 1 : 0;
        double bound_us = -1;
        if (cfg.bound && has_bound(k) && n > 1) {
          // The single-copy bound (header): the peers' shards by process_vm_readv, the own one by memcpy.
          const size_t moved = moved_bytes(k, bytes, e, n) / e;
          bool copied = true;
          // all_gather reads peer q's shard (at q's offset of the send buffer the row passed); all_to_all(_v) reads
          // block r of peer q's send buffer (at r's offset), so that, as in the collective, every byte of every send
          // buffer is read once per call (reading block q of q instead halves the send buffers' footprint: 8 MB
          // all_to_all on a 32 MB L3 then ran at the 24 MB footprint of all_gather, not at the collective's 32 MB).
          const bool a2a_bound = is_a2a(k);
          // The bound reads as the collectives do: with loads from a peer's buffer in the shared heap (--buffers
          // shared), else with process_vm_readv; not counted in peer_reads().
          auto bound_read = [](int pid, char* dst, uint64_t addr, size_t len) {
            const void* from = reinterpret_cast<const void*>(addr);
            if (!shared_heap::contains(from, len)) return comm::shm::cma_copy(pid, dst, addr, len, false);
            comm::copy_in_pieces(dst, from, len);
            return true;
          };
          auto bound = [&] {
            for (int i = 1; i < n; ++i) {
              const int q = (r + i) % n;
              const comm::Shard s = comm::shard_of(moved, n, q);
              const size_t from = a2a_bound ? comm::shard_of(moved, n, r).offset : s.offset;
              copied = bound_read(int(peers[q].pid), recv + s.offset * e, peers[q].addr + from * e, s.count * e) &&
                       copied;
            }
            const comm::Shard s = comm::shard_of(moved, n, r);
            std::memcpy(recv + s.offset * e, send + s.offset * e, s.count * e);
          };
          std::memset(recv, 0xFF, buf_bytes);
          bound_us = time_op(r, cfg.seconds_per_size, bound, max_over_ranks);
          if (max_over_ranks(copied ? 0.0 : 1.0) > 0) {
            bound_us = -1;  // the kernel refused (ptrace rules)
          } else if (cfg.check) {
            // The bound's copies must move exactly the collective's bytes (its output is the collective's).
            MT_REQUIRE(Error, recv_ok_everywhere(), "bench comm --bound: the bound's copies for ",
                       comm::op_kind_name(k), " at ", bytes, " bytes did not produce the collective's output");
          }
        }
        if (r == 0 && out->nrows < kMaxRows) {
          comm::Algo a = w.algorithm();
          if (a == comm::Algo::automatic) a = bytes <= 32 * 1024 || n == 1 ? comm::Algo::direct : comm::Algo::rs_ag;
          if (k != OpKind::all_reduce) a = comm::Algo::automatic;
          out->rows[out->nrows++] = Row{int(k), bytes, moved_bytes(k, bytes, e, n), us, ok, int(a),
                                        all ? int(100 * nt / all) : -1, mode, bound_us};
        }
      }
    }
  }
  if (r == 0) {
    out->shared_buffers = send_buf.in_shared_heap() && recv_buf.in_shared_heap();
    out->reads = comm::shm::peer_reads();
  }
}

#ifdef MESHTRAIN_HAVE_MPI
// The OpenMPI peer: the same loop with MPI's own calls. Prints "native <op> <bytes> <time_us>" on rank 0.
int run_native_mpi(const BenchConfig& cfg) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) MPI_Init(nullptr, nullptr);
  int r, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MT_CHECK_INPUT(cfg.dtype == "f32", "--mpi-native supports --dtype f32 only (OpenMPI has no bf16)");
  const std::vector<size_t> sizes = sizes_of(cfg);
  const size_t max_count = sizes.empty() ? 0 : sizes.back() / 4;
  std::vector<float> send(max_count + 16), recv(max_count + 16);
  for (size_t i = 0; i < send.size(); ++i) send[i] = pattern(r, i);
  auto max_over_ranks = [&](double v) {
    double o;
    MPI_Allreduce(&v, &o, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return o;
  };
  for (OpKind k : parse_ops(cfg.ops)) {
    for (size_t bytes : sizes) {
      const int count = static_cast<int>(bytes / 4);
      std::vector<int> counts(n), displs(n);
      for (int p = 0; p < n; ++p) {
        counts[p] = int(comm::shard_of(count, n, p).count);
        displs[p] = int(comm::shard_of(count, n, p).offset);
      }
      const int cpr = count / n;  // all_to_all: elements per block
      std::vector<int> a2a_counts(n, cpr), a2a_displs(n);
      for (int p = 0; p < n; ++p) a2a_displs[p] = p * cpr;
      auto run = [&] {
        switch (k) {
          case OpKind::all_reduce:
            MPI_Allreduce(send.data(), recv.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            break;
          case OpKind::reduce_scatter:
            MPI_Reduce_scatter(send.data(), recv.data(), counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            break;
          case OpKind::broadcast: MPI_Bcast(recv.data(), count, MPI_FLOAT, 0, MPI_COMM_WORLD); break;
          case OpKind::all_to_all:
            MPI_Alltoall(send.data(), cpr, MPI_FLOAT, recv.data(), cpr, MPI_FLOAT, MPI_COMM_WORLD);
            break;
          case OpKind::all_to_all_v:
            MPI_Alltoallv(send.data(), a2a_counts.data(), a2a_displs.data(), MPI_FLOAT, recv.data(), a2a_counts.data(),
                          a2a_displs.data(), MPI_FLOAT, MPI_COMM_WORLD);
            break;
          default:
            MPI_Allgatherv(send.data(), counts[r], MPI_FLOAT, recv.data(), counts.data(), displs.data(), MPI_FLOAT,
                           MPI_COMM_WORLD);
            break;
        }
      };
      double us = time_op(r, cfg.seconds_per_size, run, max_over_ranks);
      if (r == 0) std::printf("native %s %zu %.3f\n", comm::op_kind_name(k), bytes, us);
    }
  }
  std::fflush(stdout);
  MPI_Finalize();
  return 0;
}
#endif

// Starts the OpenMPI peer and returns (op, bytes) -> time_us; empty if it could not run.
std::map<std::pair<int, size_t>, double> run_mpi_peer(const BenchConfig& cfg, int n, std::string* note) {
  std::map<std::pair<int, size_t>, double> out;
#ifndef MESHTRAIN_HAVE_MPI
  *note = "built without MPI: no OpenMPI comparison";
  return out;
#else
  char self[4096];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    *note = "cannot find this binary's path for mpirun";
    return out;
  }
  self[len] = 0;
  std::string cmd = str("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to none -np ",
                        n, " ", self, " bench comm --mpi-native --ops ", cfg.ops, " --min-bytes ", cfg.min_bytes,
                        " --max-bytes ", cfg.max_bytes, " --seconds-per-size ", cfg.seconds_per_size, " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    *note = "could not start mpirun";
    return out;
  }
  char line[1024];
  std::string other;
  while (std::fgets(line, sizeof line, p)) {
    char op[64];
    size_t bytes;
    double us;
    if (std::sscanf(line, "native %63s %zu %lf", op, &bytes, &us) == 3) {
      for (int k = 0; k < comm::kNumOpKinds; ++k) {
        if (std::string(comm::op_kind_name(OpKind(k))) == op) out[{k, bytes}] = us;
      }
    } else if (other.size() < 2000) {
      other += line;
    }
  }
  int rc = pclose(p);
  if (rc != 0 || out.empty()) *note = str("the OpenMPI peer failed (", cmd, "): ", other);
  return out;
#endif
}

void print_report(const BenchConfig& cfg, int n, const std::string& backend, const Results& res, double memcpy_bw,
                  const std::map<std::pair<int, size_t>, double>& mpi, const std::string& note) {
  std::printf("# meshtrain bench comm: %d ranks, backend %s, dtype %s, algo %s\n", n, backend.c_str(), cfg.dtype.c_str(),
              cfg.algo.c_str());
  if (memcpy_bw > 0) std::printf("# memcpy bandwidth (1 thread, 256 MB): %.2f GB/s\n", memcpy_bw);
  std::printf("# S = full buffer (all_reduce, reduce_scatter, all_gather, broadcast), one rank's send buffer "
              "(all_to_all, all_to_all_v); algbw = S / time\n");
  std::printf("# busbw = algbw * 2(n-1)/n for all_reduce, algbw * (n-1)/n for reduce_scatter, all_gather, "
              "all_to_all(_v), algbw * 1 for broadcast\n");
  std::printf("# time = slowest rank's mean per call in its fastest batch (batches of ~%.0f ms or 1 call, %d..%d per "
              "size), best of %d round(s)\n", kBatchSeconds * 1e3, kMinBatches, kMaxBatches, cfg.rounds);
  std::printf("# ratio = our busbw / OpenMPI busbw (same sizes, ranks, machine, this run); >1 is faster\n");
  if (cfg.bound)
    std::printf("# bound = single-copy bound at that size, back to back with the row (--bound: each rank reads the "
                "peers' shards as our collectives do, with loads from buffers in the shared heap, else with "
                "process_vm_readv, and memcpys its own, all at once, no synchronisation); "
                "ours/bnd, mpi/bnd = bound time / that side's time (1.00 = at the bound)\n");
  std::printf("# stores = how copies into shared memory were stored (--stores: auto = chosen at run time from the "
              "measured rate of ordinary stores, ord, nt = streaming); nt%% = share of rank 0's copies streamed\n");
  std::printf("# buffers = %s (--buffers %s; shared: in the job's shared heap, where a peer's send buffer is read with "
              "ordinary loads; private: ordinary memory, read through the kernel with process_vm_readv, as OpenMPI "
              "reads its own)\n",
              res.shared_buffers ? "shared" : "private", cfg.buffers.c_str());
  std::printf("# rank 0's single-copy reads of peers' memory: %.1f MB in %llu calls by ordinary loads, %.1f MB in %llu "
              "calls by process_vm_readv (the bound's own not counted)\n",
              double(res.reads.direct_bytes) / 1e6, (unsigned long long)res.reads.direct_calls,
              double(res.reads.kernel_bytes) / 1e6, (unsigned long long)res.reads.kernel_calls);
  if (!note.empty()) std::printf("# note: %s\n", note.c_str());
  int last_op = -1;
  for (int i = 0; i < res.nrows; ++i) {
    const Row& row = res.rows[i];
    const OpKind k = OpKind(row.op);
    if (row.op != last_op) {
      last_op = row.op;
      std::printf("#\n# %s\n", comm::op_kind_name(k));
      std::printf("# %12s %11s %5s %7s %10s %8s %8s %6s %10s %8s %6s %8s %6s %4s", "size(B)", "count", "type",
                  "algo", "time(us)", "algbw", "busbw", "check", "mpi(us)", "mpibus", "ratio", "bus/mcpy", "stores",
                  "nt%");
      if (cfg.bound && has_bound(k)) std::printf(" %10s %8s %8s", "bnd(us)", "ours/bnd", "mpi/bnd");
      std::printf("\n");
    }
    const double algbw = double(row.moved) / (row.time_us * 1e-6) / 1e9;
    const double busbw = algbw * bus_factor(k, n);
    const char* check = row.ok == 1 ? "ok" : row.ok == 0 ? "WRONG" : "-";
    auto it = mpi.find({row.op, size_t(row.bytes)});
    std::string mpi_us = "-", mpi_bus = "-", ratio = "-";
    if (it != mpi.end()) {
      const double mbus = double(row.moved) / (it->second * 1e-6) / 1e9 * bus_factor(k, n);
      mpi_us = str(std::fixed, std::setprecision(1), it->second);
      mpi_bus = str(std::fixed, std::setprecision(2), mbus);
      ratio = str(std::fixed, std::setprecision(2), busbw / mbus);
    }
    const std::string nt = row.nt_pct < 0 ? "-" : std::to_string(row.nt_pct);
    std::printf("  %12llu %11llu %5s %7s %10.1f %8.2f %8.2f %6s %10s %8s %6s %8.2f %6s %4s", (unsigned long long)row.bytes,
                (unsigned long long)(row.bytes / comm::dtype_size(comm::parse_dtype(cfg.dtype.c_str()))),
                cfg.dtype.c_str(),
                backend == "mpi" ? "mpi" : k == OpKind::all_reduce ? comm::algo_name(comm::Algo(row.algo)) : "-",
                row.time_us,
                algbw, busbw, check, mpi_us.c_str(), mpi_bus.c_str(), ratio.c_str(),
                memcpy_bw > 0 ? busbw / memcpy_bw : 0.0, kStoresNames[row.stores], nt.c_str());
    if (cfg.bound && has_bound(k)) {
      if (row.bound_us > 0) {
        std::printf(" %10.1f %8.2f %8s", row.bound_us, row.bound_us / row.time_us,
                    it != mpi.end() ? str(std::fixed, std::setprecision(2), row.bound_us / it->second).c_str() : "-");
      } else {
        std::printf(" %10s %8s %8s", "-", "-", "-");
      }
    }
    std::printf("\n");
  }
  std::fflush(stdout);
}

// The sizes against the ranks and the machine, before anything is allocated. Each rank holds a send and a
// receive buffer of --max-bytes (touched whole), and the supervisor two 256 MB buffers for the memcpy yardstick.
void check_sizes(const BenchConfig& cfg) {
  const size_t lo = parse_bytes("--min-bytes", cfg.min_bytes), hi = parse_bytes("--max-bytes", cfg.max_bytes);
  MT_CHECK_INPUT(lo <= hi, "--min-bytes ", cfg.min_bytes, " is larger than --max-bytes ", cfg.max_bytes);
  const int n = cfg.launch.nproc < 1 ? 1 : cfg.launch.nproc;
  const size_t e = comm::dtype_size(comm::parse_dtype(cfg.dtype.c_str()));
  // all_to_all sends blocks of size / n: below one element per rank an operation would time an empty buffer.
  MT_CHECK_INPUT(lo >= e * size_t(n), "--min-bytes ", cfg.min_bytes, " is less than one ", cfg.dtype,
                 " element per rank (", e, " bytes x ", n, " ranks = ", e * n, " bytes)");
  const double need = 2.0 * double(hi) * n + (512.0 * 1024 * 1024), avail = available_memory_bytes();
  MT_CHECK_INPUT(avail == 0 || need <= avail, "--max-bytes ", cfg.max_bytes, " needs about ", gib(need),
                 " (a send and a receive buffer of ", gib(double(hi)), " on each of ", n,
                 " ranks, and 512 MiB for the memcpy yardstick) but this machine has ", gib(avail),
                 " available (MemAvailable in /proc/meminfo); lower --max-bytes or --nproc");
}

int run_bench(BenchConfig cfg) {
#ifdef MESHTRAIN_HAVE_MPI
  if (cfg.mpi_native) return run_native_mpi(cfg);
#else
  MT_CHECK_INPUT(!cfg.mpi_native, "--mpi-native needs a build with MPI");
#endif
  MT_CHECK_INPUT(cfg.launch.nproc >= 1 && cfg.launch.nproc <= comm::shm::kMaxRanks, "--nproc ", cfg.launch.nproc,
                 " is out of range 1..", comm::shm::kMaxRanks);
  comm::validate(cfg.launch);
  cfg.launch.algo = comm::parse_algo(cfg.algo.c_str());
  comm::parse_dtype(cfg.dtype.c_str());
  parse_ops(cfg.ops);
  parse_stores(cfg.stores);
  MT_CHECK_INPUT(cfg.rounds >= 1 && cfg.rounds <= 100, "--rounds ", cfg.rounds, " is out of range 1..100");
  // A row may take up to 3 budgets (time_op): an hour per size is far past any useful measurement.
  MT_CHECK_INPUT(cfg.seconds_per_size > 0 && cfg.seconds_per_size <= 3600, "--seconds-per-size ", cfg.seconds_per_size,
                 " is out of range (0, 3600]");
  check_sizes(cfg);
  const std::string backend = comm::resolve_backend(cfg.launch);
  // Results travel from rank 0 to the supervisor through an anonymous shared mapping made before the fork.
  void* mem = mmap(nullptr, sizeof(Results), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  MT_REQUIRE(Error, mem != MAP_FAILED, "mmap of the results page failed");
  auto* res = new (mem) Results{};
  const double mbw = backend == "shm" ? memcpy_gbps(size_t{256} << 20) : 0.0;
  const int n = cfg.launch.nproc < 1 ? 1 : cfg.launch.nproc;
  // Rounds alternate our run and the OpenMPI peer's; each keeps its best time per row.
  Results best{};
  std::string note;
  std::map<std::pair<int, size_t>, double> mpi;
  for (int round = 0; round < cfg.rounds; ++round) {
    res->nrows = 0;
    int rc = comm::launch(cfg.launch, [&](Communicator& w) {
      bench_body(w, cfg, res);
      if (backend == "mpi" && w.rank() == 0) {
        print_report(cfg, w.size(), backend, *res, 0.0, {}, "under mpirun: no OpenMPI peer run; memcpy not measured");
      }
    });
    if (rc != 0 || backend == "mpi") {
      munmap(mem, sizeof(Results));
      return rc;
    }
    if (round == 0) {
      best = *res;
    } else {
      for (int i = 0; i < best.nrows && i < res->nrows; ++i) {
        if (res->rows[i].time_us < best.rows[i].time_us) {
          best.rows[i].time_us = res->rows[i].time_us;
          best.rows[i].nt_pct = res->rows[i].nt_pct;
        }
        if (res->rows[i].bound_us > 0 && (best.rows[i].bound_us <= 0 || res->rows[i].bound_us < best.rows[i].bound_us))
          best.rows[i].bound_us = res->rows[i].bound_us;
        if (res->rows[i].ok == 0) best.rows[i].ok = 0;
      }
    }
    if (cfg.mpi_peer && cfg.dtype == "f32") {
      for (const auto& [key, us] : run_mpi_peer(cfg, n, &note)) {
        auto it = mpi.find(key);
        if (it == mpi.end() || us < it->second) mpi[key] = us;
      }
    } else if (cfg.mpi_peer) {
      note = "no OpenMPI comparison for bf16 (OpenMPI has no bf16 type)";
    }
  }
  *res = best;
  print_report(cfg, n, backend, *res, mbw, mpi, note);
  int wrong = 0;
  for (int i = 0; i < res->nrows; ++i) wrong += res->rows[i].ok == 0;
  munmap(mem, sizeof(Results));
  MT_REQUIRE(Error, wrong == 0, wrong, " benchmark rows produced wrong results (see the check column)");
  return 0;
}

}  // namespace

void add_bench_comm_command(CLI::App& bench) {
  auto cfg = std::make_shared<BenchConfig>();
  cfg->launch.nproc = 2;
  CLI::App* sub = bench.add_subcommand("comm", "collective bandwidth (nccl-tests style) against OpenMPI in one run");
  sub->add_option("--nproc", cfg->launch.nproc,
                  "ranks to fork (shm; each bound to a CPU of its own when they fit the allowed CPUs, "
                  "MESHTRAIN_SHM_BIND=0: not); ignored under mpirun")
      ->capture_default_str();
  sub->add_option("--backend", cfg->launch.backend, "auto | shm | mpi")->capture_default_str();
  sub->add_option("--comm-timeout", cfg->launch.timeout_s, "deadline of every blocking call, seconds")
      ->capture_default_str();
  sub->add_option("--ops", cfg->ops, str("comma-separated: ", kOpNames))->capture_default_str();
  sub->add_option("--dtype", cfg->dtype, "f32 | bf16")->capture_default_str();
  sub->add_option("--algo", cfg->algo, "all-reduce algorithm: auto | direct | rs_ag")->capture_default_str();
  sub->add_option("--min-bytes", cfg->min_bytes, "smallest message (K, M, G suffixes)")->capture_default_str();
  sub->add_option("--max-bytes", cfg->max_bytes, "largest message; sizes double from min to max")->capture_default_str();
  sub->add_option("--seconds-per-size", cfg->seconds_per_size, "time budget per row")->capture_default_str();
  sub->add_option("--rounds", cfg->rounds, "alternate our run and OpenMPI's this many times; best time per row")
      ->capture_default_str();
  sub->add_flag("!--no-check", cfg->check, "skip checking results");
  sub->add_option("--stores", cfg->stores,
                  "stores of copies into shared memory, comma-separated: auto (chosen at run time) | ordinary | "
                  "streaming; several give one row each per size")
      ->capture_default_str();
  sub->add_flag("--bound", cfg->bound,
                "shm: after each all_gather / all_to_all(_v) row, time the single-copy bound at that size (each rank "
                "reads its peers' shards as our collectives do, copies its own; ours/bnd and mpi/bnd columns)");
  sub->add_option("--buffers", cfg->buffers,
                  "shared: send and receive buffers in the job's shared heap, where peers read them with ordinary "
                  "loads (as training's collective buffers) | private: ordinary memory, read through the kernel")
      ->check(CLI::IsMember({"shared", "private"}))
      ->capture_default_str();
  sub->add_flag("!--no-mpi-peer", cfg->mpi_peer, "do not run OpenMPI's collectives for comparison");
  sub->add_flag("--mpi-native", cfg->mpi_native, "internal: time OpenMPI's own collectives (run under mpirun)")
      ->group("");
  // The last occurrence of a flag wins, so scripts can pass defaults and users override them.
  for (CLI::Option* opt : sub->get_options()) opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  sub->callback([cfg] {
    int rc = run_bench(*cfg);
    if (rc != 0) throw CommError(str("bench comm failed (exit code ", rc, "); see the rank errors above"));
  });
}

}  // namespace mt::cli
