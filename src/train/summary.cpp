#include "train/summary.h"

#include "comm/shm/cma.h"
#include "core/fs.h"
#include "core/memory.h"
#include "core/shared_heap.h"
#include "parallel/pipeline/in_flight_bound.h"
#include "plan/bubble.h"

namespace mt::train {

void gather_memory(const parallel::Mesh& mesh, parallel::DataParallel& engine, optim::Optimizer& opt,
                   TrainTask& task, const offload::IoCounters& io, TrainSummary& sum) {
  constexpr int kF = 12;
  const int W = mesh.grid().world();
  double mine[kF] = {(double)engine.param_bytes(),      (double)engine.grad_bytes(),        0.0,
                     (double)task.activation_bytes(),   (double)peak_rss_bytes(),
                     (double)engine.transient_bytes(),  (double)task.activation_peak_bytes(),
                     (double)opt.state().offloaded_bytes(), (double)io.bytes_read, (double)io.bytes_written,
                     (double)engine.offloaded_param_bytes(), (double)engine.offloaded_grad_bytes()};
  mine[2] = (double)opt.state().bytes();
  std::vector<float> all(kF * W), in(kF);
  for (int i = 0; i < kF; i++) in[i] = (float)(mine[i] / 1024.0);  // KiB: exact in float32 up to 16 GiB
  if (mesh.world() && W > 1)
    mesh.world()->all_gather(in.data(), all.data(), kF * W, comm::DType::f32);
  else
    all = in;
  for (int r = 0; r < W; r++) {
    const float* v = &all[kF * r];
    sum.ranks.push_back({v[0] * 1024.0, v[1] * 1024.0, v[2] * 1024.0, v[3] * 1024.0, v[4] * 1024.0, v[5] * 1024.0,
                         v[6] * 1024.0, v[7] * 1024.0, v[8] * 1024.0, v[9] * 1024.0, v[10] * 1024.0,
                         v[11] * 1024.0});
  }
}

RankPeerReads peer_reads_now() {
  const comm::shm::PeerReads p = comm::shm::peer_reads();
  return {p.direct_bytes, p.direct_calls, p.kernel_bytes, p.kernel_calls, 0};
}

RankPeerReads operator-(const RankPeerReads& b, const RankPeerReads& a) {
  return {b.direct_bytes - a.direct_bytes, b.direct_calls - a.direct_calls, b.kernel_bytes - a.kernel_bytes,
          b.kernel_calls - a.kernel_calls, b.heap_peak_bytes - a.heap_peak_bytes,
          b.peer_heap_rss_bytes - a.peer_heap_rss_bytes};
}

void gather_peer_reads(const parallel::Mesh& mesh, TrainSummary& sum) {
  RankPeerReads mine = sum.step_reads;
  mine.heap_peak_bytes = shared_heap::stats().peak_bytes;
  mine.peer_heap_rss_bytes = shared_heap::peer_resident_bytes();
  const int W = mesh.grid().world();
  sum.peer_reads.assign(W, {});
  if (mesh.world() && W > 1)  // as raw bytes: the counts are 64-bit
    mesh.world()->all_gather(&mine, sum.peer_reads.data(), sizeof(RankPeerReads) * (size_t)W, comm::DType::u8);
  else
    sum.peer_reads[0] = mine;
}

nlohmann::json pipeline_report(const parallel::Mesh& mesh, const BatchLayout& layout, TrainTask& task,
                               const pipeline::PipelineStats* stats, TrainSummary& sum) {
  const pipeline::ScheduleSpec& spec = layout.schedule();
  const int V = spec.virtual_stages, P = spec.stages, W = mesh.grid().world();
  const size_t k = plan::packed_size(V);
  std::vector<float> mine_p(k), all_p(k * W);
  plan::pack(stats ? *stats : pipeline::PipelineStats{}, V, mine_p.data());
  mesh.world()->all_gather(mine_p.data(), all_p.data(), all_p.size(), comm::DType::f32);
  // Replica 0 (dp index 0, tp index 0): pipeline rank j is world rank j * dp * tp.
  std::vector<pipeline::PipelineStats> ranks;
  for (int j = 0; j < P; j++) ranks.push_back(plan::unpack(&all_p[k * mesh.grid().world_rank({0, 0, j})], V));
  // On one host (shm) the ranks share a clock, so message latencies are measured; not across hosts.
  const plan::BubbleReport b = plan::bubble_report(spec, ranks, std::string(mesh.world()->backend()) == "shm");
  // Activations in flight per pipeline rank as the activation store counted them, beside the schedule's bound.
  const float mine_a[2] = {(float)task.activation_peak_micro_batches(),
                           (float)(task.activation_peak_micro_batch_bytes() / 1024.0)};
  std::vector<float> all_a(2 * (size_t)W);
  mesh.world()->all_gather(mine_a, all_a.data(), all_a.size(), comm::DType::f32);
  nlohmann::json in_flight = nlohmann::json::array();
  for (int j = 0; j < P; j++) {
    const float* v = &all_a[2 * (size_t)mesh.grid().world_rank({0, 0, j})];
    in_flight.push_back({{"pipeline_rank", j},
                         {"peak_micro_batches", (int)v[0]},
                         {"bound", pipeline::in_flight_bound(spec, j)},
                         {"peak_micro_batch_bytes", (double)v[1] * 1024.0}});
  }
  if (b.measured < 0) return nullptr;
  sum.bubble_measured = b.measured;
  sum.bubble_simulated = b.simulated;
  sum.bubble_ideal = b.ideal;
  return {{"schedule", spec.name},
          {"stages", P},
          {"micro_batches", spec.micro_batches},
          {"virtual_stages", spec.virtual_stages},
          // Copies of each stage over the pipeline ranks: 2 under chimera (weight memory per rank doubles).
          {"stage_copies", pipeline::placement_of(spec).routes()},
          {"stage_layers", task.stage_layers()},
          {"bubble_measured", b.measured},
          {"bubble_simulated", b.simulated},
          {"bubble_ideal", b.ideal},
          {"bubble_simulated_without_message_latency", b.simulated_free_messages},
          {"message_latency_ms", b.cost.comm},
          {"message_send_ms", b.cost.send},
          {"message_post_ms", b.cost.post},
          {"bubble_simulated_with_free_sends_and_posts", b.simulated_free_calls},
          {"stage_forward_ms", b.cost.stage_forward},
          {"stage_backward_ms", b.cost.stage_backward},
          {"stage_weight_ms", b.cost.stage_weight},
          // [rank * V + chunk]: what each rank took per micro-batch for each chunk (bubble_simulated uses these)
          {"bubble_simulated_per_stage_means", b.simulated_stage_means},
          {"rank_chunk_forward_ms", b.cost.rank_chunk_forward},
          {"rank_chunk_backward_ms", b.cost.rank_chunk_backward},
          {"rank_chunk_weight_ms", b.cost.rank_chunk_weight},
          {"bubble_simulated_half_split", b.simulated_half_split},
          {"activation_in_flight", in_flight}};
}

void write_summary(const std::string& path, const TrainSummary& sum, const parallel::Mesh& mesh, int zero,
                   const nlohmann::json& sections) {
  if (!mesh.lead() || path.empty()) return;
  const parallel::MeshGrid& g = mesh.grid();
  nlohmann::json j = {{"tokens_per_s", sum.items_per_s}, {"zero", zero},  {"dp", g.dp()}, {"tp", g.tp()},
                      {"pp", g.pp()},                    {"params", sum.params},   {"steps", sum.steps_run},
                      {"final_loss", sum.final_loss}};
  for (auto& [key, value] : sections.items())
    if (!value.is_null()) j[key] = value;
  for (size_t r = 0; r < sum.ranks.size(); r++) {
    const RankMemory& m = sum.ranks[r];
    j["ranks"].push_back({{"rank", r},
                          {"param_bytes", m.param_bytes},
                          {"grad_bytes", m.grad_bytes},
                          {"optimizer_bytes", m.optimizer_bytes},
                          {"activation_bytes", m.activation_bytes},
                          {"transient_bytes", m.transient_bytes},
                          {"activation_peak_bytes", m.activation_peak_bytes},
                          {"peak_rss_bytes", m.peak_rss_bytes},
                          {"optimizer_offloaded_bytes", m.optimizer_offloaded_bytes},
                          {"params_offloaded_bytes", m.param_offloaded_bytes},
                          {"grads_offloaded_bytes", m.grad_offloaded_bytes},
                          {"offload_read_bytes_per_step", sum.steps_run ? m.io_read_bytes / (double)sum.steps_run : 0.0},
                          {"offload_written_bytes_per_step",
                           sum.steps_run ? m.io_written_bytes / (double)sum.steps_run : 0.0}});
    if (sum.memory_limit > 0) j["ranks"].back()["within_memory_limit"] = m.peak_rss_bytes <= sum.memory_limit;
    if (r < sum.peer_reads.size()) {
      const RankPeerReads& c = sum.peer_reads[r];
      j["ranks"].back()["comm"] = {{"peer_reads",
                                    {{"direct_bytes", c.direct_bytes},
                                     {"direct_calls", c.direct_calls},
                                     {"kernel_bytes", c.kernel_bytes},
                                     {"kernel_calls", c.kernel_calls}}},
                                   {"shared_heap_peak_bytes", c.heap_peak_bytes},
                                   {"peer_heap_rss_bytes", c.peer_heap_rss_bytes}};
    }
  }
  if (sum.memory_limit > 0) j["memory_limit"] = sum.memory_limit;
  write_file_atomic(path, j.dump(2) + "\n");
}

}  // namespace mt::train
