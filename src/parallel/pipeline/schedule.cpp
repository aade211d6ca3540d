#include "parallel/pipeline/schedule.h"

#include <algorithm>
#include <optional>

#include "core/error.h"

namespace mt::pipeline {

namespace {

// Keeps every list small enough to hold and replay at once (about 5 actions per (i, s) pair).
constexpr int64_t kMaxComputePairs = 1'000'000;

Action fwd(int i, int c) { return {ActionKind::forward, i, c, -1}; }
Action bwd(int i, int c) { return {ActionKind::backward, i, c, -1}; }

// ---- gpipe: all forwards, then all backwards, both ascending (why ascending: see the header). ----
std::vector<Action> gpipe_order(int m) {
  std::vector<Action> out;
  for (int i = 0; i < m; i++) out.push_back(fwd(i, 0));
  for (int i = 0; i < m; i++) out.push_back(bwd(i, 0));
  return out;
}

// ---- 1f1b (PipeDream-flush): rank j runs ahead by the forwards its successors need before the first
// backward can come back to it, p - j - 1, then alternates, so it never holds more than p - j activations.
std::vector<Action> one_f_one_b_order(int j, int p, int m) {
  const int warmup = std::min(p - j - 1, m);
  std::vector<Action> out;
  for (int i = 0; i < warmup; i++) out.push_back(fwd(i, 0));
  for (int k = 0; k < m - warmup; k++) {
    out.push_back(fwd(warmup + k, 0));
    out.push_back(bwd(k, 0));
  }
  for (int i = m - warmup; i < m; i++) out.push_back(bwd(i, 0));
  return out;
}

// ---- interleaved 1F1B (Megatron-LM): the k-th forward of a rank is (i, c) with
//   group = k / (p V), c = (k mod p V) / p, i = group * p + k mod p,
// the k-th backward the same with c counted from the last chunk. Warm-up, (V - 1) p + 2 (p - j - 1):
// (V - 1) p forwards take the first group of p micro-batches through chunks 0 .. V - 2, which must come
// before the first forward of the last chunk and so before any backward; then the first micro-batch's
// activation still travels through the p - j - 1 later ranks and its gradient back through them, and rank
// j fills that round trip with forwards. No special case for m == p (Megatron-LM runs all forwards first
// there): check_schedule and the simulator find this order deadlock-free with the textbook bubble.
std::vector<Action> interleaved_order(int j, int p, int m, int V) {
  const int total = m * V;
  auto nth = [&](int k, bool backward) {
    int group = k / (p * V);
    int c = (k % (p * V)) / p;
    if (backward) c = V - 1 - c;
    int i = group * p + k % p;
    return backward ? bwd(i, c) : fwd(i, c);
  };
  const int warmup = std::min((p - j - 1) * 2 + (V - 1) * p, total);
  std::vector<Action> out;
  for (int k = 0; k < warmup; k++) out.push_back(nth(k, false));
  for (int k = 0; k < total - warmup; k++) {
    out.push_back(nth(warmup + k, false));
    out.push_back(nth(k, true));
  }
  for (int k = total - warmup; k < total; k++) out.push_back(nth(k, true));
  return out;
}

std::string join_names() {
  std::string s;
  for (const std::string& n : schedule_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names{"gpipe", "1f1b", "interleaved"};
  return names;
}

void validate(const ScheduleSpec& spec) {
  const auto& names = schedule_names();
  MT_CHECK_INPUT(std::find(names.begin(), names.end(), spec.name) != names.end(), "unknown pipeline schedule '",
                 spec.name, "'; choose one of ", join_names());
  const int p = spec.stages, m = spec.micro_batches, V = spec.virtual_stages;
  MT_CHECK_INPUT(p >= 1, "pipeline schedule ", spec.name, ": the number of stages p must be at least 1, got ", p);
  MT_CHECK_INPUT(m >= 1, "pipeline schedule ", spec.name, ": the number of micro-batches m must be at least 1, got ",
                 m);
  MT_CHECK_INPUT(V >= 1, "pipeline schedule ", spec.name,
                 ": the number of virtual stages V (chunks per rank) must be at least 1, got ", V);
  MT_CHECK_INPUT((int64_t)p * V * m <= kMaxComputePairs, "pipeline schedule ", spec.name, ": p * V * m = ", p, " * ",
                 V, " * ", m, " = ", (int64_t)p * V * m, " (micro-batch, stage) pairs is more than the ",
                 kMaxComputePairs, " a schedule may hold");
  if (spec.name == "interleaved") {
    MT_CHECK_INPUT(V >= 2, "pipeline schedule interleaved needs V >= 2 virtual stages (chunks) per rank, got V = ", V,
                   "; with one chunk per rank it is 1f1b");
    MT_CHECK_INPUT(m % p == 0, "pipeline schedule interleaved needs the number of micro-batches m = ", m,
                   " to be a multiple of the number of stages p = ", p,
                   " (it walks the micro-batches in groups of p, as Megatron-LM does); try m = ",
                   m / p > 0 ? str(m / p * p, " or ") : std::string(), (m / p + 1) * p);
  } else {
    MT_CHECK_INPUT(V == 1, "pipeline schedule ", spec.name, " runs one chunk per rank, got V = ", V,
                   " virtual stages; use the interleaved schedule for V > 1");
  }
}

Schedule compute_order(const ScheduleSpec& spec) {
  validate(spec);
  const int p = spec.stages, m = spec.micro_batches, V = spec.virtual_stages;
  Schedule out((size_t)p);
  for (int j = 0; j < p; j++) {
    if (spec.name == "gpipe") {
      out[j] = gpipe_order(m);
    } else if (spec.name == "1f1b") {
      out[j] = one_f_one_b_order(j, p, m);
    } else {
      out[j] = interleaved_order(j, p, m, V);
    }
  }
  return out;
}

Schedule with_communication(const ScheduleSpec& spec, const Schedule& compute) {
  const int p = spec.stages, V = spec.virtual_stages, S = num_stages(spec);
  MT_ASSERT((int)compute.size() == p, "compute orders for ", compute.size(), " ranks, spec has p = ", p);
  Schedule out((size_t)p);
  for (int j = 0; j < p; j++) {
    // The wait for x's input, when x's input comes from another rank.
    auto input_wait = [&](const Action& x) -> std::optional<Action> {
      const int s = stage_of(j, x.chunk, p);
      if (x.kind == ActionKind::forward && s > 0 && rank_of_stage(s - 1, p) != j)
        return Action{ActionKind::wait_recv_act, x.micro_batch, x.chunk, rank_of_stage(s - 1, p)};
      if (x.kind == ActionKind::backward && s < S - 1 && rank_of_stage(s + 1, p) != j)
        return Action{ActionKind::wait_recv_grad, x.micro_batch, x.chunk, rank_of_stage(s + 1, p)};
      return std::nullopt;
    };
    auto post_of = [](Action w) {
      w.kind = w.kind == ActionKind::wait_recv_act ? ActionKind::post_recv_act : ActionKind::post_recv_grad;
      return w;
    };
    // The send of x's output, when another rank needs it.
    auto output_send = [&](const Action& x) -> std::optional<Action> {
      const int s = stage_of(j, x.chunk, p);
      if (x.kind == ActionKind::forward && s < S - 1 && rank_of_stage(s + 1, p) != j)
        return Action{ActionKind::send_act, x.micro_batch, x.chunk, rank_of_stage(s + 1, p)};
      if (x.kind == ActionKind::backward && s > 0 && rank_of_stage(s - 1, p) != j)
        return Action{ActionKind::send_grad, x.micro_batch, x.chunk, rank_of_stage(s - 1, p)};
      return std::nullopt;
    };

    const std::vector<Action>& xs = compute[j];
    for (const Action& x : xs)
      MT_ASSERT(is_compute(x.kind) && x.chunk >= 0 && x.chunk < V, "not a computation: ", to_string(x));
    std::vector<Action>& list = out[j];
    if (!xs.empty())
      if (auto w = input_wait(xs[0])) list.push_back(post_of(*w));
    for (size_t k = 0; k < xs.size(); k++) {
      if (auto w = input_wait(xs[k])) list.push_back(*w);
      if (k + 1 < xs.size())
        if (auto w = input_wait(xs[k + 1])) list.push_back(post_of(*w));
      list.push_back(xs[k]);
      if (auto snd = output_send(xs[k])) list.push_back(*snd);
    }
    list.push_back(Action{ActionKind::optimizer_step, -1, -1, -1});
  }
  return out;
}

Schedule make_schedule(const ScheduleSpec& spec) { return with_communication(spec, compute_order(spec)); }

Schedule forward_only(const ScheduleSpec& spec) {
  MT_CHECK_INPUT(spec.stages >= 1 && spec.micro_batches >= 1 && spec.virtual_stages >= 1,
                 "a forward-only schedule needs p, m, V >= 1, got p = ", spec.stages, ", m = ", spec.micro_batches,
                 ", V = ", spec.virtual_stages);
  Schedule compute((size_t)spec.stages);
  for (int j = 0; j < spec.stages; j++)
    for (int i = 0; i < spec.micro_batches; i++)
      for (int c = 0; c < spec.virtual_stages; c++) compute[j].push_back({ActionKind::forward, i, c, -1});
  Schedule out = with_communication(spec, compute);
  for (auto& list : out) list.pop_back();  // no optimizer step
  return out;
}

bool is_compute(ActionKind k) { return k == ActionKind::forward || k == ActionKind::backward; }
bool is_send(ActionKind k) { return k == ActionKind::send_act || k == ActionKind::send_grad; }
bool is_post(ActionKind k) { return k == ActionKind::post_recv_act || k == ActionKind::post_recv_grad; }
bool is_wait(ActionKind k) { return k == ActionKind::wait_recv_act || k == ActionKind::wait_recv_grad; }

Message message_of(const Action& a, int rank, int p) {
  MT_ASSERT(is_send(a.kind) || is_post(a.kind) || is_wait(a.kind), "not a message action: ", to_string(a));
  Message msg;
  const int s = stage_of(rank, a.chunk, p);
  switch (a.kind) {
    case ActionKind::send_act: msg = {false, a.micro_batch, s, s + 1}; break;
    case ActionKind::post_recv_act:
    case ActionKind::wait_recv_act: msg = {false, a.micro_batch, s - 1, s}; break;
    case ActionKind::send_grad: msg = {true, a.micro_batch, s, s - 1}; break;
    default: msg = {true, a.micro_batch, s + 1, s}; break;  // post_recv_grad, wait_recv_grad
  }
  msg.from_rank = rank_of_stage(msg.from_stage, p);
  msg.to_rank = rank_of_stage(msg.to_stage, p);
  return msg;
}

int peak_in_flight(const std::vector<Action>& rank_actions) {
  int live = 0, peak = 0;
  for (const Action& a : rank_actions) {
    if (a.kind == ActionKind::forward) peak = std::max(peak, ++live);
    if (a.kind == ActionKind::backward) live--;
  }
  return peak;
}

const char* to_string(ActionKind kind) {
  switch (kind) {
    case ActionKind::forward: return "forward";
    case ActionKind::backward: return "backward";
    case ActionKind::send_act: return "send_act";
    case ActionKind::post_recv_act: return "post_recv_act";
    case ActionKind::wait_recv_act: return "wait_recv_act";
    case ActionKind::send_grad: return "send_grad";
    case ActionKind::post_recv_grad: return "post_recv_grad";
    case ActionKind::wait_recv_grad: return "wait_recv_grad";
    case ActionKind::optimizer_step: return "optimizer_step";
  }
  return "?";
}

std::string to_string(const Action& a) {
  if (a.kind == ActionKind::optimizer_step) return "optimizer_step";
  std::string s = str(to_string(a.kind), "(i=", a.micro_batch, ", c=", a.chunk);
  if (is_send(a.kind)) s += str(", to=", a.peer);
  if (is_post(a.kind) || is_wait(a.kind)) s += str(", from=", a.peer);
  if (is_compute(a.kind) && a.peer != -1) s += str(", peer=", a.peer);  // only in broken lists
  return s + ")";
}

std::string compute_summary(const std::vector<Action>& rank_actions, int virtual_stages) {
  std::string s;
  for (const Action& a : rank_actions) {
    if (!is_compute(a.kind)) continue;
    if (!s.empty()) s += ' ';
    s += str(a.kind == ActionKind::forward ? "F" : "B", a.micro_batch);
    if (virtual_stages > 1) s += str("c", a.chunk);
  }
  return s;
}

}  // namespace mt::pipeline
