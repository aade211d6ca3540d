// Parameter server with bounded staleness (`--async ps --servers S --staleness K`), after Li et al. 2014 (the
// parameter server) and Ho et al. 2013 (stale synchronous parallel).
//
// Legend: W workers (world ranks 0..W-1), S servers (ranks W..W+S-1), Psi parameters (the flat buffer),
// K staleness bound, version v = number of optimizer steps applied (the parameters after steps 0..v-1).
//
//   server s   owns the slice comm::shard_of(Psi, S, s) of the flat buffer (balanced by bytes, cut anywhere:
//              a tensor may straddle two servers) and the optimizer state of that slice. For step t it
//              receives every worker's gradient slice for t, sums them in worker order, takes part in the
//              global gradient norm (per-tensor squares, summed over the servers), clips, applies the
//              optimizer, and sends version t+1 of its slice to every worker with the step's loss and norm.
//   worker w   computes the gradient of its share of step t's global batch (the windows data parallelism
//              would give rank w of W) on parameters of version >= t-K, and sends each server its slice.
//
// Before it starts step t a worker waits until every server has published version t-K, i.e. until every
// worker's gradient for step t-K-1 has been applied: no worker computes more than K steps ahead of the
// slowest. With K = 0 every gradient of step t is taken at version t, and the server's arithmetic is the
// data-parallel step's (sum, norm, clip, update, each element in the same order), so the run equals exact
// data parallelism bit for bit (with 2 workers; more workers sum in worker order, not the ring's order).
//
// Messages (point-to-point on the world communicator, bytes): gradient = {step, loss sum} + slice; version =
// {version, loss, norm, lr} + slice. Message order per (sender, receiver) is the protocol's only ordering;
// every wait inherits the communicator's deadline. A non-finite loss or norm travels in the version message,
// so every worker stops with the servers instead of waiting for an update that never comes.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "nn/params.h"
#include "optim/optimizer.h"
#include "tensor/buffer.h"

namespace mt::parallel {

struct PsLayout {
  int workers = 1, servers = 1;
  int staleness = 0;
  bool is_server(int world_rank) const { return world_rank >= workers; }
  // The slice of the flat buffer server s owns: [begin, begin + count).
  comm::Shard slice(size_t psi, int s) const { return comm::shard_of(psi, servers, s); }
};

// What a version message carries besides the parameters: the step that produced it.
struct VersionInfo {
  int64_t version = 0;
  double loss = 0;  // mean loss of step version-1 over the global batch (NaN for the starting version)
  double norm = 0;  // its global gradient norm before clipping
  double lr = 0;
};

class PsWorker {
 public:
  // params: this worker's full (finalized) registry; its data is overwritten by what the servers send.
  // last_version: the newest version this worker will take (the run's last step + 1); no receive is left
  // posted after it.
  PsWorker(comm::Communicator& world, nn::ParamRegistry& params, const PsLayout& layout, int64_t last_version);
  ~PsWorker();

  // Blocks until every server's newest version is >= need (taking in whatever else has arrived on the way),
  // copies the slices into the parameters, and returns the version the parameters now hold (the smallest
  // over the servers). on_version is called once per step's version, in order, when all servers have sent it.
  int64_t acquire(int64_t need, const std::function<void(const VersionInfo&)>& on_version);
  // Sends the gradient of step `step` (params.grad(), already scaled to the global-batch mean) and this
  // worker's loss sum to the servers. Does not wait for them to take it.
  void push(int64_t step, double loss_sum);
  // Waits for every push to be taken.
  void flush();
  int64_t version() const { return have_; }

 private:
  struct Slot {
    AlignedBuffer buf;
    std::vector<comm::Request> reqs;
  };
  void post_recv(int s);
  void consume(int s);

  comm::Communicator& world_;
  nn::ParamRegistry& params_;
  PsLayout L_;
  int64_t last_;
  std::vector<AlignedBuffer> inbox_;        // per server: the version message being received
  std::vector<comm::Request> inreq_;
  std::vector<char> posted_;                // per server: a receive is posted
  std::vector<int64_t> server_version_;     // per server: newest version copied into the parameters
  std::map<int64_t, VersionInfo> infos_;    // versions not yet reported (some servers may not have sent them)
  int64_t have_ = -1;                       // smallest of server_version_
  std::deque<Slot> outbox_;                 // pushes in flight (reused once taken)
};

struct PsServerStats {
  std::vector<double> received_at;  // [step * W + w]: when this server had worker w's gradient of `step`
};

class PsServer {
 public:
  // params: the full registry (for shapes and initial values); opt: sized for this server's slice;
  // servers: the group of the S servers (null when S = 1).
  PsServer(comm::Communicator& world, comm::Communicator* servers, nn::ParamRegistry& params,
           const PsLayout& layout, int server_index);
  ~PsServer();

  float* slice() { return data_.data(); }
  // Takes the slice from the registry again (after a resume loaded whole parameters into it).
  void reload();
  size_t begin() const { return sh_.offset; }
  size_t count() const { return sh_.count; }
  // This slice's optimizer segments (offsets relative to the slice).
  const std::vector<optim::Segment>& segments() const { return segs_; }

  // Sends version `version` of the slice to every worker (the starting version carries NaN loss and norm).
  void publish(const VersionInfo& info);
  // Receives every worker's gradient of `step`, sums it (worker order) into grad(); returns the loss sum.
  double gather(int64_t step);
  float* grad() { return grad_.data(); }
  // Global L2 norm of the summed gradient over all servers, per tensor in registry order (collective over
  // the server group).
  double grad_norm();
  void scale_grad(float factor);
  void flush();  // waits for every version sent to be taken
  const PsServerStats& stats() const { return stats_; }

 private:
  struct Slot {
    AlignedBuffer buf;
    std::vector<comm::Request> reqs;
  };
  comm::Communicator& world_;
  comm::Communicator* servers_;
  nn::ParamRegistry& params_;
  PsLayout L_;
  int index_;
  comm::Shard sh_;
  AlignedBuffer data_, grad_, in_;
  std::vector<optim::Segment> segs_;
  std::deque<Slot> outbox_;
  PsServerStats stats_;
};

// The staleness a run actually had, measured across processes (collective over the world).
//   ahead: when worker w began computing step t, t minus the steps the slowest worker had completed, where
//     "completed" means its gradient had reached every server (the servers' receive times; one host's shared
//     monotonic clock, so only measured on the shm backend). The bound guarantees ahead <= K.
//   staleness: t minus the version of the parameters worker w used for step t.
struct PsReport {
  bool measured = false;  // ahead was measured (one host)
  int64_t max_ahead = -1;
  int64_t max_staleness = 0;
  double mean_staleness = 0;
  std::vector<int64_t> staleness_counts;  // [k]: steps computed on parameters k versions old
};
PsReport measure_staleness(comm::Communicator& world, const PsLayout& layout, const PsServerStats* server,
                           const std::vector<double>& begun, const std::vector<double>& staleness, int64_t start,
                           int64_t steps);

}  // namespace mt::parallel
