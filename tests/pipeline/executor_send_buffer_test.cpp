// The pipeline executor's send buffers (parallel/pipeline/executor.cpp) stay untouched until their send completes.
// One rank's list runs in this process against a stand-in communicator that completes no send before the
// executor waits for it (as a transport whose ring is full does) and only then reads the buffer: every message
// must still hold the tensor of its own micro-batch. The runner reuses one gradient buffer for every backward (the
// contract allows it) and gives each forward its own output buffer; the messages of the other ranks arrive at once.
// IntoRunner writes each output that goes to another rank and each input gradient straight into the executor's
// buffers (forward_into, backward_into): those buffers are the messages, so they too must stay out of the pool until
// their sends complete.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/schedule.h"

namespace {

using namespace mt;

constexpr size_t kN = 1024;  // floats per activation

float act_value(int s, int i, size_t k) { return 1000.0f * (float)s + 10.0f * (float)i + (float)(k % 7); }
float grad_value(int s, int i, size_t k) { return -1000.0f * (float)s - 10.0f * (float)i - (float)(k % 5); }

// A send that the executor must wait for: its bytes are read from the caller's buffer at completion.
struct LateSend : comm::detail::RequestState {
  const void* buf;
  size_t bytes;
  int tag;
  std::map<int, std::vector<float>>* sent;
  bool done = false;
  bool test() override { return false; }  // never finished before the executor waits for it
  void wait() override {
    if (done) return;
    std::vector<float>& v = (*sent)[tag];
    v.resize(bytes / sizeof(float));
    std::memcpy(v.data(), buf, bytes);
    done = true;
  }
};

// Rank `rank` of a pipeline group of `size`; the other ranks are simulated: a receive is filled at once with a
// constant pattern, a send is read only when waited for.
class StandIn : public comm::Communicator {
 public:
  StandIn(int rank, int size) : Communicator(rank, size, "pp") {}
  ~StandIn() override { stop_progress_thread(); }
  const char* backend() const override { return "stand-in"; }
  std::map<int, std::vector<float>> sent;  // by tag, read at the send's completion

