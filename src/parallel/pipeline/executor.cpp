#include "parallel/pipeline/executor.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "core/error.h"

namespace mt::pipeline {

bool StageRunner::forward_into(int, int, const float*, float*) { return false; }
bool StageRunner::backward_into(int, int, const float*, bool, float*) { return false; }

const float* StageRunner::backward_input(int chunk, int micro_batch, const float*) {
  throw Error(str("this stage runner has no split backward: backward_input(i=", micro_batch, ", c=", chunk,
                  ") needs one (use a schedule without backward_input / backward_weight actions)"));
}

void StageRunner::backward_weight(int chunk, int micro_batch) {
  throw Error(str("this stage runner has no split backward: backward_weight(i=", micro_batch, ", c=", chunk, ")"));
}

namespace {

// Every message is the tensor (n floats) followed by the sender's clock when it sent it (a double in two
// floats), so the receiver can tell how long a message it was waiting for took to arrive. A gradient message is
// the buffer the backward copied the runner's gradient into (sized for the stamp), handed to the send as it is;
// an activation is the buffer the runner's forward_into wrote it into (taken from the pool before the forward), or,
// for a runner without forward_into, copied from the runner's output into a message buffer first: that output
// belongs to the runner (its store may drop, recompute or move it after the forward), so the send does not read it
// in place.
constexpr size_t kStamp = sizeof(double) / sizeof(float);

void put_stamp(std::vector<float>& msg, size_t n, double t) { std::memcpy(msg.data() + n, &t, sizeof t); }
double get_stamp(const std::vector<float>& msg, size_t n) {
  double t;
  std::memcpy(&t, msg.data() + n, sizeof t);
  return t;
}

// Message buffers are recycled: a fresh 1 MB buffer costs page faults (~2.5 ms per message measured on this
// VM, more than its transfer), so steady-state steps take them from the pool instead.
std::vector<float> take(std::vector<std::vector<float>>& pool, size_t n) {
  for (size_t i = 0; i < pool.size(); i++) {
    if (pool[i].size() == n) {
      std::vector<float> v = std::move(pool[i]);
      pool[i] = std::move(pool.back());
      pool.pop_back();
      return v;
    }
  }
  return std::vector<float>(n);
}

// A posted receive or an issued send: its request, when it started (for the trace; 0 once traced), and a
// send's own copy of the message.
struct InFlight {
  comm::Request req;
  double t0 = 0;
  std::string what;
  std::vector<float> msg;
};

using Clock = trace::ChromeTrace;
using Key = std::pair<int, int>;  // (micro-batch, chunk)
using Buffers = std::map<Key, std::vector<float>>;
using Requests = std::map<Key, InFlight>;

// One call of PipelineExecutor::run: one rank's list, its buffers in flight and its timings.
class ListRun {
 public:
  ListRun(const ScheduleSpec& spec, const Placement& pl, comm::Communicator& pp, StageRunner& runner,
          std::vector<std::vector<float>>& pool, trace::ChromeTrace* trace)
      : spec_(spec),
        pl_(pl),
        pp_(pp),
        runner_(runner),
        pool_(pool),
        j_(pp.rank()),
        n_(runner.activation_count()),
        nm_(n_ + kStamp),
        trace_(trace && trace->enabled() ? trace : nullptr) {
    st_.chunk_forward_us.assign(spec.virtual_stages, 0.0);
    st_.chunk_backward_us.assign(spec.virtual_stages, 0.0);
    st_.chunk_weight_us.assign(spec.virtual_stages, 0.0);
  }
  void act(const Action& a, const OptimizerStep& step);
  // Completes every send and returns the buffers to the pool; the stats of the call.
  PipelineStats finish(double t_start);
  // The optimizer steps issue no blocking collective: sends stay in flight beside them (PipelineExecutor::begin).
  void set_local_updates(bool on) { local_updates_ = on; }

