#include "comm/mpi/mpi_comm.h"

#include <sched.h>
#include <time.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "comm/deadline.h"
#include "comm/mpi/hier_allgather.h"
#include "comm/mpi/mpi_flight.h"
#include "comm/reduce.h"
#include "core/env.h"
#include "core/error.h"

namespace mt::comm::mpi {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw CommError(str(what, " failed: ", std::string(msg, len)));
}


namespace {

using Clock = std::chrono::steady_clock;

int to_int(size_t n, const CollArgs& a) {
  MT_REQUIRE(CommError, n <= static_cast<size_t>(INT_MAX), describe(a), ": ", n,
             " elements exceed MPI's int counts; split the message");
  return static_cast<int>(n);
}

MPI_Datatype move_type(DType t) {
  return t == DType::f32 ? MPI_FLOAT : t == DType::bf16 ? MPI_UINT16_T : MPI_UINT8_T;
}

std::vector<float> widen(const void* src, size_t n) {
  std::vector<float> out(n);
  const bf16_t* s = static_cast<const bf16_t*>(src);
  for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(s[i]);
  return out;
}

// Final step of a reduction computed in float32: divide for avg, round to the output type.
void finish(const float* acc, void* out, size_t n, DType t, ReduceOp op, int size) {
  const void* srcs[1] = {acc};
  if (t == DType::f32 && op != ReduceOp::avg) {
    if (out != acc) std::memcpy(out, acc, n * 4);
    return;
  }
  std::vector<float> tmp;
  if (t == DType::f32) {
    reduce_into(out, srcs, 1, n, DType::f32, op, size);
    return;
  }
  tmp.resize(n);
  reduce_into(tmp.data(), srcs, 1, n, DType::f32, op, size);  // avg division (or copy) in float32
  bf16_t* o = static_cast<bf16_t*>(out);
  for (size_t i = 0; i < n; ++i) o[i] = f32_to_bf16(tmp[i]);
}

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  const char *x = static_cast<const char*>(a), *y = static_cast<const char*>(b);
  return an && bn && x < y + bn && y < x + an;
}

}  // namespace

