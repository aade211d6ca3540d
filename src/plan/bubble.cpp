#include "plan/bubble.h"

#include <algorithm>

#include "core/error.h"

namespace mt::plan {

namespace {
// span, forward, backward, latency (ms), latency samples, lists, wait, send, post (ms), sends, posts
constexpr int kScalars = 11;
}

size_t packed_size(int virtual_stages) { return kScalars + 3 * (size_t)virtual_stages; }

void pack(const pipeline::PipelineStats& st, int V, float* out) {
  out[0] = (float)(st.span_us / 1000.0);
  out[1] = (float)(st.forward_us / 1000.0);
  out[2] = (float)(st.backward_us / 1000.0);
  out[3] = (float)(st.latency_us / 1000.0);
  out[4] = (float)st.latency_samples;
  out[5] = (float)st.lists;
  out[6] = (float)(st.wait_us / 1000.0);
  out[7] = (float)(st.send_us / 1000.0);
  out[8] = (float)(st.post_us / 1000.0);
  out[9] = (float)st.sends;
  out[10] = (float)st.posts;
  for (int c = 0; c < V; c++) {
    out[kScalars + c] = c < (int)st.chunk_forward_us.size() ? (float)(st.chunk_forward_us[c] / 1000.0) : 0.0f;
    out[kScalars + V + c] = c < (int)st.chunk_backward_us.size() ? (float)(st.chunk_backward_us[c] / 1000.0) : 0.0f;
    out[kScalars + 2 * V + c] = c < (int)st.chunk_weight_us.size() ? (float)(st.chunk_weight_us[c] / 1000.0) : 0.0f;
  }
}

pipeline::PipelineStats unpack(const float* in, int V) {
  pipeline::PipelineStats st;
  st.span_us = in[0] * 1000.0;
  st.forward_us = in[1] * 1000.0;
  st.backward_us = in[2] * 1000.0;
  st.latency_us = in[3] * 1000.0;
  st.latency_samples = (int64_t)in[4];
  st.lists = (int64_t)in[5];
  st.wait_us = in[6] * 1000.0;
  st.send_us = in[7] * 1000.0;
  st.post_us = in[8] * 1000.0;
  st.sends = (int64_t)in[9];
  st.posts = (int64_t)in[10];
  for (int c = 0; c < V; c++) {
    st.chunk_forward_us.push_back(in[kScalars + c] * 1000.0);
    st.chunk_backward_us.push_back(in[kScalars + V + c] * 1000.0);
    st.chunk_weight_us.push_back(in[kScalars + 2 * V + c] * 1000.0);
  }
  return st;
}

BubbleReport bubble_report(const pipeline::ScheduleSpec& spec, const std::vector<pipeline::PipelineStats>& ranks,
                           bool same_clock) {
  const int p = spec.stages, V = spec.virtual_stages;
  const pipeline::Schedule schedule = pipeline::make_schedule(spec);
  const pipeline::Placement& pl = schedule.placement;
  const int S = pl.stages();
  MT_ASSERT((int)ranks.size() == p, "bubble_report: ", ranks.size(), " ranks' stats for ", p, " stages");
  BubbleReport r;
  double busy = 0, span = 0, latency = 0, samples = 0, send = 0, sends = 0, post = 0, posts = 0;
  for (const auto& st : ranks) {
    busy += st.forward_us + st.backward_us;
    span = std::max(span, st.span_us);
    latency += st.latency_us;
    samples += (double)st.latency_samples;
    send += st.send_us;
    sends += (double)st.sends;
    post += st.post_us;
    posts += (double)st.posts;
  }
  const int64_t lists = ranks.front().lists;
  if (lists <= 0 || span <= 0) return r;
  r.cost.stage_forward.assign(S, 0.0);
  r.cost.stage_backward.assign(S, 0.0);
  // us summed -> ms per micro-batch; a chunk sees the micro-batches of its route (m / R of them), and a stage held
  // on R routes (chimera's two pipelines) takes the mean of its R chunks.
  const int R = pl.routes();
  const double per = (double)lists * (spec.micro_batches / R) * 1000.0 * R;
  for (int j = 0; j < p; j++) {
    for (int c = 0; c < V && c < (int)ranks[j].chunk_forward_us.size(); c++) {
      r.cost.stage_forward[pl.stage_of(j, c)] += ranks[j].chunk_forward_us[c] / per;
      r.cost.stage_backward[pl.stage_of(j, c)] += ranks[j].chunk_backward_us[c] / per;
    }
  }
  // A split backward's halves as they ran: each stage's measured weight half (the rest is the input half).
  bool split = false;
  for (const auto& list : schedule.lists)
    for (const pipeline::Action& a : list) split = split || a.kind == pipeline::ActionKind::backward_weight;
  if (split) {
    r.cost.stage_weight.assign(S, 0.0);
    for (int j = 0; j < p; j++)
      for (int c = 0; c < V && c < (int)ranks[j].chunk_weight_us.size(); c++) {
        const int s = pl.stage_of(j, c);
        r.cost.stage_weight[s] = std::min(ranks[j].chunk_weight_us[c] / per, r.cost.stage_backward[s]);
      }
  }
  // What each rank took for each of its chunks (the simulated figures use these): under chimera the two ranks
  // holding a stage may run at different speeds, which the per-stage mean above hides. Only when every rank
  // measured every chunk; otherwise the per-stage times stand.
  bool all_chunks = true;
  for (const auto& st : ranks)
    all_chunks = all_chunks && (int)st.chunk_forward_us.size() >= V && (int)st.chunk_backward_us.size() >= V &&
                 (!split || (int)st.chunk_weight_us.size() >= V);
  if (all_chunks) {
    const double per_chunk = (double)lists * (spec.micro_batches / R) * 1000.0;
    for (int j = 0; j < p; j++)
      for (int c = 0; c < V; c++) {
        r.cost.rank_chunk_forward.push_back(ranks[j].chunk_forward_us[c] / per_chunk);
        r.cost.rank_chunk_backward.push_back(ranks[j].chunk_backward_us[c] / per_chunk);
        if (split)
          r.cost.rank_chunk_weight.push_back(
              std::min(ranks[j].chunk_weight_us[c] / per_chunk, r.cost.rank_chunk_backward.back()));
      }
  }
  r.simulated_free_messages = simulate(spec, schedule, r.cost).bubble_fraction;
  r.cost.comm = same_clock && samples > 0 ? latency / samples / 1000.0 : 0.0;
  r.simulated_free_calls = simulate(spec, schedule, r.cost).bubble_fraction;
  // Each send and post charged the mean time the ranks spent in one (over all ranks and messages).
  r.cost.send = sends > 0 ? send / sends / 1000.0 : 0.0;
  r.cost.post = posts > 0 ? post / posts / 1000.0 : 0.0;
  r.simulated = simulate(spec, schedule, r.cost).bubble_fraction;
  if (!r.cost.rank_chunk_forward.empty()) {  // beside it, the earlier figure: one mean per stage for every holder
    CostModel means = r.cost;
    means.rank_chunk_forward.clear();
    means.rank_chunk_backward.clear();
    means.rank_chunk_weight.clear();
    r.simulated_stage_means = simulate(spec, schedule, means).bubble_fraction;
  }
  if (split) {  // beside it, the earlier assumption: each measured backward split in halves
    CostModel halves = r.cost;
    halves.stage_weight.clear();
    halves.rank_chunk_weight.clear();
    halves.weight_share = 0.5;
    r.simulated_half_split = simulate(spec, schedule, halves).bubble_fraction;
  }
  r.measured = 1.0 - busy / (p * span);
  r.ideal = theoretical_bubble(spec);
  return r;
}

}  // namespace mt::plan