 protected:
  void run_collective(const comm::CollArgs&) override { throw Error("stand-in communicator: no collectives"); }
  std::unique_ptr<Communicator> run_split(int, int, const std::string&, uint64_t, double) override {
    throw Error("stand-in communicator: no split");
  }
  comm::Request start_send(const void* buf, size_t bytes, int, int tag) override {
    auto s = std::make_shared<LateSend>();
    s->buf = buf;
    s->bytes = bytes;
    s->tag = tag;
    s->sent = &sent;
    return comm::Request(s);
  }
  comm::Request start_recv(void* buf, size_t bytes, int, int) override {
    std::vector<float> v(bytes / sizeof(float), 0.5f);
    std::memcpy(buf, v.data(), bytes);
    return {};
  }
};

struct PatternRunner : pipeline::StageRunner {
  const pipeline::Placement& pl;
  int rank;
  std::map<std::pair<int, int>, std::vector<float>> out;  // (chunk, micro-batch)
  std::vector<float> dx = std::vector<float>(kN);         // one buffer, rewritten by every backward
  PatternRunner(const pipeline::Placement& p, int r) : pl(p), rank(r) {}
  size_t activation_count() const override { return kN; }
  const float* forward(int c, int i, const float*) override {
    const int s = pl.stage_of(rank, c);
    std::vector<float>& y = out[{c, i}];
    y.resize(kN);
    for (size_t k = 0; k < kN; k++) y[k] = act_value(s, i, k);
    return s == pl.stages() - 1 ? nullptr : y.data();
  }
  const float* backward(int c, int i, const float*) override {
    const int s = pl.stage_of(rank, c);
    for (size_t k = 0; k < kN; k++) dx[k] = grad_value(s, i, k);
    return s == 0 ? nullptr : dx.data();
  }
  const float* backward_input(int c, int i, const float* g) override { return backward(c, i, g); }
  void backward_weight(int, int) override {}
};

// PatternRunner's outputs and input gradients written into the executor's buffers instead (forward_into,
// backward_into); counts the calls.
struct IntoRunner : PatternRunner {
  int into = 0, grad_into = 0;
  using PatternRunner::PatternRunner;
  bool forward_into(int c, int i, const float*, float* y) override {
    const int s = pl.stage_of(rank, c);
    for (size_t k = 0; k < kN; k++) y[k] = act_value(s, i, k);
    into++;
    return true;
  }
  bool backward_into(int c, int i, const float*, bool, float* g) override {
    const int s = pl.stage_of(rank, c);
    for (size_t k = 0; k < kN; k++) g[k] = grad_value(s, i, k);
    grad_into++;
    return true;
  }
};

// Runs every rank's list in turn against the stand-in; returns how many messages it checked (and, with an
// IntoRunner, adds its forward_into calls to *into).
template <class Runner = PatternRunner>
int check_schedule_sends(const pipeline::ScheduleSpec& spec, int* into = nullptr, int* grad_into = nullptr) {
  const pipeline::Schedule sched = pipeline::make_schedule(spec);
  const int S = sched.placement.stages(), m = spec.micro_batches;
  int checked = 0;
  for (int r = 0; r < spec.stages; r++) {
    StandIn pp(r, spec.stages);
    Runner runner(sched.placement, r);
    pipeline::run_actions(spec, sched, pp, runner);
    if constexpr (std::is_same_v<Runner, IntoRunner>) {
      *into += runner.into;
      *grad_into += runner.grad_into;
    }
    for (const auto& [tag, msg] : pp.sent) {
      // tag = (kind m + i) S + the receiving stage (executor.cpp); the sender's stage is one before (activation)
      // or after (gradient) it.
      const int dest = tag % S, kind = tag / S / m, i = tag / S % m;
      const int s = kind == 0 ? dest - 1 : dest + 1;
      EXPECT_GE(msg.size(), kN);
      size_t bad = 0;
      for (size_t k = 0; k < kN && k < msg.size(); k++)
        bad += msg[k] != (kind == 0 ? act_value(s, i, k) : grad_value(s, i, k));
      EXPECT_EQ(bad, 0u) << spec.name << " rank " << r << ": " << (kind == 0 ? "activation" : "gradient")
                         << " of micro-batch " << i << " from stage " << s << ": " << bad << " of " << kN
                         << " floats are not its own when the send completes";
      checked++;
    }
  }
  return checked;
}

TEST(PipelineExecutorSendBuffers, UntouchedUntilTheSendCompletes1F1B) {
  // p = 3, m = 4: 2 activation + 2 gradient sends per micro-batch, the middle rank both.
  EXPECT_EQ(check_schedule_sends({"1f1b", 3, 4, 1}), 4 * 4);
}

TEST(PipelineExecutorSendBuffers, UntouchedUntilTheSendCompletesZbV) {
  // zb-v, p = 2, V = 2: stages 0 1 | 2 3 on ranks 0 1 | 1 0; stage 1 -> 2 is in memory on rank 1, so 2 messages
  // each way per micro-batch.
  EXPECT_EQ(check_schedule_sends({"zb-v", 2, 4, 2}), 4 * 4);
}

TEST(PipelineExecutorSendBuffers, MessagesWrittenByForwardIntoAndBackwardIntoAreUntouchedUntilTheSendCompletes1F1B) {
  int into = 0, grad_into = 0;
  EXPECT_EQ(check_schedule_sends<IntoRunner>({"1f1b", 3, 4, 1}, &into, &grad_into), 4 * 4);
  EXPECT_EQ(into, 2 * 4) << "every activation sent (2 per micro-batch) was written by forward_into";
  EXPECT_EQ(grad_into, 2 * 4) << "every gradient sent (2 per micro-batch) was written by backward_into";
}

TEST(PipelineExecutorSendBuffers, MessagesWrittenByForwardIntoAndBackwardIntoAreUntouchedUntilTheSendCompletesZbV) {
  int into = 0, grad_into = 0;
  EXPECT_EQ(check_schedule_sends<IntoRunner>({"zb-v", 2, 4, 2}, &into, &grad_into), 4 * 4);
  EXPECT_EQ(into, 2 * 4) << "every activation sent (stage 0 -> 1 and 2 -> 3 per micro-batch) by forward_into";
  // Stages 1, 2 and 3 compute an input gradient (3 per micro-batch): 3 -> 2 and 1 -> 0 are sent, 2 -> 1 is handed
  // over in memory on rank 1.
  EXPECT_EQ(grad_into, 3 * 4) << "every input gradient (stages 1-3) was written by backward_into";
}

}  // namespace