 private:
  // Tag of a message arriving at global stage s: kind 0 activation, 1 gradient.
  int tag(int kind, int i, int s) const { return (kind * spec_.micro_batches + i) * pl_.stages() + s; }
  std::string label(const char* what, const Action& a, bool to) const {
    return str(what, " i=", a.micro_batch, spec_.virtual_stages > 1 ? str(" c=", a.chunk) : std::string(),
               to ? " to " : " from ", a.peer);
  }
  std::string compute_name(char kind, const Action& a) const {
    return spec_.virtual_stages > 1 ? str(kind, a.micro_batch, "c", a.chunk) : str(kind, a.micro_batch);
  }
  // The chunk of this rank computing micro-batch i's stage s, or -1 when another rank does (or no stage).
  int local_chunk(int i, int s) const {
    if (s < 0 || s >= pl_.stages()) return -1;
    const Slot& x = pl_.slot(i, s);
    return x.rank == j_ ? x.chunk : -1;
  }
  void post_recv(Buffers& bufs, Requests& reqs, const Action& a, int kind, const char* what);
  void wait_recv(Buffers& bufs, Requests& reqs, const Key& key);
  void send(const float* data, const Action& a, int kind, int to_stage, const char* what);
  void send_msg(std::vector<float> msg, double t_call, const Action& a, int kind, int to_stage, const char* what);
  void forward(const Action& a);
  void backward(const Action& a);
  void poll_sends();
  void drain_sends();
  void reap_sends();
  void recycle(Buffers& bufs, const Key& key);

