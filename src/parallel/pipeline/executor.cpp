#include "parallel/pipeline/executor.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "core/error.h"

namespace mt::pipeline {

namespace {

// Every message is the tensor (n floats) followed by the sender's clock when it sent it (a double in two
// floats), so the receiver can tell how long a message it was waiting for took to arrive.
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

}  // namespace

void run_actions(const ScheduleSpec& spec, const std::vector<Action>& actions, comm::Communicator& pp,
                 StageRunner& runner, PipelineStats* stats, trace::ChromeTrace* trace) {
  PipelineExecutor ex;
  ex.run(spec, actions, pp, runner, stats, trace);
}

void PipelineExecutor::run(const ScheduleSpec& spec, const std::vector<Action>& actions, comm::Communicator& pp,
                           StageRunner& runner, PipelineStats* stats, trace::ChromeTrace* trace) {
  std::vector<std::vector<float>>& pool = pool_;
  const int p = spec.stages, m = spec.micro_batches, S = p * spec.virtual_stages, j = pp.rank();
  MT_ASSERT(pp.size() == p, "pipeline group of ", pp.size(), " ranks for a schedule of ", p);
  const size_t n = runner.activation_count(), nm = n + kStamp;
  const bool tracing = trace && trace->enabled();
  using Clock = trace::ChromeTrace;
  PipelineStats st;
  st.chunk_forward_us.assign(spec.virtual_stages, 0.0);
  st.chunk_backward_us.assign(spec.virtual_stages, 0.0);
  const double t_start = Clock::now_us();
  // Tag of a message arriving at global stage s: kind 0 activation, 1 gradient.
  auto tag = [&](int kind, int i, int s) { return (kind * m + i) * S + s; };
  auto label = [&](const char* what, const Action& a, int peer_word) {
    return str(what, " i=", a.micro_batch, spec.virtual_stages > 1 ? str(" c=", a.chunk) : std::string(),
               peer_word ? " to " : " from ", a.peer);
  };
  std::map<std::pair<int, int>, std::vector<float>> act_in, grad_in, grad_out;  // by (micro-batch, chunk)
  std::map<std::pair<int, int>, InFlight> act_req, grad_req;                 // receives posted ahead
  std::map<std::pair<int, int>, const float*> act_out;
  std::vector<InFlight> sends;
  // Trace only: notes sends that have completed since the last look.
  auto poll_sends = [&]() {
    if (!tracing) return;
    for (InFlight& f : sends) {
      if (f.t0 > 0 && f.req.test()) {
        trace->add(trace::Track::p2p, f.what, "p2p", f.t0, Clock::now_us());
        f.t0 = 0;
      }
    }
  };
  auto post_recv = [&](std::map<std::pair<int, int>, std::vector<float>>& bufs,
                       std::map<std::pair<int, int>, InFlight>& reqs, const Action& a, int kind, int s,
                       const char* what) {
    const auto key = std::make_pair(a.micro_batch, a.chunk);
    auto& buf = bufs[key];
    buf = take(pool, nm);
    reqs[key] = {pp.irecv(buf.data(), nm, comm::DType::f32, a.peer, tag(kind, a.micro_batch, s)), Clock::now_us(),
                 tracing ? label(what, a, 0) : std::string(), {}};
  };
  // Waits for a posted receive. A message sent while this rank was already waiting for it measures the
  // transport's latency as the pipeline feels it (send to the waiter running again).
  auto wait_recv = [&](std::map<std::pair<int, int>, std::vector<float>>& bufs,
                       std::map<std::pair<int, int>, InFlight>& reqs, const std::pair<int, int>& key) {
    InFlight& f = reqs.at(key);
    const double t0 = Clock::now_us();
    f.req.wait();
    const double t1 = Clock::now_us();
    st.wait_us += t1 - t0;
    const double sent = get_stamp(bufs.at(key), n);
    if (sent >= t0 && t1 >= sent) {
      st.latency_us += t1 - sent;
      st.latency_samples++;
    }
    if (tracing) trace->add(trace::Track::p2p, f.what, "p2p", f.t0, t1);
    reqs.erase(key);
  };
  auto send = [&](const float* data, const Action& a, int kind, int to_stage, const char* what) {
    InFlight f;
    f.msg = take(pool, nm);
    std::memcpy(f.msg.data(), data, sizeof(float) * n);
    f.t0 = Clock::now_us();
    put_stamp(f.msg, n, f.t0);
    f.req = pp.isend(f.msg.data(), nm, comm::DType::f32, a.peer, tag(kind, a.micro_batch, to_stage));
    f.what = tracing ? label(what, a, 1) : std::string();
    sends.push_back(std::move(f));  // the vector's heap buffer moves with it: the send's pointer stays valid
  };
  auto compute_name = [&](char kind, const Action& a) {
    return spec.virtual_stages > 1 ? str(kind, a.micro_batch, "c", a.chunk) : str(kind, a.micro_batch);
  };
  for (const Action& a : actions) {
    const int s = a.chunk * p + j;
    const auto key = std::make_pair(a.micro_batch, a.chunk);
    switch (a.kind) {
      case ActionKind::post_recv_act:
        post_recv(act_in, act_req, a, 0, s, "recv activation");
        break;
      case ActionKind::wait_recv_act:
        wait_recv(act_in, act_req, key);
        break;
      case ActionKind::forward: {
        // With one rank, consecutive stages are its consecutive chunks: the input is handed over in memory.
        const float* input = s == 0 ? nullptr
                             : p == 1 ? act_out.at({a.micro_batch, a.chunk - 1})
                                      : act_in.at(key).data();
        const double t0 = Clock::now_us();
        act_out[key] = runner.forward(a.chunk, a.micro_batch, input);
        const double t1 = Clock::now_us();
        st.forward_us += t1 - t0;
        st.chunk_forward_us[a.chunk] += t1 - t0;
        st.forwards++;
        if (tracing) trace->add(trace::Track::compute, compute_name('F', a), "forward", t0, t1);
        poll_sends();
        break;
      }
      case ActionKind::send_act:
        send(act_out.at(key), a, 0, s + 1, "send activation");
        break;
      case ActionKind::post_recv_grad:
        post_recv(grad_in, grad_req, a, 1, s, "recv gradient");
        break;
      case ActionKind::wait_recv_grad:
        wait_recv(grad_in, grad_req, key);
        break;
      case ActionKind::backward: {
        const float* dout = s == S - 1 ? nullptr
                            : p == 1   ? grad_out.at({a.micro_batch, a.chunk + 1}).data()
                                       : grad_in.at(key).data();
        const double t0 = Clock::now_us();
        const float* g = runner.backward(a.chunk, a.micro_batch, dout);
        if (s > 0) {  // the runner reuses its buffer in the next backward
          std::vector<float>& go = grad_out[key];
          go = take(pool, n);
          std::memcpy(go.data(), g, sizeof(float) * n);
        }
        if (p == 1 && a.chunk + 1 < spec.virtual_stages) {  // the next chunk's gradient has been handed over
          auto it = grad_out.find({a.micro_batch, a.chunk + 1});
          pool.push_back(std::move(it->second));
          grad_out.erase(it);
        }
        const double t1 = Clock::now_us();
        st.backward_us += t1 - t0;
        st.chunk_backward_us[a.chunk] += t1 - t0;
        st.backwards++;
        if (tracing) trace->add(trace::Track::compute, compute_name('B', a), "backward", t0, t1);
        for (auto* bufs : {&act_in, &grad_in}) {
          if (auto it = bufs->find(key); it != bufs->end()) {
            pool.push_back(std::move(it->second));
            bufs->erase(it);
          }
        }
        poll_sends();
        break;
      }
      case ActionKind::send_grad:
        send(grad_out.at(key).data(), a, 1, s - 1, "send gradient");
        pool.push_back(std::move(grad_out.at(key)));
        grad_out.erase(key);
        break;
      case ActionKind::optimizer_step:
        break;  // the trainer reduces gradients and steps after the list
    }
  }
  std::vector<comm::Request> reqs;
  for (InFlight& f : sends) reqs.push_back(f.req);
  comm::wait_all(reqs);
  const double t_end = Clock::now_us();
  if (tracing)
    for (InFlight& f : sends)
      if (f.t0 > 0) trace->add(trace::Track::p2p, f.what, "p2p", f.t0, t_end);
  for (InFlight& f : sends) pool.push_back(std::move(f.msg));
  for (auto* bufs : {&act_in, &grad_in})
    for (auto& [k, v] : *bufs) pool.push_back(std::move(v));
  st.span_us = t_end - t_start;
  st.lists = 1;
  if (stats) stats->add(st);
}

}  // namespace mt::pipeline
