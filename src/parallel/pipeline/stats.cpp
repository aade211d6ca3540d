#include "parallel/pipeline/stats.h"

#include <algorithm>

namespace mt::pipeline {

void PipelineStats::add(const PipelineStats& o) {
  span_us += o.span_us;
  forward_us += o.forward_us;
  backward_us += o.backward_us;
  wait_us += o.wait_us;
  latency_us += o.latency_us;
  latency_samples += o.latency_samples;
  send_us += o.send_us;
  post_us += o.post_us;
  sends += o.sends;
  posts += o.posts;
  forwards += o.forwards;
  backwards += o.backwards;
  lists += o.lists;
  chunk_forward_us.resize(std::max(chunk_forward_us.size(), o.chunk_forward_us.size()), 0.0);
  chunk_backward_us.resize(std::max(chunk_backward_us.size(), o.chunk_backward_us.size()), 0.0);
  for (size_t c = 0; c < o.chunk_forward_us.size(); c++) chunk_forward_us[c] += o.chunk_forward_us[c];
  for (size_t c = 0; c < o.chunk_backward_us.size(); c++) chunk_backward_us[c] += o.chunk_backward_us[c];
  chunk_weight_us.resize(std::max(chunk_weight_us.size(), o.chunk_weight_us.size()), 0.0);
  for (size_t c = 0; c < o.chunk_weight_us.size(); c++) chunk_weight_us[c] += o.chunk_weight_us[c];
}

}  // namespace mt::pipeline
