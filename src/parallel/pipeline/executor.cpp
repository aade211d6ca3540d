#include "parallel/pipeline/executor.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "core/error.h"

namespace mt::pipeline {

void PipelineStats::add(const PipelineStats& o) {
  span_us += o.span_us;
  forward_us += o.forward_us;
  backward_us += o.backward_us;
  wait_us += o.wait_us;
  forwards += o.forwards;
  backwards += o.backwards;
  lists += o.lists;
  chunk_forward_us.resize(std::max(chunk_forward_us.size(), o.chunk_forward_us.size()), 0.0);
  chunk_backward_us.resize(std::max(chunk_backward_us.size(), o.chunk_backward_us.size()), 0.0);
  for (size_t c = 0; c < o.chunk_forward_us.size(); c++) chunk_forward_us[c] += o.chunk_forward_us[c];
  for (size_t c = 0; c < o.chunk_backward_us.size(); c++) chunk_backward_us[c] += o.chunk_backward_us[c];
}

namespace {

// A posted receive or an issued send, for the trace: when it started and what it carries.
struct InFlight {
  comm::Request req;
  double t0 = 0;
  std::string what;
};

}  // namespace

void run_actions(const ScheduleSpec& spec, const std::vector<Action>& actions, comm::Communicator& pp,
                 StageRunner& runner, PipelineStats* stats, trace::ChromeTrace* trace) {
  const int p = spec.stages, m = spec.micro_batches, S = p * spec.virtual_stages, j = pp.rank();
  MT_ASSERT(pp.size() == p, "pipeline group of ", pp.size(), " ranks for a schedule of ", p);
  const size_t n = runner.activation_count();
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
  std::map<std::pair<int, int>, size_t> act_send;  // (micro-batch, chunk) -> its activation's entry in sends
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
  auto wait_recv = [&](std::map<std::pair<int, int>, InFlight>& reqs, const std::pair<int, int>& key) {
    InFlight& f = reqs.at(key);
    const double t0 = Clock::now_us();
    f.req.wait();
    const double t1 = Clock::now_us();
    st.wait_us += t1 - t0;
    if (tracing) trace->add(trace::Track::p2p, f.what, "p2p", f.t0, t1);
    reqs.erase(key);
  };
  auto compute_name = [&](char kind, const Action& a) {
    return spec.virtual_stages > 1 ? str(kind, a.micro_batch, "c", a.chunk) : str(kind, a.micro_batch);
  };
  for (const Action& a : actions) {
    const int s = a.chunk * p + j;
    const auto key = std::make_pair(a.micro_batch, a.chunk);
    switch (a.kind) {
      case ActionKind::post_recv_act: {
        auto& buf = act_in[key];
        buf.resize(n);
        act_req[key] = {pp.irecv(buf.data(), n, comm::DType::f32, a.peer, tag(0, a.micro_batch, s)),
                        Clock::now_us(), tracing ? label("recv activation", a, 0) : std::string()};
        break;
      }
      case ActionKind::wait_recv_act:
        wait_recv(act_req, key);
        break;
      case ActionKind::forward: {
        const double t0 = Clock::now_us();
        // With one rank, consecutive stages are its consecutive chunks: the input is handed over in memory.
        const float* input = s == 0 ? nullptr
                             : p == 1 ? act_out.at({a.micro_batch, a.chunk - 1})
                                      : act_in.at(key).data();
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
        act_send[key] = sends.size();
        sends.push_back({pp.isend(act_out.at(key), n, comm::DType::f32, a.peer, tag(0, a.micro_batch, s + 1)),
                         Clock::now_us(), tracing ? label("send activation", a, 1) : std::string()});
        break;
      case ActionKind::post_recv_grad: {
        auto& buf = grad_in[key];
        buf.resize(n);
        grad_req[key] = {pp.irecv(buf.data(), n, comm::DType::f32, a.peer, tag(1, a.micro_batch, s)),
                         Clock::now_us(), tracing ? label("recv gradient", a, 0) : std::string()};
        break;
      }
      case ActionKind::wait_recv_grad:
        wait_recv(grad_req, key);
        break;
      case ActionKind::backward: {
        // The runner may free this micro-batch's activations, the output it sent among them: that send must
        // be complete (it is in practice: the next stage's backward of it has already been received).
        if (auto it = act_send.find(key); it != act_send.end()) {
          InFlight& f = sends[it->second];
          f.req.wait();
          if (tracing && f.t0 > 0) {
            trace->add(trace::Track::p2p, f.what, "p2p", f.t0, Clock::now_us());
            f.t0 = 0;
          }
          act_send.erase(it);
        }
        const double t0 = Clock::now_us();
        const float* dout = s == S - 1 ? nullptr
                            : p == 1   ? grad_out.at({a.micro_batch, a.chunk + 1}).data()
                                       : grad_in.at(key).data();
        const float* g = runner.backward(a.chunk, a.micro_batch, dout);
        if (s > 0) grad_out[key].assign(g, g + n);  // the runner's buffer is reused by the next backward
        const double t1 = Clock::now_us();
        st.backward_us += t1 - t0;
        st.chunk_backward_us[a.chunk] += t1 - t0;
        st.backwards++;
        if (tracing) trace->add(trace::Track::compute, compute_name('B', a), "backward", t0, t1);
        act_in.erase(key);
        grad_in.erase(key);
        poll_sends();
        break;
      }
      case ActionKind::send_grad:
        sends.push_back({pp.isend(grad_out.at(key).data(), n, comm::DType::f32, a.peer,
                                  tag(1, a.micro_batch, s - 1)),
                         Clock::now_us(), tracing ? label("send gradient", a, 1) : std::string()});
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
  st.span_us = t_end - t_start;
  st.lists = 1;
  if (stats) stats->add(st);
}

}  // namespace mt::pipeline
