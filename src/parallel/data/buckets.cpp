#include "parallel/data/buckets.h"

#include <algorithm>
#include <cstdint>
#include <memory>

#include "core/error.h"

namespace mt::parallel {

struct BucketSet::Pending {
  comm::Request req;
  std::function<void()> on_done;
  std::string what;  // for the trace
  double t_issue = 0, t_done = 0;
  AlignedBuffer tmp;  // a reduce-scatter into a temporary shard
};

BucketSet::BucketSet(nn::ParamRegistry& p, comm::Communicator* d, const DataParallelOptions& o,
                     comm::Communicator* e)
    : params(p), dp(d), opt(o), experts(e) {
  MT_CHECK_INPUT(o.zero >= 0 && o.zero <= 3, "--zero must be 0, 1, 2 or 3, got ", o.zero);
  MT_CHECK_INPUT(o.bucket_mb > 0, "--bucket-mb must be positive, got ", o.bucket_mb);
  if (dp) {
    n = dp->size();
    r = dp->rank();
  }
  if (experts) {
    en = experts->size();
    er = experts->rank();
  }
  for (const nn::Param& q : p.params()) has_experts = has_experts || q.expert;
}

BucketSet::~BucketSet() {
  quiesce();
  for (Pending* p : inflight_) delete p;
  for (Bucket* b : buckets) delete b;
}

void BucketSet::quiesce() {
  for (Pending* p : inflight_) {
    try {
      p->req.wait();
    } catch (...) {
    }
  }
  for (Bucket* b : buckets) {
    try {
      b->gather.wait();
    } catch (...) {
    }
  }
}

size_t BucketSet::build(bool one_group_each) {
  const int G = params.num_groups();
  // Pieces: each group's other tensors, then its expert tensors (one contiguous flat range each).
  struct Piece {
    int group;
    bool expert;
    size_t begin, end;
  };
  std::vector<Piece> pieces;
  for (const nn::Param& p : params.params()) {
    if (!pieces.empty() && pieces.back().group == p.group && pieces.back().expert == p.expert) {
      pieces.back().end = p.offset + p.numel;
      continue;
    }
    MT_ASSERT(pieces.empty() || pieces.back().group != p.group || p.expert,
              "expert tensors must come last in their group: ", p.name);
    pieces.push_back({p.group, p.expert, p.offset, p.offset + p.numel});
  }
  const size_t limit = std::max<size_t>(1, (size_t)(opt.bucket_mb * 1048576.0 / sizeof(float)));
  group_buckets.assign(G, {});
  // Pieces in descending flat order: the order backward finishes them (a model registers its layers in
  // forward order), and consecutive pieces tile the buffer, so every bucket is one flat range. (A pipeline
  // stage's tied wte copy is registered last though its group id is 0: order by offset, not by id.) Expert
  // pieces never share a bucket with other tensors.
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.begin > b.begin; });
  Bucket* cur = nullptr;
  size_t hi = 0;
  for (size_t k = 0; k < pieces.size(); k++) {
    const Piece& pc = pieces[k];
    if (!cur) {
      cur = new Bucket;
      cur->g_hi = pc.group;
      cur->expert = pc.expert;
      hi = pc.end;
    }
    cur->g_lo = pc.group;
    cur->groups++;
    group_buckets[pc.group].push_back((int)buckets.size());
    const size_t size = hi - pc.begin;
    const bool last = k + 1 == pieces.size() || pieces[k + 1].expert != cur->expert;
    if (one_group_each || size >= limit || last) {
      cur->begin = pc.begin;
      cur->count = size;
      cur->index = (int)buckets.size();
      buckets.push_back(cur);
      cur = nullptr;
    }
  }
  // Each bucket's group, and this rank's shard of it, packed in bucket order.
  size_t pos = 0;
  for (Bucket* b : buckets) {
    b->comm = b->expert ? experts : dp;
    b->n = b->expert ? en : n;
    b->r = b->expert ? er : r;
    const comm::Shard s = comm::shard_of(b->count, b->n, b->r);
    b->so = s.offset;
    b->sc = s.count;
    b->pos = pos;
    pos += s.count;
  }
  return pos;
}

std::vector<FlatRange> BucketSet::ranges() const {
  std::vector<FlatRange> out;
  for (const Bucket* b : buckets) out.push_back({b->begin, b->count});
  return out;
}

