#include "train/offload.h"

#include <algorithm>
#include <map>
#include <cstdio>

#include "core/env.h"
#include "core/error.h"
#include "optim/resident_tier.h"
#include "optim/tiled_optimizer.h"

namespace mt::train {

std::unique_ptr<optim::Optimizer> OffloadTiers::wrap(const TrainConfig& cfg, int rank,
                                                     std::unique_ptr<optim::Optimizer> opt, bool trace) {
  if (!cfg.offload.any()) return opt;
  optim::StateStore& st = opt->state();
  const std::vector<size_t> flat = st.flat();
  if (flat.empty() || st.size(flat[0]) == 0) return opt;
  if (!cfg.offload.optimizer) {
    // --offload params and/or grads alone: the state stays in memory, and the update still walks it tile by
    // tile, so that the store can bring each tile's parameters and gradients from its files (TileSource).
    if (!cfg.offload.params && !cfg.offload.grads) return opt;
    st.attach(std::make_unique<optim::ResidentTier>(flat.size(), st.size(flat[0]),
                                                    cfg.offload.tile_bytes / sizeof(float)));
    return std::make_unique<optim::TiledOptimizer>(std::move(opt));
  }
  offload::StateSwapper::Options o;
  o.dir = cfg.offload.dir;
  o.buffers = flat.size();
  o.n = st.size(flat[0]);
  o.tile_bytes = cfg.offload.tile_bytes;
  o.timeout_s = cfg.comm_timeout;
  o.record_events = trace;
  // MESHTRAIN_OFFLOAD_IO_THREADS (1-8, default 2): the tier's I/O threads, for benchmarks comparing queue depths.
  o.io_threads = (int)env_int("MESHTRAIN_OFFLOAD_IO_THREADS", 1, 8).value_or(2);
  std::unique_ptr<offload::StateSwapper> swapper;
  try {
    swapper = std::make_unique<offload::StateSwapper>(o);
  } catch (const InputError& e) {
    throw InputError(str("rank ", rank, ": ", e.what()));
  }
  state_ = swapper.get();
  st.attach(std::move(swapper));
  return std::make_unique<optim::TiledOptimizer>(std::move(opt));
}

void OffloadTiers::trace_into(trace::ChromeTrace& t) {
  if (!t.enabled()) return;
  if (state_)
    for (const offload::IoEvent& e : state_->take_events())
      t.add(trace::Track::io, str(e.write ? "write" : "read", " optimizer tile ", e.tile), "offload", e.t0_us, e.t1_us);
  for (offload::ShardFile* f : shards_)
    for (const offload::IoEvent& e : f->take_events())
      t.add(trace::Track::io, str(e.write ? "write " : "read ", f->kind(), " at ", e.tile), "offload", e.t0_us, e.t1_us);
}

size_t OffloadTiers::staging_bytes() const {
  size_t b = 0;
  for (const offload::ShardFile* f : shards_) b += f->staging_bytes();
  return b;
}

size_t OffloadTiers::staging_held() const {
  size_t b = 0;
  for (const offload::ShardFile* f : shards_) b += f->staging_held();
  return b;
}

offload::IoCounters OffloadTiers::counters() const {
  offload::IoCounters c = state_ ? state_->counters() : offload::IoCounters{};
  for (const offload::ShardFile* f : shards_) {
    const offload::IoCounters s = f->counters();
    c.bytes_read += s.bytes_read;
    c.bytes_written += s.bytes_written;
    c.read_s += s.read_s;
    c.write_s += s.write_s;
    c.busy_s += s.busy_s;
  }
  return c;
}

void OffloadTiers::drain() {
  for (offload::ShardFile* f : shards_) f->drain();
}

nlohmann::json OffloadTiers::report() const {
  if (!state_ && shards_.empty()) return nullptr;
  auto rate = [](double bytes, double s) { return s > 0 ? bytes / s : 0.0; };
  nlohmann::json shards = nlohmann::json::array();
  for (const offload::ShardFile* f : shards_) {
    const offload::IoCounters s = f->counters();
    shards.push_back({{"kind", f->kind()},
                      {"file_bytes", f->file_bytes()},
                      {"direct_io", f->direct_io()},
                      {"engine", f->engine()},
                      {"io_depth", f->io_depth()},
                      {"io_block_bytes", f->io_block()},
                      {"read_bytes", s.bytes_read},
                      {"written_bytes", s.bytes_written},
                      {"read_s", s.read_s},
                      {"write_s", s.write_s},
                      {"read_bytes_per_s", rate((double)s.bytes_read, s.read_s)},
                      {"write_bytes_per_s", rate((double)s.bytes_written, s.write_s)},
                      {"staged_bytes", f->staged_bytes()}});
  }
  if (!state_) return {{"kind", "shards"}, {"shards", shards}};  // the optimizer state in memory
  const offload::IoCounters c = state_->counters();
  return {{"kind", "optimizer"},
          {"shards", shards},
          {"file_bytes", state_->file_bytes()},
          {"tiles", state_->tiles()},
          {"tile_bytes_per_buffer", state_->tile_elems() * sizeof(float)},
          {"direct_io", state_->direct_io()},
          {"engine", state_->engine()},
          {"io_threads", state_->io_threads()},
          {"read_bytes", c.bytes_read},
          {"written_bytes", c.bytes_written},
          {"read_s", c.read_s},
          {"write_s", c.write_s},
          {"read_bytes_per_s", rate((double)c.bytes_read, c.read_s)},
          {"write_bytes_per_s", rate((double)c.bytes_written, c.write_s)},
          {"busy_s", c.busy_s},
          {"bytes_per_busy_s", rate((double)(c.bytes_read + c.bytes_written), c.busy_s)},
          {"demand_reads", c.demand_reads}};
}

size_t offload_io_block(const TrainConfig& cfg) {
  return (size_t)std::min<uint64_t>(cfg.offload.tile_bytes, offload::kBlock);
}

namespace {
std::string mib(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", b / 1048576.0);
  return buf;
}
}  // namespace

size_t zero_transient_bytes(const std::vector<parallel::Bucket*>& buckets, int zero, bool offload_params) {
  if (zero < 2) return 0;
  struct Size {
    size_t k = 0;
    bool shared = false;  // reduced over other ranks
    size_t held = 0;      // this rank's shard of one such bucket
  };
  std::map<size_t, Size> sizes;  // by bucket count
  for (const parallel::Bucket* b : buckets) {
    if (b->count == 0) continue;
    Size& s = sizes[b->count];
    s.k++;
    s.shared = s.shared || !b->alone();
    s.held = std::max(s.held, b->alone() ? b->count : b->sc);
  }
  size_t floats = 0;
  for (const auto& [count, s] : sizes) {
    floats += std::min<size_t>(s.k, s.shared ? 2 : 1) * count;  // gradients
    if (zero >= 3) {
      floats += std::min<size_t>(s.k, 2) * count;  // gathered parameters
      if (offload_params) floats += std::min<size_t>(s.k, 2) * (s.held + offload::kCongruentSlack);
    }
  }
  return floats * sizeof(float);
}

double memory_allowance(int world_size) { return (world_size > 1 ? 32.0 : 16.0) * 1048576.0; }

nlohmann::json MemoryPlan::json() const {
  return {{"now", now},
          {"params", params},
          {"grads", grads},
          {"optimizer", optimizer},
          {"optimizer_offloaded", offloaded},
          {"io_buffers", io_buffers},
          {"io_buffers_in_now", io_in_now},
          {"activations", activations},
          {"backward_scratch", scratch},
          {"product_scratch", products},
          {"zero_transient", transient},
          {"allowance", allowance},
          {"total", total()}};
}

std::string MemoryPlan::describe() const {
  return str("the process now ", mib(now), " (parameters ", mib(params), " and gradients ", mib(grads),
             " included) + optimizer state ", mib(optimizer),
             offloaded > 0 ? str(" (", mib(offloaded), " offloaded)") : "",
             io_buffers > 0 ? str(" + offload I/O buffers ", mib(io_buffers - io_in_now), " (of ", mib(io_buffers),
                                  "; ", mib(io_in_now), " already in the process)")
                            : "",
             " + activations of one micro-batch ", mib(activations),
             scratch > 0 ? str(" + backward scratch ", mib(scratch)) : "",
             products > 0 ? str(" + bf16 product operand copies ", mib(products)) : "",
             transient > 0 ? str(" + ZeRO transient bucket buffers ", mib(transient)) : "",
             " + allowance (workspaces, stacks, allocator) ", mib(allowance), " = ", mib(total()));
}

void check_memory_plan(const MemoryPlan& plan, uint64_t limit, int rank, bool optimizer_offloaded) {
  if (limit == 0 || plan.total() <= (double)limit) return;
  std::string hint;
  if (!optimizer_offloaded && plan.optimizer > 0)
    hint = str("; --offload optimizer --offload-dir DIR would keep ", mib(plan.optimizer), " of optimizer state on disk");
  throw InputError(str("--memory-limit ", limit, " (", mib((double)limit), ") per rank is too small: rank ", rank,
                       " needs ", plan.describe(), hint, "; raise the limit, or shrink the model or the micro-batch"));
}

}  // namespace mt::train
