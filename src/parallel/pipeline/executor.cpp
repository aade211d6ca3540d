#include "parallel/pipeline/executor.h"

#include <cstring>
#include <map>
#include <utility>

#include "core/error.h"

namespace mt::pipeline {

void run_actions(const ScheduleSpec& spec, const std::vector<Action>& actions, comm::Communicator& pp,
                 StageRunner& runner) {
  const int p = spec.stages, m = spec.micro_batches, S = p * spec.virtual_stages, j = pp.rank();
  MT_ASSERT(pp.size() == p, "pipeline group of ", pp.size(), " ranks for a schedule of ", p);
  const size_t n = runner.activation_count();
  // Tag of a message arriving at global stage s: kind 0 activation, 1 gradient.
  auto tag = [&](int kind, int i, int s) { return (kind * m + i) * S + s; };
  std::map<std::pair<int, int>, std::vector<float>> act_in, grad_in, grad_out;  // by (micro-batch, chunk)
  std::map<std::pair<int, int>, comm::Request> act_req, grad_req;             // receives posted ahead
  std::map<std::pair<int, int>, const float*> act_out;
  std::vector<comm::Request> sends;
  for (const Action& a : actions) {
    const int s = a.chunk * p + j;
    const auto key = std::make_pair(a.micro_batch, a.chunk);
    switch (a.kind) {
      case ActionKind::post_recv_act: {
        auto& buf = act_in[key];
        buf.resize(n);
        act_req[key] = pp.irecv(buf.data(), n, comm::DType::f32, a.peer, tag(0, a.micro_batch, s));
        break;
      }
      case ActionKind::wait_recv_act:
        act_req.at(key).wait();
        act_req.erase(key);
        break;
      case ActionKind::forward:
        act_out[key] = runner.forward(a.chunk, a.micro_batch, s == 0 ? nullptr : act_in.at(key).data());
        break;
      case ActionKind::send_act:
        sends.push_back(pp.isend(act_out.at(key), n, comm::DType::f32, a.peer, tag(0, a.micro_batch, s + 1)));
        break;
      case ActionKind::post_recv_grad: {
        auto& buf = grad_in[key];
        buf.resize(n);
        grad_req[key] = pp.irecv(buf.data(), n, comm::DType::f32, a.peer, tag(1, a.micro_batch, s));
        break;
      }
      case ActionKind::wait_recv_grad:
        grad_req.at(key).wait();
        grad_req.erase(key);
        break;
      case ActionKind::backward: {
        const float* g = runner.backward(a.chunk, a.micro_batch, s == S - 1 ? nullptr : grad_in.at(key).data());
        if (s > 0) grad_out[key].assign(g, g + n);  // the runner's buffer is reused by the next backward
        act_in.erase(key);
        grad_in.erase(key);
        break;
      }
      case ActionKind::send_grad:
        sends.push_back(
            pp.isend(grad_out.at(key).data(), n, comm::DType::f32, a.peer, tag(1, a.micro_batch, s - 1)));
        break;
      case ActionKind::optimizer_step:
        break;  // the trainer reduces gradients and steps after the list
    }
  }
  comm::wait_all(sends);
}

}  // namespace mt::pipeline
