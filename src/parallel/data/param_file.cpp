#include "parallel/data/param_file.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace mt::parallel {

std::unique_ptr<offload::ShardFile> make_shard_file(const DataParallelOptions& o, const char* kind, size_t n) {
  offload::ShardFile::Options fo;
  fo.dir = o.offload_dir;
  fo.kind = kind;
  fo.n = n;
  fo.timeout_s = o.offload_timeout_s;
  fo.record_events = o.offload_events;
  fo.io_block = o.offload_io_block;
  return std::make_unique<offload::ShardFile>(fo);
}

// ---- StreamedTiles ----

StreamedTiles::StreamedTiles(offload::ShardFile* pf, float* pmem, offload::ShardFile* gf, const float* gmem,
                             const std::vector<optim::Segment>& segments)
    : pf_(pf), pmem_(pmem), gf_(gf), gmem_(gmem), prun_(runs(segments, true)), grun_(runs(segments, false)) {
  MT_ASSERT(pf_ || pmem_, "a streamed tile source without parameters");
  MT_ASSERT(gf_ || gmem_, "a streamed tile source without gradients");
}

StreamedTiles::~StreamedTiles() {
  for (offload::ShardFile* f : {pf_, gf_}) {
    try {
      if (f) f->drain();
    } catch (...) {  // the error was thrown on the update's path already
    }
  }
}

std::vector<FlatRange> group_ranges(const nn::ParamRegistry& reg) {
  std::vector<FlatRange> out(reg.num_groups());
  std::vector<bool> seen(out.size(), false);
  for (const nn::Param& p : reg.params()) {
    FlatRange& g = out[p.group];
    if (!seen[p.group]) {
      g.begin = p.offset;
      seen[p.group] = true;
    }
    g.count = std::max(g.count, p.offset + p.numel - g.begin);
  }
  return out;
}

std::vector<StreamedTiles::Run> StreamedTiles::runs(const std::vector<optim::Segment>& segs, bool params) {
  std::vector<optim::Segment> s = segs;
  std::sort(s.begin(), s.end(), [](const optim::Segment& a, const optim::Segment& b) { return a.state < b.state; });
  std::vector<Run> out;
  for (const optim::Segment& x : s) {
    if (x.count == 0) continue;
    const size_t at = params ? x.param : x.grad;
    if (!out.empty() && out.back().state + out.back().count == x.state && out.back().at + out.back().count == at)
      out.back().count += x.count;
    else
      out.push_back({x.state, at, x.count});
  }
  return out;
}

void StreamedTiles::pieces(const std::vector<Run>& rs, size_t lo, size_t hi,
                           const std::function<void(size_t, size_t, size_t)>& fn) {
  // The first run ending after lo, then on while runs start before hi.
  auto it = std::upper_bound(rs.begin(), rs.end(), lo, [](size_t v, const Run& r) { return v < r.state + r.count; });
  for (; it != rs.end() && it->state < hi; ++it) {
    const size_t a = std::max(lo, it->state), e = std::min(hi, it->state + it->count);
    if (a < e) fn(it->at + (a - it->state), e - a, a - lo);
  }
}

void StreamedTiles::begin(size_t T, size_t n) {
  T_ = T;
  n_ = n;
  for (int k = 0; k < 2; k++) {
    if (pf_) p_[k].resize(T);
    g_[k].resize(T);
  }
  queue(0);
}

void StreamedTiles::queue(size_t t) {
  const size_t lo = t * T_, hi = std::min(n_, lo + T_);
  float* p = p_[t % 2].data();
  float* g = g_[t % 2].data();
  if (pf_) pieces(prun_, lo, hi, [&](size_t at, size_t c, size_t k) { pt_[t % 2] = pf_->read_async(at, c, p + k); });
  if (gf_) pieces(grun_, lo, hi, [&](size_t at, size_t c, size_t k) { gt_[t % 2] = gf_->read_async(at, c, g + k); });
}

std::pair<float*, const float*> StreamedTiles::open(size_t t, size_t lo, size_t hi) {
  if (pf_ && pt_[t % 2]) pf_->wait(pt_[t % 2]);  // and every job queued before it
  if (gf_ && gt_[t % 2]) gf_->wait(gt_[t % 2]);
  if ((t + 1) * T_ < n_) queue(t + 1);
  float* g = g_[t % 2].data();
  if (!gf_) pieces(grun_, lo, hi, [&](size_t at, size_t c, size_t k) { std::memcpy(g + k, gmem_ + at, sizeof(float) * c); });
  return {pf_ ? p_[t % 2].data() : pmem_, g};
}

void StreamedTiles::close(size_t t, size_t lo, size_t hi) {
  // Borrowed until the file's queue reaches them: the next read into this buffer (tile t + 2's) is queued
  // after these writes, and the single I/O thread runs them in order.
  if (!pf_) return;  // updated in place
  const float* p = p_[t % 2].data();
  pieces(prun_, lo, hi, [&](size_t at, size_t c, size_t k) { pf_->write_async(at, c, p + k); });
}

void StreamedTiles::end() {
  if (pf_) pf_->drain();
  if (gf_) gf_->drain();
  for (int k = 0; k < 2; k++) {
    p_[k] = AlignedBuffer();
    g_[k] = AlignedBuffer();
    pt_[k] = gt_[k] = 0;
  }
}

