#include "train/no_flush_steps.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "comm/launch.h"
#include "core/error.h"
#include "parallel/pipeline/no_flush.h"
#include "tensor/buffer.h"
#include "train/grad_sync.h"
#include "train/train_config.h"

namespace mt::train {

bool no_flush_applies(const TrainConfig& cfg, int micro_batches, std::string* reason) {
  auto no = [&](const std::string& why) {
    if (reason) *reason = why;
    return false;
  };
  if (cfg.pp <= 1 || cfg.schedule != "pipedream-2bw") return no("not --schedule pipedream-2bw at --pp > 1");
  if (micro_batches < cfg.pp)
    return no(str(micro_batches, " micro-batches per step, fewer than --pp ", cfg.pp,
                  " (two steps' micro-batches in flight would share activation keys)"));
  if (cfg.zero > 1) return no("--zero 2/3");
  if (cfg.gpt.moe_every > 0) return no("a mixture-of-experts model (its routing statistics are per step)");
  if (cfg.model != ModelKind::gpt) return no("a model other than gpt");
  // Blocking updates wait for the list's sends first; under MPI a large send completes only once the receiver
  // has posted its receive, which the peer does after its own update: the window would stall.
  std::string why;
  if ((cfg.backend == BackendKind::mpi || (cfg.backend == BackendKind::automatic && comm::under_mpirun())) &&
      !split_exchange_applies(cfg, &why))
    return no("the MPI backend with updates that stay blocking (" + why + ")");
  return true;
}

namespace {

class NoFlushSteps : public WindowSteps {
 public:
  NoFlushSteps(TrainTask& task, const PipelineContext& pp, trace::ChromeTrace* trace, NoFlushParts parts)
      : WindowSteps(task, pp, trace, parts.share, parts.window_ends_after), parts_(std::move(parts)) {
    MT_ASSERT(pp_.spec.virtual_stages == 1 && parts_.params && parts_.share && parts_.window_ends_after &&
                  parts_.swap_versions,
              "the no-flush executor needs one chunk per rank and all its parts");
  }

  void run(int64_t s, const BatchShare& share, const StepHooks&, const StepUpdate& update) override {
    enter(s, share);
    if (parts_.split && !split_made_) {
      xs_ = parts_.split();
      split_made_ = true;
    }
    open_at(s);
    swapped_ = false;  // the loop's begin_step has swapped in W(s-1)
    task_.begin_step(s);
    if (diverted_) restore_grads();
    const int t = (int)(s - first_);
    run_step(s, 1, [&] {
      if (swapped_) swap();  // A = W(s-1) again, as the store's update expects
      if (xs_) {  // what later steps' backwards added aside, the reduced g_s into the registry
        nn::ParamRegistry& p = *parts_.params;
        if (dirty_) {
          side_.resize(p.size());
          std::memcpy(side_.data(), p.grad(), p.size() * sizeof(float));
        }
        diverted_ = dirty_;
        const double t0 = trace::ChromeTrace::now_us();
        const SplitExchange::Outcome o = xs_->finish(s, p.grad());
        if (trace_ && trace_->enabled())  // what U(s) waited for of the reductions started after the backwards
          trace_->add(trace::Track::comm, "split exchange: step's reductions finished", "comm", t0,
                      trace::ChromeTrace::now_us());
        const PresummedStep pre{o.loss_sum, o.norm};
        UpdatePart part;
        part.presummed = &pre;
        update(runner(t).loss, part);
        return;
      }
      if (diverted_) {       // g_s in the registry, step s+1's partial gradient aside
        float* g = parts_.params->grad();
        std::swap_ranges(g, g + parts_.params->size(), side_.data());
      }
      update(runner(t).loss, {});
    });
    drop_runner(t);
    backwards_.erase(t);
    if (leave(s))
      MT_ASSERT(!diverted_ && runners_empty() && (!xs_ || xs_->in_flight() == 0),
                "a window ended with work of a later step");
  }

 private:
  pipeline::Schedule window_list(int K) const override { return pipeline::no_flush_schedule(pp_.spec, K); }
  void opened(int, const pipeline::Schedule&) override { backwards_.clear(); }
  bool local_updates() const override { return xs_ != nullptr; }  // (split: the updates are local)

  void swap() {
    parts_.swap_versions();
    swapped_ = !swapped_;
  }
  // Micro-batch i of the window belongs to step first_ + i / m: it reads W(that step - 1), which is the one the
  // store holds for the current step and the other one for the next.
  int bind(int i) {
    const int t = i / m_;
    const int64_t step = first_ + t;
    MT_ASSERT(step == cur_ || step == cur_ + 1, "micro-batch ", i, " of step ", step, " while running step ", cur_);
    if ((step == cur_ + 1) != swapped_) swap();
    return t;
  }
  const float* forward(int c, int i, const float* input) override {
    if (xs_) xs_->poll();
    const int t = bind(i);
    return runner(t).forward(c, i % m_, input);
  }
  const float* backward(int c, int i, const float* dout) override {
    if (xs_) xs_->poll();
    const int t = bind(i);
    if (!xs_) {
      if (first_ + t == cur_ + 1 && !diverted_) divert_grads();
      return runner(t).backward(c, i % m_, dout);
    }
    // Split exchange: after this rank's last backward of step first_ + t (m per step, one chunk) its gradient
    // goes to the exchange, and the registry starts from zero for the next step's backwards.
    const float* dx = runner(t).backward(c, i % m_, dout);
    dirty_ = true;
    if (++backwards_[t] == m_) {
      xs_->start(first_ + t, runner(t).loss);
      parts_.params->zero_grad();
      dirty_ = false;
    }
    return dx;
  }
  // The first backward of the next step: g_cur moves aside (settled first: every backward of step cur on this
  // rank is done, so what none of them wrote is zeroed now, as the flushed run's reduction would), and the
  // registry's gradient starts from zero with every write adding.
  void divert_grads() {
    nn::ParamRegistry& p = *parts_.params;
    for (int g = 0; g < p.num_groups(); g++) p.settle_grads(g);
    side_.resize(p.size());
    std::memcpy(side_.data(), p.grad(), p.size() * sizeof(float));
    p.zero_grad();
    diverted_ = true;
  }
  // After the loop's begin_step of the next step: its partial gradient back in the registry, later writes add.
  void restore_grads() {
    nn::ParamRegistry& p = *parts_.params;
    p.zero_grad();
    std::memcpy(p.grad(), side_.data(), p.size() * sizeof(float));
    diverted_ = false;
  }

  NoFlushParts parts_;
  bool swapped_ = false, diverted_ = false;
  AlignedBuffer side_;
  // The split exchange (null: blocking updates), its backwards per step of the window, and whether the registry
  // holds gradient of a step whose exchange has not started.
  std::unique_ptr<SplitExchange> xs_;
  bool split_made_ = false, dirty_ = false;
  std::map<int, int> backwards_;
};

}  // namespace

std::unique_ptr<StepExecutor> make_no_flush_steps(TrainTask& task, const PipelineContext& pp, trace::ChromeTrace* trace,
                                                  NoFlushParts parts) {
  return std::make_unique<NoFlushSteps>(task, pp, trace, std::move(parts));
}

}  // namespace mt::train