std::vector<optim::Segment> BucketSet::shard_segments(bool params_packed, bool grads_packed) const {
  // Segments in flat order of parameters; each parameter may span several buckets' shards.
  std::vector<optim::Segment> segs;
  int index = -1;
  for (const nn::Param& p : params.params()) {
    index++;
    for (const Bucket* b : buckets) {
      const size_t lo = std::max(p.offset, b->begin + b->so);
      const size_t hi = std::min(p.offset + p.numel, b->begin + b->so + b->sc);
      if (lo >= hi) continue;
      const size_t shard = b->pos + (lo - (b->begin + b->so));
      segs.push_back(
          {params_packed ? shard : lo, grads_packed ? shard : lo, shard, hi - lo, p.decay, index, lo - p.offset, &p});
    }
  }
  return segs;
}

void BucketSet::bind_data(Bucket& b, float* base) {
  for (nn::Param& p : params.params())
    if (p.offset >= b.begin && p.offset < b.begin + b.count) p.data = base ? base + (p.offset - b.begin) : nullptr;
}

void BucketSet::bind_grad(Bucket& b, float* base) {
  for (nn::Param& p : params.params())
    if (p.offset >= b.begin && p.offset < b.begin + b.count) p.grad = base ? base + (p.offset - b.begin) : nullptr;
}

AlignedBuffer BucketSet::acquire(size_t count) {
  for (size_t i = 0; i < pool_.size(); i++) {
    if (pool_[i].size() == count) {
      AlignedBuffer b = std::move(pool_[i]);
      pool_.erase(pool_.begin() + i);
      return b;
    }
  }
  pooled_bytes += count * sizeof(float);
  return AlignedBuffer::shared(count);
}

void BucketSet::give_back(AlignedBuffer& buf) {
  if (buf.size() == 0) return;
  pool_.push_back(std::move(buf));
  buf = AlignedBuffer();
}

std::string BucketSet::group_name(int g) const {
  for (const nn::Param& p : params.params()) {
    if (p.group != g) continue;
    size_t dot = p.name.find('.');
    if (p.name.rfind("h.", 0) == 0) dot = p.name.find('.', 2);
    return p.name.substr(0, dot);
  }
  return "group " + std::to_string(g);
}

void BucketSet::reduce(Bucket& b, const float* send, float* recv, bool scatter,
                       std::function<void(const float*)> then) {
  auto* p = new Pending;
  if (trace && trace->enabled()) {
    p->t_issue = trace::ChromeTrace::now_us();
    p->what = str(scatter ? "reduce_scatter " : "all_reduce ", group_name(b.g_lo),
                  b.g_hi != b.g_lo ? ".." + group_name(b.g_hi) : std::string(), b.expert ? " experts (edp, " : " (",
                  (double)b.count * (opt.grad_dtype == comm::DType::f32 ? 4 : 2) / 1048576.0, " MB)");
  }
  if (!recv) {
    p->tmp.resize(b.sc);
    recv = p->tmp.data();
  }
  const size_t count = b.count, out = scatter ? b.sc : count;
  std::function<void()> widen;
  if (opt.grad_dtype == comm::DType::f32) {
    p->req = scatter ? b.comm->ireduce_scatter(send, recv, count, comm::DType::f32, comm::ReduceOp::sum)
                     : b.comm->iall_reduce(send, recv, count, comm::DType::f32, comm::ReduceOp::sum);
  } else {
    // bf16 on the wire: round the gradients to bf16, reduce (f32 accumulation inside comm), widen back.
    auto s16 = std::make_shared<std::vector<comm::bf16_t>>(count);
    auto r16 = std::make_shared<std::vector<comm::bf16_t>>(out);
    for (size_t i = 0; i < count; i++) (*s16)[i] = comm::f32_to_bf16(send[i]);
    p->req = scatter ? b.comm->ireduce_scatter(s16->data(), r16->data(), count, comm::DType::bf16, comm::ReduceOp::sum)
                     : b.comm->iall_reduce(s16->data(), r16->data(), count, comm::DType::bf16, comm::ReduceOp::sum);
    widen = [s16, r16, recv, out] {
      for (size_t i = 0; i < out; i++) recv[i] = comm::bf16_to_f32((*r16)[i]);
    };
  }
  p->on_done = [widen, then, recv] {
    if (widen) widen();
    if (then) then(recv);
  };
  inflight_.push_back(p);
}

void BucketSet::complete_oldest() {
  Pending* p = inflight_.front();
  inflight_.erase(inflight_.begin());
  p->req.wait();
  if (trace && trace->enabled())
    trace->add(trace::Track::comm, p->what, "comm", p->t_issue, p->t_done ? p->t_done : trace::ChromeTrace::now_us());
  if (p->on_done) p->on_done();
  delete p;
}

void BucketSet::finish() {
  while (!inflight_.empty()) complete_oldest();
}

void BucketSet::poll() {
  if (!trace || !trace->enabled()) return;
  for (Pending* p : inflight_)
    if (p->t_done == 0 && p->req.test()) p->t_done = trace::ChromeTrace::now_us();
}

}  // namespace mt::parallel