  const ScheduleSpec& spec_;
  const Placement& pl_;
  comm::Communicator& pp_;
  StageRunner& runner_;
  std::vector<std::vector<float>>& pool_;
  const int j_;
  const size_t n_, nm_;
  trace::ChromeTrace* trace_;  // null when not tracing
  PipelineStats st_;
  double step_us_ = 0;  // spent in the optimizer step, which the span leaves out
  bool local_updates_ = false;  // PipelineExecutor::begin's
  Buffers act_in_, grad_in_, grad_out_;
  Requests act_req_, grad_req_;  // receives posted ahead
  std::map<Key, const float*> act_out_;
  Buffers act_msg_;  // activations written by forward_into, each its own message (room for the stamp) until sent
  std::vector<InFlight> sends_;
};

void ListRun::recycle(Buffers& bufs, const Key& key) {
  if (auto it = bufs.find(key); it != bufs.end()) {
    pool_.push_back(std::move(it->second));
    bufs.erase(it);
  }
}

// Trace only: notes sends that have completed since the last look.
void ListRun::poll_sends() {
  if (!trace_) return;
  for (InFlight& f : sends_) {
    if (f.t0 > 0 && f.req.test()) {
      trace_->add(trace::Track::p2p, f.what, "p2p", f.t0, Clock::now_us());
      f.t0 = 0;
    }
  }
}

// Waits for every send issued so far and returns their buffers to the pool.
void ListRun::drain_sends() {
  std::vector<comm::Request> reqs;
  for (InFlight& f : sends_) reqs.push_back(f.req);
  comm::wait_all(reqs);
  const double t = Clock::now_us();
  for (InFlight& f : sends_) {
    if (trace_ && f.t0 > 0) trace_->add(trace::Track::p2p, f.what, "p2p", f.t0, t);
    pool_.push_back(std::move(f.msg));
  }
  sends_.clear();
}

// Returns the buffers of the sends that have completed to the pool; the others stay in flight.
void ListRun::reap_sends() {
  const double t = Clock::now_us();
  std::vector<InFlight> left;
  for (InFlight& f : sends_) {
    if (!f.req.test()) {
      left.push_back(std::move(f));
      continue;
    }
    if (trace_ && f.t0 > 0) trace_->add(trace::Track::p2p, f.what, "p2p", f.t0, t);
    pool_.push_back(std::move(f.msg));
  }
  sends_ = std::move(left);
}

void ListRun::post_recv(Buffers& bufs, Requests& reqs, const Action& a, int kind, const char* what) {
  const double t0 = Clock::now_us();
  const Key key{a.micro_batch, a.chunk};
  auto& buf = bufs[key];
  buf = take(pool_, nm_);
  const int s = pl_.stage_of(j_, a.chunk);
  reqs[key] = {pp_.irecv(buf.data(), nm_, comm::DType::f32, a.peer, tag(kind, a.micro_batch, s)),
               Clock::now_us(),
               trace_ ? label(what, a, false) : std::string(),
               {}};
  st_.post_us += Clock::now_us() - t0;
  st_.posts++;
}

// Waits for a posted receive. A message sent while this rank was already waiting for it measures the
// transport's latency as the pipeline feels it (send to the waiter running again).
void ListRun::wait_recv(Buffers& bufs, Requests& reqs, const Key& key) {
  InFlight& f = reqs.at(key);
  const double t0 = Clock::now_us();
  f.req.wait();
  const double t1 = Clock::now_us();
  st_.wait_us += t1 - t0;
  const double sent = get_stamp(bufs.at(key), n_);
  if (sent >= t0 && t1 >= sent) {
    st_.latency_us += t1 - sent;
    st_.latency_samples++;
  }
  if (trace_) trace_->add(trace::Track::p2p, f.what, "p2p", f.t0, t1);
  reqs.erase(key);
}

void ListRun::send(const float* data, const Action& a, int kind, int to_stage, const char* what) {
  const double t_call = Clock::now_us();
  std::vector<float> msg = take(pool_, nm_);
  std::memcpy(msg.data(), data, sizeof(float) * n_);
  send_msg(std::move(msg), t_call, a, kind, to_stage, what);
}

// Sends msg (the tensor in its first n_ floats, room for the stamp after it) as it is: the send owns the buffer
// until it completes (drain_sends / reap_sends return it to the pool), so nothing else can write it meanwhile.
void ListRun::send_msg(std::vector<float> msg, double t_call, const Action& a, int kind, int to_stage,
                       const char* what) {
  MT_ASSERT(msg.size() == nm_, "pipeline message buffer of ", msg.size(), " floats, expected ", nm_);
  InFlight f;
  f.msg = std::move(msg);
  f.t0 = Clock::now_us();
  put_stamp(f.msg, n_, f.t0);
  f.req = pp_.isend(f.msg.data(), nm_, comm::DType::f32, a.peer, tag(kind, a.micro_batch, to_stage));
  f.what = trace_ ? label(what, a, true) : std::string();
  sends_.push_back(std::move(f));  // the vector's heap buffer moves with it: the send's pointer stays valid
  st_.send_us += Clock::now_us() - t_call;
  st_.sends++;
}

void ListRun::forward(const Action& a) {
  const Key key{a.micro_batch, a.chunk};
  const int s = pl_.stage_of(j_, a.chunk), prev = local_chunk(a.micro_batch, s - 1);
  // A previous stage on this rank hands its output over in memory.
  const float* input = s == 0 ? nullptr : prev >= 0 ? act_out_.at({a.micro_batch, prev}) : act_in_.at(key).data();
  // An output that goes to another rank is written straight into a message buffer if the runner can.
  const bool sent = s < pl_.stages() - 1 && local_chunk(a.micro_batch, s + 1) < 0;
  std::vector<float> msg = sent ? take(pool_, nm_) : std::vector<float>();
  const double t0 = Clock::now_us();
  if (sent && runner_.forward_into(a.chunk, a.micro_batch, input, msg.data())) {
    act_out_[key] = msg.data();
    recycle(act_msg_, key);  // a forward of the same micro-batch and chunk again (not in a list the checker passes)
    act_msg_[key] = std::move(msg);
  } else {
    act_out_[key] = runner_.forward(a.chunk, a.micro_batch, input);
    if (sent) pool_.push_back(std::move(msg));
  }
  const double t1 = Clock::now_us();
  st_.forward_us += t1 - t0;
  st_.chunk_forward_us[a.chunk] += t1 - t0;
  st_.forwards++;
  if (trace_) trace_->add(trace::Track::compute, compute_name('F', a), "forward", t0, t1);
  poll_sends();
}

// backward, or the input-gradient half of a split one.
void ListRun::backward(const Action& a) {
  const Key key{a.micro_batch, a.chunk};
  const int s = pl_.stage_of(j_, a.chunk), next = local_chunk(a.micro_batch, s + 1);
  const float* dout = s == pl_.stages() - 1 ? nullptr
                      : next >= 0           ? grad_out_.at({a.micro_batch, next}).data()
                                            : grad_in_.at(key).data();
  const double t0 = Clock::now_us();
  // The input's gradient goes into an executor buffer with room for the stamp (send_grad sends it as it is): written
  // there by the runner if it can, else copied from the runner's buffer (which it reuses in the next backward).
  const bool split = a.kind == ActionKind::backward_input;
  std::vector<float>* go = nullptr;
  if (s > 0) {
    go = &grad_out_[key];
    *go = take(pool_, nm_);
  }
  if (!go || !runner_.backward_into(a.chunk, a.micro_batch, dout, split, go->data())) {
    const float* g = split ? runner_.backward_input(a.chunk, a.micro_batch, dout)
                           : runner_.backward(a.chunk, a.micro_batch, dout);
    if (go) std::memcpy(go->data(), g, sizeof(float) * n_);
  }
  if (next >= 0) recycle(grad_out_, {a.micro_batch, next});  // the next stage's gradient has been handed over
  const double t1 = Clock::now_us();
  st_.backward_us += t1 - t0;
  st_.chunk_backward_us[a.chunk] += t1 - t0;
  st_.backwards++;
  if (trace_) {
    const char kind = a.kind == ActionKind::backward_input ? 'I' : 'B';
    trace_->add(trace::Track::compute, compute_name(kind, a), "backward", t0, t1);
  }
  recycle(act_in_, key);
  recycle(grad_in_, key);
  poll_sends();
}

void ListRun::act(const Action& a, const OptimizerStep& step) {
  const Key key{a.micro_batch, a.chunk};
  // Trace only: the rank's own time in each message action (the copy, posting, the wait as this rank sees it),
  // on the p2p track under category "executor", to tell the transport's cost from the compute's.
  struct ActionSpan {
    trace::ChromeTrace* t;
    const Action& a;
    double t0 = t && !is_compute(a.kind) && a.kind != ActionKind::optimizer_step ? Clock::now_us() : 0;
    ~ActionSpan() {
      if (t0 > 0) t->add(trace::Track::p2p, to_string(a), "executor", t0, Clock::now_us());
    }
  } span{trace_, a};
  switch (a.kind) {
    case ActionKind::post_recv_act:
      post_recv(act_in_, act_req_, a, 0, "recv activation");
      break;
    case ActionKind::wait_recv_act:
      wait_recv(act_in_, act_req_, key);
      break;
    case ActionKind::forward:
      forward(a);
      break;
    case ActionKind::send_act:
      if (auto it = act_msg_.find(key); it != act_msg_.end()) {  // forward_into's buffer is the message: no copy
        const double t_call = Clock::now_us();
        std::vector<float> msg = std::move(it->second);
        act_msg_.erase(it);
        send_msg(std::move(msg), t_call, a, 0, pl_.stage_of(j_, a.chunk) + 1, "send activation");
      } else {
        send(act_out_.at(key), a, 0, pl_.stage_of(j_, a.chunk) + 1, "send activation");
      }
      break;
    case ActionKind::post_recv_grad:
      post_recv(grad_in_, grad_req_, a, 1, "recv gradient");
      break;
    case ActionKind::wait_recv_grad:
      wait_recv(grad_in_, grad_req_, key);
      break;
    case ActionKind::backward:
    case ActionKind::backward_input:
      backward(a);
      break;
    case ActionKind::backward_weight: {
      const double t0 = Clock::now_us();
      runner_.backward_weight(a.chunk, a.micro_batch);
      const double t1 = Clock::now_us();
      st_.backward_us += t1 - t0;
      st_.chunk_backward_us[a.chunk] += t1 - t0;
      st_.chunk_weight_us[a.chunk] += t1 - t0;
      if (trace_) trace_->add(trace::Track::compute, compute_name('W', a), "backward", t0, t1);
      break;
    }
    case ActionKind::send_grad: {
      // The backward copied the runner's gradient into grad_out_ with room for the stamp: that buffer is the
      // message (no second copy); it leaves grad_out_ and comes back to the pool when the send completes.
      const double t_call = Clock::now_us();
      auto it = grad_out_.find(key);
      MT_ASSERT(it != grad_out_.end(), "send_grad i=", a.micro_batch, " c=", a.chunk, " before its backward");
      std::vector<float> msg = std::move(it->second);
      grad_out_.erase(it);
      send_msg(std::move(msg), t_call, a, 1, pl_.stage_of(j_, a.chunk) - 1, "send gradient");
      break;
    }
    case ActionKind::optimizer_step: {
      // The update may communicate collectively: no sends of this list are left in flight beside it (unless the
      // updates are local: begin's local_updates).
      if (local_updates_)
        reap_sends();
      else
        drain_sends();
      const double t0 = Clock::now_us();
      if (step) step();
      step_us_ += Clock::now_us() - t0;
      break;
    }
  }
}

PipelineStats ListRun::finish(double t_start) {
  drain_sends();
  const double t_end = Clock::now_us();
  for (Buffers* bufs : {&act_in_, &grad_in_, &act_msg_})
    for (auto& [k, v] : *bufs) pool_.push_back(std::move(v));
  st_.span_us = t_end - t_start - step_us_;
  st_.lists = 1;
  return st_;
}

}  // namespace

void run_actions(const ScheduleSpec& spec, const Schedule& schedule, comm::Communicator& pp, StageRunner& runner,
                 PipelineStats* stats, trace::ChromeTrace* trace, const OptimizerStep& step) {
  PipelineExecutor ex;
  ex.run(spec, schedule, pp, runner, stats, trace, step);
}

struct PipelineExecutor::Pieces {
  const Schedule* schedule;
  comm::Communicator* pp;
  double t_start;
  size_t next = 0;
  ListRun list;
};

PipelineExecutor::PipelineExecutor() = default;
PipelineExecutor::~PipelineExecutor() = default;

void PipelineExecutor::begin(const ScheduleSpec& spec, const Schedule& schedule, comm::Communicator& pp,
                             StageRunner& runner, trace::ChromeTrace* trace, bool local_updates) {
  MT_ASSERT(!piece_, "a list run in pieces is already under way");
  MT_ASSERT(pp.size() == spec.stages && schedule.placement.ranks() == spec.stages, "pipeline group of ", pp.size(),
            " ranks for a schedule of ", spec.stages, " (placement of ", schedule.placement.ranks(), ")");
  piece_.reset(new Pieces{&schedule, &pp, Clock::now_us(), 0, ListRun(spec, schedule.placement, pp, runner, pool_, trace)});
  piece_->list.set_local_updates(local_updates);
}

void PipelineExecutor::run_to(size_t end, const OptimizerStep& step) {
  MT_ASSERT(piece_, "run_to without begin");
  const std::vector<Action>& list = (*piece_->schedule)[piece_->pp->rank()];
  MT_ASSERT(end >= piece_->next && end <= list.size(), "run_to(", end, ") from action ", piece_->next, " of ",
            list.size());
  for (; piece_->next < end; piece_->next++) piece_->list.act(list[piece_->next], step);
}

size_t PipelineExecutor::position() const { return piece_ ? piece_->next : 0; }

void PipelineExecutor::finish(PipelineStats* stats) {
  MT_ASSERT(piece_, "finish without begin");
  const std::vector<Action>& list = (*piece_->schedule)[piece_->pp->rank()];
  MT_ASSERT(piece_->next == list.size(), "a list run in pieces finished at action ", piece_->next, " of ", list.size());
  const PipelineStats st = piece_->list.finish(piece_->t_start);
  piece_.reset();
  if (stats) stats->add(st);
}

void PipelineExecutor::run(const ScheduleSpec& spec, const Schedule& schedule, comm::Communicator& pp,
                           StageRunner& runner, PipelineStats* stats, trace::ChromeTrace* trace,
                           const OptimizerStep& step) {
  MT_ASSERT(pp.size() == spec.stages && schedule.placement.ranks() == spec.stages, "pipeline group of ", pp.size(),
            " ranks for a schedule of ", spec.stages, " (placement of ", schedule.placement.ranks(), ")");
  const double t_start = Clock::now_us();
  ListRun list(spec, schedule.placement, pp, runner, pool_, trace);
  for (const Action& a : schedule[pp.rank()]) list.act(a, step);
  const PipelineStats st = list.finish(t_start);
  if (stats) stats->add(st);
}

}  // namespace mt::pipeline