// ---- FullParamFile ----

FullParamFile::FullParamFile(BucketSet& b) : b_(b) {
  nn::ParamRegistry& reg = b_.params;
  const std::vector<FlatRange> ranges = group_ranges(reg);
  groups_.resize(ranges.size());
  for (size_t g = 0; g < ranges.size(); g++) {
    groups_[g].begin = ranges[g].begin;
    groups_[g].count = ranges[g].count;
    slot_ = std::max(slot_, ranges[g].count);
  }
  f_ = make_shard_file(b_.opt, "parameters", std::max<size_t>(reg.size(), 1));
}

FullParamFile::~FullParamFile() {
  try {
    if (f_) f_->drain();
  } catch (...) {  // the error was or will be reported on the caller's path
  }
}

void FullParamFile::bind(int g, float* base) {
  nn::ParamRegistry& reg = b_.params;
  const Group& gr = groups_[g];
  for (nn::Param& p : reg.params())
    if (p.group == g) p.data = base ? base + (p.offset - gr.begin) : nullptr;
}

size_t FullParamFile::slot_bytes() const {
  size_t nonempty = 0;
  for (const Group& gr : groups_) nonempty += gr.count > 0;
  return std::max<size_t>(1, std::min<size_t>(3, nonempty)) * std::max<size_t>(slot_, 1) * sizeof(float);
}

AlignedBuffer FullParamFile::take() {
  if (free_.empty()) return AlignedBuffer(std::max<size_t>(slot_, 1));
  AlignedBuffer b = std::move(free_.back());
  free_.pop_back();
  return b;
}

void FullParamFile::give(AlignedBuffer& buf) {
  if (buf.size() == 0) return;
  free_.push_back(std::move(buf));
  buf = AlignedBuffer();
}

void FullParamFile::initialize(const std::function<void(nn::Param&)>& fill) {
  AlignedBuffer tmp = take();
  for (int g = 0; g < (int)groups_.size(); g++) {
    Group& gr = groups_[g];
    if (gr.count == 0) continue;
    std::fill(tmp.data(), tmp.data() + gr.count, 0.0f);  // as a fresh buffer: a fill may leave parts alone
    bind(g, tmp.data());
    for (nn::Param& p : b_.params.params())
      if (p.group == g) fill(p);
    bind(g, nullptr);
    f_->write(gr.begin, gr.count, tmp.data());
  }
  give(tmp);
}

void FullParamFile::queue(Group& gr) {
  if (gr.queued || gr.bound || gr.count == 0) return;
  gr.buf = take();
  gr.ticket = f_->read_async(gr.begin, gr.count, gr.buf.data());
  gr.queued = true;
}

void FullParamFile::use(int g, int ahead) {
  Group& gr = groups_[g];
  if (!gr.bound && gr.count > 0) {
    queue(gr);
    f_->wait(gr.ticket);
    gr.queued = false;
    gr.bound = true;
    bind(g, gr.buf.data());
  }
  if (ahead >= 0 && ahead < (int)groups_.size()) queue(groups_[ahead]);
}

void FullParamFile::done(int g) {
  Group& gr = groups_[g];
  if (!gr.bound) return;
  bind(g, nullptr);
  give(gr.buf);
  gr.bound = false;
}

void FullParamFile::release_all() {
  for (int g = 0; g < (int)groups_.size(); g++) {
    Group& gr = groups_[g];
    if (gr.queued) {
      f_->wait(gr.ticket);
      give(gr.buf);
      gr.queued = false;
    }
    done(g);
  }
}

void FullParamFile::refresh_mirror() {
  nn::ParamRegistry& reg = b_.params;
  if (!reg.mirrored()) return;
  release_all();
  AlignedBuffer tmp = take();
  for (int g = 0; g < (int)groups_.size(); g++) {
    Group& gr = groups_[g];
    if (gr.count == 0) continue;
    f_->read(gr.begin, gr.count, tmp.data());
    bind(g, tmp.data());
    reg.refresh_mirror(gr.begin, gr.count);
    bind(g, nullptr);
  }
  give(tmp);
}

void FullParamFile::read_all(float* out) {
  if (b_.params.size() > 0) f_->read(0, b_.params.size(), out);
}

void FullParamFile::write_all(const float* in) {
  release_all();  // no read of the old values in flight
  if (b_.params.size() > 0) f_->write(0, b_.params.size(), in);
}

void FullParamFile::all_gather_buckets() {
  for (Bucket* b : b_.buckets) {
    if (b->alone()) continue;
    AlignedBuffer buf = b_.acquire(b->count);
    f_->read(b->begin + b->so, b->sc, buf.data() + b->so);
    const double t0 = trace::ChromeTrace::now_us();
    b->comm->all_gather(buf.data() + b->so, buf.data(), b->count, comm::DType::f32);
    if (b_.trace) b_.trace->add(trace::Track::comm, "all_gather parameters", "comm", t0, trace::ChromeTrace::now_us());
    f_->write(b->begin, b->count, buf.data());
    b_.give_back(buf);
  }
}

}  // namespace mt::parallel