void wait_requests(int n, MPI_Request* reqs, double timeout_s, const std::function<std::string()>& what,
                   const std::function<int()>& waited_world, MPI_Status* statuses) {
  const auto until = deadline_after<Clock>(timeout_s);
  std::vector<int> idx(static_cast<size_t>(n));
  std::vector<MPI_Status> st(static_cast<size_t>(n));
  int left = n;
  for (int i = 0;; ++i) {
    int got = 0;
    check_mpi(MPI_Testsome(n, reqs, &got, idx.data(), st.data()), "MPI_Testsome");
    if (got == MPI_UNDEFINED) return;  // every request already complete (MPI_REQUEST_NULL)
    for (int k = 0; k < got; ++k) {
      if (statuses) statuses[idx[k]] = st[static_cast<size_t>(k)];
    }
    left -= got;
    if (left == 0) return;
    if (i < 2000) continue;  // spin briefly: MPI progresses inside MPI_Test*
    if (Clock::now() > until) {
      const int w = waited_world ? waited_world() : -1;
      const std::string msg = str(what(), " timed out after ", timeout_s, " s (--comm-timeout)",
                                  w >= 0 ? str(" waiting for world rank ", w) : std::string(),
                                  "; a peer is stalled, dead, or not calling this operation");
      if (w >= 0) throw CommTimeoutError(msg, w);
      throw CommError(msg);
    }
    if (i < 4000) {
      sched_yield();
    } else {
      timespec ts{0, 50'000};
      nanosleep(&ts, nullptr);
    }
  }
}

void wait_request(MPI_Request* req, double timeout_s, const std::function<std::string()>& what, MPI_Status* status,
                  int waited_world) {
  wait_requests(1, req, timeout_s, what, waited_world >= 0 ? std::function<int()>([=] { return waited_world; })
                                                            : std::function<int()>(), status);
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name)
    : Communicator(
          [&] {
            int r;
            MPI_Comm_rank(comm, &r);
            return r;
          }(),
          [&] {
            int s;
            MPI_Comm_size(comm, &s);
            return s;
          }(),
          std::move(name)) {
  check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
  check_mpi(MPI_Comm_dup(comm, &desc_comm_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(desc_comm_, MPI_ERRORS_RETURN);
  MPI_Group mine, world;
  MPI_Comm_group(comm_, &mine);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> ranks(static_cast<size_t>(size()));
  for (int p = 0; p < size(); ++p) ranks[p] = p;
  world_of_.assign(ranks.size(), MPI_UNDEFINED);
  MPI_Group_translate_ranks(mine, size(), ranks.data(), world, world_of_.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
  // MESHTRAIN_MPI_HIER: unset = all-gather hierarchical, all-reduce hierarchical where it sends fewer bytes
  // between hosts than OpenMPI's own (HierAllReduce::default_for); 1 = both hierarchical; 0 = neither (and no
  // host detection).
  const std::optional<bool> hier = env_flag("MESHTRAIN_MPI_HIER");
  if (hier != false) hosts_ = HierAllReduce::for_hosts_of(comm_);
  hier_all_reduce_ = hosts_ && (hier == true || (!hier && HierAllReduce::default_for(size())));
  hier_all_gather_ = hosts_ != nullptr;
}

int MpiCommunicator::world_rank_of(int p) const {
  const int w = world_of_.at(static_cast<size_t>(p));
  return w == MPI_UNDEFINED ? -1 : w;
}

MpiCommunicator::~MpiCommunicator() {
  stop_progress_thread();
  hosts_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  if (!finalized && desc_comm_ != MPI_COMM_NULL) MPI_Comm_free(&desc_comm_);
}

void MpiCommunicator::check_descriptor(const CollArgs& a) {
  const bool reducing = a.kind == OpKind::all_reduce || a.kind == OpKind::reduce || a.kind == OpKind::reduce_scatter;
  uint64_t mine[4] = {a.seq, a.kind == OpKind::all_to_all_v ? 0 : a.count,
                      uint64_t(a.kind) | uint64_t(a.dtype) << 8 | uint64_t(reducing ? uint8_t(a.op) : 0) << 16,
                      uint64_t((a.kind == OpKind::broadcast || a.kind == OpKind::reduce) ? a.root : 0)};
  // Point-to-point on a private duplicate (not MPI_Iallgather) so a timeout knows which peers never arrived.
  const int n = size(), me = rank();
  std::vector<uint64_t> all(4 * size_t(n));
  std::memcpy(&all[4 * size_t(me)], mine, sizeof mine);
  std::vector<MPI_Request> reqs;  // receives first: reqs[0..n-2] are from the peers in rank order
  std::vector<int> from;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    reqs.emplace_back();
    from.push_back(p);
    check_mpi(MPI_Irecv(&all[4 * size_t(p)], 4, MPI_UINT64_T, p, 0, desc_comm_, &reqs.back()), "MPI_Irecv");
  }
  const size_t nrecv = reqs.size();
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    reqs.emplace_back();
    check_mpi(MPI_Isend(mine, 4, MPI_UINT64_T, p, 0, desc_comm_, &reqs.back()), "MPI_Isend");
  }
  auto missing = [&] {  // the first peer whose descriptor never came: the rank this one waited for
    for (size_t k = 0; k < nrecv; ++k) {
      if (reqs[k] != MPI_REQUEST_NULL) return world_rank_of(from[k]);
    }
    return -1;
  };
  wait_requests(static_cast<int>(reqs.size()), reqs.data(), a.timeout_s,
                [&] { return str(describe(a), " on group '", name(), "' (rank ", me, ")"); }, missing, nullptr);
  for (int p = 0; p < size(); ++p) {
    const uint64_t* d = &all[4 * size_t(p)];
    if (std::memcmp(d, mine, sizeof mine) == 0) continue;
    CollArgs t;
    t.seq = d[0];
    t.count = d[1];
    t.kind = static_cast<OpKind>(d[2] & 0xff);
    t.dtype = static_cast<DType>((d[2] >> 8) & 0xff);
    t.op = static_cast<ReduceOp>((d[2] >> 16) & 0xff);
    t.root = static_cast<int>(d[3]);
    throw CommError(str("mismatched collectives on group '", name(), "': rank ", rank(), " called ", describe(a),
                        " but rank ", p, " called ", describe(t),
                        "; every rank of a group must issue the same collectives in the same order"));
  }
}

void MpiCommunicator::run_reducing(const CollArgs& a) {
  const int n = size(), r = rank();
  const size_t e = dtype_size(a.dtype);
  const MPI_Op mop = a.op == ReduceOp::max ? MPI_MAX : MPI_SUM;
  const bool f32 = a.dtype == DType::f32;
  auto what = [&] { return str(describe(a), " on group '", name(), "' (rank ", r, ")"); };
  MPI_Request req;
  if (a.kind == OpKind::all_reduce && hier_all_reduce_) {
    std::vector<float> in, acc;
    const float* src = static_cast<const float*>(a.send);
    float* dst = static_cast<float*>(a.recv);
    if (!f32) {
      in = widen(a.send, a.count);
      src = in.data();
      acc.resize(a.count);
      dst = acc.data();
    }
    hosts_->run(src, dst, a.count, a.op, a.timeout_s, what);
    finish(dst, a.recv, a.count, a.dtype, a.op, n);
    return;
  }
  if (a.kind == OpKind::all_reduce || a.kind == OpKind::reduce) {
    const bool out_here = a.kind == OpKind::all_reduce || r == a.root;
    const int cnt = to_int(a.count, a);
    std::vector<float> in, acc;
    const void* sbuf = a.send;
    float* rbuf = static_cast<float*>(a.recv);
    if (!f32) {
      in = widen(a.send, a.count);
      sbuf = in.data();
    }
    if (!f32 || !out_here) {
      acc.resize(out_here ? a.count : 0);
      rbuf = acc.data();
    }
    if (f32 && a.send == a.recv) sbuf = MPI_IN_PLACE;
    if (a.kind == OpKind::all_reduce) {
      check_mpi(MPI_Iallreduce(sbuf, rbuf, cnt, MPI_FLOAT, mop, comm_, &req), "MPI_Iallreduce");
    } else {
      if (sbuf == MPI_IN_PLACE && r != a.root) sbuf = a.send;
      check_mpi(MPI_Ireduce(sbuf, rbuf, cnt, MPI_FLOAT, mop, a.root, comm_, &req), "MPI_Ireduce");
    }
    wait_request(&req, a.timeout_s, what);
    if (out_here) finish(rbuf, a.recv, a.count, a.dtype, a.op, n);
    return;
  }
  // reduce_scatter over the balanced partition
  std::vector<int> counts(n);
  for (int p = 0; p < n; ++p) counts[p] = to_int(shard_of(a.count, n, p).count, a);
  const size_t mine = shard_of(a.count, n, r).count;
  std::vector<float> in, acc(mine);
  const void* sbuf = a.send;
  if (!f32) {
    in = widen(a.send, a.count);
    sbuf = in.data();
  }
  check_mpi(MPI_Ireduce_scatter(sbuf, acc.data(), counts.data(), MPI_FLOAT, mop, comm_, &req), "MPI_Ireduce_scatter");
  wait_request(&req, a.timeout_s, what);
  finish(acc.data(), a.recv, mine, a.dtype, a.op, n);
  (void)e;
}

// A collective's own wait (MPI_I* then wait_requests) cannot say whom it waited for; the descriptor exchange before
// it can (check_descriptor). So when the collective itself times out, this rank probes the group's peers over the
// descriptor context (tag kProbeTag): every peer that has timed out in the same place answers, and the first peer
// in group order that does not within kProbeSeconds is the rank this one waited for (CommTimeoutError carries it
// to the headline and the flight recorder's ring file: `meshtrain flight` names a cut link from these waits,
// flight_verdict.h). A peer still busy elsewhere, stalled, dead or behind a cut link does not answer. The probe
// adds at most kProbeSeconds to a failure, nothing to a collective that completes. Probe messages that arrive
// after this rank gave up stay unmatched on the descriptor context (tag kProbeTag only: never a descriptor).
namespace {
constexpr int kProbeTag = 1;
constexpr double kProbeSeconds = 3.0;
const uint64_t kProbeToken = 0x70726f6265;  // static storage: a send still pending when the rank moves on reads it
}  // namespace

std::vector<int> MpiCommunicator::probe_peers(double timeout_s) {
  const int n = size(), me = rank();
  std::vector<uint64_t> got(static_cast<size_t>(n));
  std::vector<MPI_Request> recvs, sends;
  std::vector<int> from;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    recvs.emplace_back();
    from.push_back(p);
    check_mpi(MPI_Irecv(&got[size_t(p)], 1, MPI_UINT64_T, p, kProbeTag, desc_comm_, &recvs.back()), "MPI_Irecv");
    sends.emplace_back();
    check_mpi(MPI_Isend(&kProbeToken, 1, MPI_UINT64_T, p, kProbeTag, desc_comm_, &sends.back()), "MPI_Isend");
  }
  const auto until = deadline_after<Clock>(std::min(timeout_s, kProbeSeconds));
  std::vector<int> idx(recvs.size());
  for (size_t left = recvs.size(); left > 0 && Clock::now() < until;) {
    int done = 0;
    check_mpi(MPI_Testsome(static_cast<int>(recvs.size()), recvs.data(), &done, idx.data(), MPI_STATUSES_IGNORE),
              "MPI_Testsome");
    if (done == MPI_UNDEFINED) break;
    left -= static_cast<size_t>(done);
    timespec ts{0, 200'000};
    if (left > 0) nanosleep(&ts, nullptr);
  }
  std::vector<int> silent;
  for (size_t k = 0; k < recvs.size(); ++k) {
    if (recvs[k] == MPI_REQUEST_NULL) continue;
    silent.push_back(world_rank_of(from[k]));
    MPI_Cancel(&recvs[k]);  // a receive's cancel completes locally
    MPI_Wait(&recvs[k], MPI_STATUS_IGNORE);
  }
  for (MPI_Request& q : sends)
    if (q != MPI_REQUEST_NULL) MPI_Request_free(&q);  // may complete later; its buffer is static
  return silent;
}

void MpiCommunicator::run_collective(const CollArgs& a) {
  check_descriptor(a);
  try {
    run_collective_body(a);
  } catch (const CommTimeoutError&) {
    throw;  // the peer waited for is known already
  } catch (const CommError& e) {
    if (!std::strstr(e.what(), "(--comm-timeout)")) throw;
    const std::vector<int> silent = probe_peers(a.timeout_s);
    if (silent.empty() || silent[0] < 0) throw;
    std::string who;
    for (size_t i = 0; i < silent.size(); ++i) who += str(i ? ", " : "", silent[i]);
    throw CommTimeoutError(str(e.what(), " (probed after the timeout: no answer within ",
                               std::min(a.timeout_s, kProbeSeconds), " s from world rank(s) ", who,
                               "; waiting for world rank ", silent[0], ")"),
                           silent[0]);
  }
}

void MpiCommunicator::run_collective_body(const CollArgs& a) {
  const int n = size(), r = rank();
  const size_t e = dtype_size(a.dtype);
  const MPI_Datatype t = move_type(a.dtype);
  auto what = [&] { return str(describe(a), " on group '", name(), "' (rank ", r, ")"); };
  MPI_Request req;
  switch (a.kind) {
    case OpKind::all_reduce:
    case OpKind::reduce:
    case OpKind::reduce_scatter: run_reducing(a); return;
    case OpKind::barrier:
      check_mpi(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier");
      break;
    case OpKind::broadcast:
      check_mpi(MPI_Ibcast(a.recv, to_int(a.count, a), t, a.root, comm_, &req), "MPI_Ibcast");
      break;
    case OpKind::all_gather: {
      std::vector<int> counts(n), displs(n);
      for (int p = 0; p < n; ++p) {
        Shard s = shard_of(a.count, n, p);
        counts[p] = to_int(s.count, a);
        displs[p] = to_int(s.offset, a);
      }
      if (hier_all_gather_) {
        hier_all_gather(*hosts_, a.send, a.recv, a.count, e, a.timeout_s, what);
        return;
      }
      Shard own = shard_of(a.count, n, r);
      const void* sbuf = a.send == static_cast<char*>(a.recv) + own.offset * e ? MPI_IN_PLACE : a.send;
      check_mpi(MPI_Iallgatherv(sbuf, counts[r], t, a.recv, counts.data(), displs.data(), t, comm_, &req),
                "MPI_Iallgatherv");
      wait_request(&req, a.timeout_s, what);
      return;
    }
    case OpKind::all_to_all: {
      const size_t total = a.count * n * e;
      std::vector<char> tmp;
      const void* sbuf = a.send;
      if (overlaps(a.send, total, a.recv, total)) {
        tmp.assign(static_cast<const char*>(a.send), static_cast<const char*>(a.send) + total);
        sbuf = tmp.data();
      }
      int cnt = to_int(a.count, a);
      check_mpi(MPI_Ialltoall(sbuf, cnt, t, a.recv, cnt, t, comm_, &req), "MPI_Ialltoall");
      wait_request(&req, a.timeout_s, what);
      return;
    }
    case OpKind::all_to_all_v: {
      // Check the count matrix first: what each rank sends me must be what I expect.
      std::vector<uint64_t> sc(a.send_counts, a.send_counts + n), got(n);
      check_mpi(MPI_Ialltoall(sc.data(), 1, MPI_UINT64_T, got.data(), 1, MPI_UINT64_T, comm_, &req), "MPI_Ialltoall");
      wait_request(&req, a.timeout_s, what);
      int bad = -1;
      for (int p = 0; p < n && bad < 0; ++p) {
        if (got[p] != a.recv_counts[p]) bad = p;
      }
      int any_bad = bad >= 0 ? 1 : 0, global_bad = 0;
      check_mpi(MPI_Iallreduce(&any_bad, &global_bad, 1, MPI_INT, MPI_MAX, comm_, &req), "MPI_Iallreduce");
      wait_request(&req, a.timeout_s, what);
      if (bad >= 0) {
        throw CommError(str("mismatched ", describe(a), " on group '", name(), "': rank ", bad, " sends ", got[bad],
                            " elements to rank ", r, " but rank ", r, " expects ", a.recv_counts[bad]));
      }
      if (global_bad) {
        throw CommError(str("mismatched ", describe(a), " on group '", name(),
                            "': another rank's send and recv counts disagree (see its error)"));
      }
      std::vector<int> scnt(n), sdis(n), rcnt(n), rdis(n);
      for (int j = 0, s = 0, q = 0; j < n; ++j) {
        scnt[j] = to_int(a.send_counts[j], a);
        rcnt[j] = to_int(a.recv_counts[j], a);
        sdis[j] = a.send_offsets ? to_int(a.send_offsets[j], a) : s;
        rdis[j] = a.recv_offsets ? to_int(a.recv_offsets[j], a) : q;
        s += scnt[j];
        q += rcnt[j];
      }
      check_mpi(MPI_Ialltoallv(a.send, scnt.data(), sdis.data(), t, a.recv, rcnt.data(), rdis.data(), t, comm_, &req),
                "MPI_Ialltoallv");
      break;
    }
    default: MT_ASSERT(false, "not a collective: ", op_kind_name(a.kind));
  }
  wait_request(&req, a.timeout_s, what);
}

std::unique_ptr<Communicator> MpiCommunicator::run_split(int colour, int key, const std::string& name, uint64_t seq,
                                                         double timeout_s) {
  CollArgs a;
  a.kind = OpKind::split;
  a.seq = seq;
  a.timeout_s = timeout_s;
  // The descriptor exchange doubles as a deadline-guarded rendezvous: MPI_Comm_split itself cannot time out,
  // but once every rank has reached this point it completes promptly.
  check_descriptor(a);
  MPI_Comm out;
  check_mpi(MPI_Comm_split(comm_, colour < 0 ? MPI_UNDEFINED : colour, key, &out), "MPI_Comm_split");
  if (out == MPI_COMM_NULL) return nullptr;
  auto c = std::make_unique<MpiCommunicator>(out, name.empty() ? str(this->name(), ".", colour) : name);
  MPI_Comm_free(&out);
  return c;
}

namespace {
class P2PState : public detail::RequestState {
 public:
  P2PState(std::string what, size_t bytes, bool is_recv, double timeout_s, int peer_world)
      : what_(std::move(what)), bytes_(bytes), is_recv_(is_recv), timeout_s_(timeout_s), peer_world_(peer_world) {}
  MPI_Request req = MPI_REQUEST_NULL;
  bool test() override {
    if (done_) return true;
    int flag = 0;
    check_mpi(MPI_Test(&req, &flag, &status_), "MPI_Test");
    if (flag) done_ = true;
    return done_;
  }
  void wait() override {
    if (!done_) {
      wait_request(&req, timeout_s_, [&] { return what_; }, &status_, peer_world_);
      done_ = true;
    }
    if (is_recv_) {
      int got = 0;
      MPI_Get_count(&status_, MPI_BYTE, &got);
      MT_REQUIRE(CommError, static_cast<size_t>(got) == bytes_, what_, " got a message of ", got, " bytes but expects ",
                 bytes_, " (mismatched send/recv)");
    }
  }

 private:
  std::string what_;
  size_t bytes_;
  bool is_recv_;
  double timeout_s_;
  int peer_world_;
  bool done_ = false;
  MPI_Status status_{};
};
}  // namespace

Request MpiCommunicator::start_send(const void* buf, size_t bytes, int peer, int tag) {
  auto st = std::make_shared<P2PState>(str("send(to rank ", peer, ", tag ", tag, ", ", bytes, " bytes) on group '",
                                           name(), "' (rank ", rank(), ")"),
                                       bytes, false, timeout(), world_rank_of(peer));
  MT_REQUIRE(CommError, bytes <= static_cast<size_t>(INT_MAX), "send of ", bytes, " bytes exceeds MPI's int counts");
  check_mpi(MPI_Isend(buf, static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_, &st->req), "MPI_Isend");
  return Request(st);
}

Request MpiCommunicator::start_recv(void* buf, size_t bytes, int peer, int tag) {
  auto st = std::make_shared<P2PState>(str("recv(from rank ", peer, ", tag ", tag, ", ", bytes, " bytes) on group '",
                                           name(), "' (rank ", rank(), ")"),
                                       bytes, true, timeout(), world_rank_of(peer));
  MT_REQUIRE(CommError, bytes <= static_cast<size_t>(INT_MAX), "recv of ", bytes, " bytes exceeds MPI's int counts");
  check_mpi(MPI_Irecv(buf, static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_, &st->req), "MPI_Irecv");
  return Request(st);
}

LaunchResult run_body(const LaunchOptions& o, const std::function<void(Communicator&)>& body) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    std::atexit([] {
      int fin = 0;
      MPI_Finalized(&fin);
      if (!fin) MPI_Finalize();
    });
    MT_REQUIRE(CommError, provided >= MPI_THREAD_MULTIPLE,
               "this MPI library does not support MPI_THREAD_MULTIPLE (got level ", provided,
               "); the communicator's progress thread needs it");
  }
  LaunchResult res;
  int wr = 0, ws = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm_size(MPI_COMM_WORLD, &ws);
  MT_REQUIRE(InputError, o.nproc <= 1 || o.nproc == ws, "--nproc ", o.nproc, " disagrees with mpirun's ", ws,
             " processes; under mpirun leave --nproc out (rank and size come from MPI)");
  // The flight recorder (mpi_flight.h): this rank's ring in its own memory, written to its own file on failure
  // or SIGTERM, gathered by `meshtrain flight` after mpirun has ended.
  start_flight(wr, ws, o.flight_file, o.fault);
  auto ring_note = [](const std::string& file) {
    if (!file.empty()) std::fprintf(stderr, "  flight recorder: this rank's ring is in %s\n", file.c_str());
  };
  try {
    MpiCommunicator world(MPI_COMM_WORLD, "world");
    world.set_timeout(o.timeout_s);
    world.set_algorithm(o.algo);
    exchange_flight_hosts(world.handle(), o.timeout_s);
    body(world);
  } catch (const CommTimeoutError& e) {  // the same headline as the shm launcher: the stalled rank first
    const std::string file =
        write_flight(str("timed out waiting for rank ", e.waited_world_rank()), e.waited_world_rank(), e.what());
    print_failure_headline(wr, e.waited_world_rank(), e.what());
    ring_note(file);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  } catch (const std::exception& e) {
    // A collective's own wait does not know whom it waits for: its timeout is a CommError (wait_requests).
    const bool timed_out = std::strstr(e.what(), "(--comm-timeout)") != nullptr;
    const std::string file = write_flight(timed_out ? "timed out (--comm-timeout)" : "failed", -1, e.what());
    std::fprintf(stderr, "rank %d: %s\n", wr, e.what());
    ring_note(file);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  stop_flight();
  return res;
}

}  // namespace mt::comm::mpi
