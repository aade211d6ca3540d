#include "parallel/async/param_server.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/error.h"
#include "trace/chrome_trace.h"

namespace mt::parallel {

namespace {

// Message tags on the world communicator (the trainer sends nothing else point to point there).
constexpr int kGradTag = 7101, kVersionTag = 7102;
// Header floats in front of every message's slice (32 bytes: four 8-byte fields).
constexpr size_t kHead = 8;

struct GradHeader {
  int64_t step;
  double loss_sum;
  double unused[2];
};
struct VersionHeader {
  int64_t version;
  double loss, norm, lr;
};
static_assert(sizeof(GradHeader) == kHead * sizeof(float) && sizeof(VersionHeader) == kHead * sizeof(float));

// A free slot of the outbox (all its sends taken), or a new one of `floats` floats.
template <class Slot>
Slot& free_slot(std::deque<Slot>& box, size_t floats) {
  for (Slot& s : box) {
    bool done = true;
    for (comm::Request& r : s.reqs) done = done && r.test();
    if (done) {
      for (comm::Request& r : s.reqs) r.wait();  // rethrows a failed send
      s.reqs.clear();
      return s;
    }
  }
  box.emplace_back();
  box.back().buf.resize(floats);
  return box.back();
}

template <class Slot>
void flush_box(std::deque<Slot>& box) {
  for (Slot& s : box) {
    for (comm::Request& r : s.reqs) r.wait();
    s.reqs.clear();
  }
}

}  // namespace

// ---- Worker ----

PsWorker::PsWorker(comm::Communicator& world, nn::ParamRegistry& params, const PsLayout& layout,
                   int64_t last_version)
    : world_(world), params_(params), L_(layout), last_(last_version) {
  inbox_.resize(L_.servers);
  inreq_.resize(L_.servers);
  posted_.assign(L_.servers, 0);
  server_version_.assign(L_.servers, -1);
  for (int s = 0; s < L_.servers; s++) {
    inbox_[s].resize(kHead + L_.slice(params_.size(), s).count);
    post_recv(s);
  }
}

PsWorker::~PsWorker() = default;  // a finished run has taken the last version: no receive is left posted

void PsWorker::post_recv(int s) {
  posted_[s] = 1;
  inreq_[s] = world_.irecv(inbox_[s].data(), inbox_[s].size() * sizeof(float), comm::DType::u8, L_.workers + s,
                           kVersionTag);
}

void PsWorker::consume(int s) {
  posted_[s] = 0;
  VersionHeader h;
  std::memcpy(&h, inbox_[s].data(), sizeof h);
  MT_REQUIRE(::mt::CommError, server_version_[s] < 0 || h.version == server_version_[s] + 1, "parameter server ", s, " sent version ",
           h.version, " after ", server_version_[s]);
  const comm::Shard sh = L_.slice(params_.size(), s);
  std::memcpy(params_.data() + sh.offset, inbox_[s].data() + kHead, sh.count * sizeof(float));
  server_version_[s] = h.version;
  infos_[h.version] = {h.version, h.loss, h.norm, h.lr};  // the same on every server
  if (h.version < last_) post_recv(s);
}

int64_t PsWorker::acquire(int64_t need, const std::function<void(const VersionInfo&)>& on_version) {
  auto slowest = [&] {
    return (int)(std::min_element(server_version_.begin(), server_version_.end()) - server_version_.begin());
  };
  for (;;) {
    // Take in everything that has arrived; then, if that is not enough, block on the server furthest behind.
    for (int s = 0; s < L_.servers; s++)
      while (posted_[s] && inreq_[s].test()) {
        inreq_[s].wait();
        consume(s);
      }
    const int64_t m = server_version_[slowest()];
    // Versions every server has sent, in order.
    while (!infos_.empty() && infos_.begin()->first <= m) {
      if (on_version) on_version(infos_.begin()->second);
      infos_.erase(infos_.begin());
    }
    have_ = m;
    if (m >= need) return m;
    const int s = slowest();
    MT_REQUIRE(::mt::CommError, server_version_[s] < last_, "waiting for version ", need, " beyond the last, ", last_);
    inreq_[s].wait();
    consume(s);
  }
}

void PsWorker::push(int64_t step, double loss_sum) {
  for (int s = 0; s < L_.servers; s++) {
    const comm::Shard sh = L_.slice(params_.size(), s);
    auto& slot = free_slot(outbox_, kHead + sh.count);
    if (slot.buf.size() < kHead + sh.count) slot.buf.resize(kHead + sh.count);
    GradHeader h{step, loss_sum, {0, 0}};
    std::memcpy(slot.buf.data(), &h, sizeof h);
    std::memcpy(slot.buf.data() + kHead, params_.grad() + sh.offset, sh.count * sizeof(float));
    slot.reqs.push_back(world_.isend(slot.buf.data(), (kHead + sh.count) * sizeof(float), comm::DType::u8,
                                     L_.workers + s, kGradTag));
  }
}

void PsWorker::flush() { flush_box(outbox_); }

// ---- Server ----

PsServer::PsServer(comm::Communicator& world, comm::Communicator* servers, nn::ParamRegistry& params,
                   const PsLayout& layout, int server_index)
    : world_(world), servers_(servers), params_(params), L_(layout), index_(server_index) {
  sh_ = L_.slice(params_.size(), index_);
  data_.resize(sh_.count);
  grad_.resize(sh_.count);
  in_.resize(kHead + sh_.count);
  std::memcpy(data_.data(), params_.data() + sh_.offset, sh_.count * sizeof(float));
  // Segments: each tensor's overlap with [offset, offset + count), relative to the slice.
  int t = 0;
  for (const nn::Param& p : params_.params()) {
    const size_t lo = std::max(p.offset, sh_.offset), hi = std::min(p.offset + p.numel, sh_.offset + sh_.count);
    if (lo < hi) {
      const size_t rel = lo - sh_.offset;
      segs_.push_back({rel, rel, rel, hi - lo, p.decay, t, lo - p.offset, &p});
    }
    t++;
  }
}

PsServer::~PsServer() = default;

void PsServer::reload() { std::memcpy(data_.data(), params_.data() + sh_.offset, sh_.count * sizeof(float)); }

void PsServer::publish(const VersionInfo& info) {
  auto& slot = free_slot(outbox_, kHead + sh_.count);
  VersionHeader h{info.version, info.loss, info.norm, info.lr};
  std::memcpy(slot.buf.data(), &h, sizeof h);
  std::memcpy(slot.buf.data() + kHead, data_.data(), sh_.count * sizeof(float));
  for (int w = 0; w < L_.workers; w++)
    slot.reqs.push_back(
        world_.isend(slot.buf.data(), (kHead + sh_.count) * sizeof(float), comm::DType::u8, w, kVersionTag));
}

double PsServer::gather(int64_t step) {
  // In worker order, so the sum is the same on every run: g_0 + g_1 + ... (for two workers exactly the
  // all-reduce's a + b).
  float* g = grad_.data();
  double loss = 0;
  float loss_f = 0;
  stats_.received_at.resize((size_t)(step + 1) * L_.workers, -1);
  for (int w = 0; w < L_.workers; w++) {
    world_.recv(in_.data(), in_.size() * sizeof(float), comm::DType::u8, w, kGradTag);
    stats_.received_at[(size_t)step * L_.workers + w] = trace::ChromeTrace::now_us() * 1e-6;
    GradHeader h;
    std::memcpy(&h, in_.data(), sizeof h);
    MT_REQUIRE(::mt::CommError, h.step == step, "parameter server ", index_, " expected worker ", w, "'s gradient of step ", step,
             ", got step ", h.step);
    const float* x = in_.data() + kHead;
    if (w == 0) {
      std::memcpy(g, x, sh_.count * sizeof(float));
      loss_f = (float)h.loss_sum;
    } else {
      for (size_t i = 0; i < sh_.count; i++) g[i] += x[i];
      loss_f += (float)h.loss_sum;  // float32, as the data-parallel loss all-reduce sums
    }
  }
  loss = loss_f;
  return loss;
}

double PsServer::grad_norm() {
  // Per tensor: the sum of squares of its part here (a tensor wholly on one server gets exactly the
  // data-parallel engine's figure, norm^2 of global_norm); then summed over servers and tensors in order.
  const size_t T = params_.params().size();
  std::vector<double> sq(T, 0.0);
  for (const optim::Segment& s : segs_) {
    const double n = optim::global_norm(grad_.data() + s.grad, s.count);
    sq[s.tensor] += n * n;
  }
  if (servers_ && servers_->size() > 1) {
    std::vector<double> all(T * servers_->size());
    servers_->all_gather(sq.data(), all.data(), all.size() * sizeof(double), comm::DType::u8);
    std::fill(sq.begin(), sq.end(), 0.0);
    for (int s = 0; s < servers_->size(); s++)
      for (size_t t = 0; t < T; t++) sq[t] += all[(size_t)s * T + t];
  }
  double total = 0;
  for (double v : sq) total += v;
  return std::sqrt(total);
}

void PsServer::scale_grad(float factor) {
  float* g = grad_.data();
  for (size_t i = 0; i < sh_.count; i++) g[i] *= factor;
}

void PsServer::flush() { flush_box(outbox_); }

PsReport measure_staleness(comm::Communicator& world, const PsLayout& L, const PsServerStats* server,
                           const std::vector<double>& begun, const std::vector<double>& staleness, int64_t start,
                           int64_t steps) {
  // Each rank's records in one block of 3 n doubles (n = steps x W, index i W + w): begin times (worker w),
  // receive times (servers), staleness (worker w); -1 where a rank has nothing to say.
  const int W = L.workers, me = world.rank();
  const size_t n = (size_t)steps * W;
  std::vector<double> mine(3 * n, -1.0), all(3 * n * world.size());
  if (server) {
    for (size_t i = 0; i < n; i++) {
      const size_t k = (size_t)start * W + i;
      if (k < server->received_at.size()) mine[n + i] = server->received_at[k];
    }
  } else {
    for (size_t i = 0; i < begun.size() && i < (size_t)steps; i++) {
      mine[i * W + me] = begun[i];
      mine[2 * n + i * W + me] = staleness[i];
    }
  }
  world.all_gather(mine.data(), all.data(), all.size() * sizeof(double), comm::DType::u8);
  std::vector<double> began(n, -1), recv(n, -1), stale(n, -1);
  for (int r = 0; r < world.size(); r++) {
    const double* b = &all[(size_t)r * 3 * n];
    for (size_t i = 0; i < n; i++) {
      began[i] = std::max(began[i], b[i]);
      recv[i] = std::max(recv[i], b[n + i]);  // reached every server: the latest receipt
      stale[i] = std::max(stale[i], b[2 * n + i]);
    }
  }
  PsReport rep;
  double total = 0;
  for (size_t i = 0; i < n; i++) {
    const int64_t k = (int64_t)stale[i];
    if ((int64_t)rep.staleness_counts.size() <= k) rep.staleness_counts.resize(k + 1, 0);
    rep.staleness_counts[k]++;
    rep.max_staleness = std::max(rep.max_staleness, k);
    total += (double)k;
  }
  rep.mean_staleness = n ? total / (double)n : 0;
  rep.measured = std::string(world.backend()) == "shm";
  if (rep.measured) {
    for (int64_t t = 0; t < steps; t++)
      for (int w = 0; w < W; w++) {
        const double at = began[(size_t)t * W + w];
        int64_t slowest = steps;
        for (int v = 0; v < W; v++) {
          int64_t done = 0;
          while (done < steps && recv[(size_t)done * W + v] >= 0 && recv[(size_t)done * W + v] <= at) done++;
          slowest = std::min(slowest, done);
        }
        rep.max_ahead = std::max(rep.max_ahead, t - slowest);
      }
  }
  return rep;
}

}  // namespace mt::parallel
