// State consolidation: whole tensors out of, and back into, whatever this run's layout splits them into.
// Used by checkpoint save, resume and the final save; the only place that knows how a layout shards.
//
// Two stages, each a small part:
//   1. FlatSource: this rank's flat buffer in its registry's layout (every local tensor, unsharded by ZeRO or
//      by parameter-server slices). ZeRO: all-gather of each bucket's shards over dp (zero_shards.h);
//      parameter server: each server's slice placed and summed over the world; plain: a copy.
//   2. StateConsolidator: flat buffer of the local registry <-> whole tensors of the full registry. A rank
//      contributes the elements it has a say on (tensor-parallel shards by their full index; a replicated
//      tensor from tp rank 0; the tied embedding from the first pipeline stage) and the contributions are
//      summed over the replica group (tp x pp ranks of one model); every other element contributes zero,
//      so the sum is exact. With local experts (nn::Param::expert) a model's experts are spread over the
//      ranks of an ep run: each contributes its experts, only ep rank 0 the other tensors, and the sum goes
//      on over the ep group, so the file is the same whatever the ep degree.
//
//   3. Factored optimizer state (optim/state_store.h: a buffer of any other shape, per tensor, such as a row
//      mean): not split by the layout. Ranks declaring the same name hold the same values (whole-tensor
//      statistics), so the file keeps one copy, named and shaped as declared, taken from the lowest rank of
//      the group that declares it: union_factored over the source's group (the world under a parameter
//      server, whose servers each update a slice; none otherwise: dp ranks hold copies), then the replica
//      group (tp x pp: each stage's tensors), then the ep group. On resume each rank reads the names it
//      declares.
//
// Cost of a gather: ZeRO all-gathers Psi floats per dp rank (per expert-replica rank for experts), then one
// all-reduce of the whole model (4 x full size bytes) over the replica group (and one more over the ep
// group with local experts); factored state adds per group an all-gather of one float per rank, and when
// any rank has some, an all-gather of the name lists and one broadcast per buffer. A scatter is local
// (every rank reads the whole file).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "nn/params.h"
#include "optim/optimizer.h"

namespace mt::parallel {
class DataParallel;
class PsServer;
struct PsLayout;
}  // namespace mt::parallel

namespace mt::train {

class FlatSource {
 public:
  virtual ~FlatSource() = default;
  // Collective where the layout shards: flat = the registry's whole flat buffer (params / one state buffer).
  virtual void gather_params(std::vector<float>& flat) = 0;
  virtual void gather_state(const float* shard_state, std::vector<float>& flat) = 0;
  // Local: this rank keeps its part of flat.
  virtual void load_params(const float* flat) = 0;
  virtual void load_state(const float* flat, float* shard_state) = 0;
  // The group whose members hold different factored state (stage 3 above); null: every member of the data-
  // parallel group holds the same.
  virtual comm::Communicator* factored_group() { return nullptr; }
  // A second weight version (train/weight_versions.h), laid out and gathered as the parameters.
  virtual bool has_other_params() { return false; }
  virtual void gather_other_params(std::vector<float>& flat) {}
  virtual void load_other_params(const float* flat) {}
};

// ZeRO 0-3 (and no data parallelism) through the engine.
std::unique_ptr<FlatSource> engine_source(parallel::DataParallel& engine);
// Parameter server: servers hold slice s of the flat buffer (parameters in `server`, optimizer state),
// workers hold parameters only. Gathers are all-reduces over `world`. server: this rank's server (shared with
// its exchange, ps_sync.h), null on workers.
class PsSource : public FlatSource {
 public:
  PsSource(comm::Communicator& world, parallel::DataParallel& engine, const parallel::PsLayout& layout, size_t psi,
           int world_rank, std::shared_ptr<parallel::PsServer> server);
  ~PsSource() override;
  void gather_params(std::vector<float>& flat) override;
  void gather_state(const float* shard_state, std::vector<float>& flat) override;
  void load_params(const float* flat) override;
  void load_state(const float* flat, float* shard_state) override;
  comm::Communicator* factored_group() override { return &world_; }

 private:
  void from_servers(const float* slice, std::vector<float>& flat);
  comm::Communicator& world_;
  parallel::DataParallel& engine_;
  size_t psi_;
  bool is_server_;
  size_t offset_ = 0, count_ = 0;
  std::shared_ptr<parallel::PsServer> server_;
};

// A factored optimizer state buffer, whole as declared (shape row-major, data its product of floats).
struct FactoredState {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// Collective over group (nothing when null or alone): on return every member holds, sorted by name, every
// factored buffer some member held, each as the lowest such rank has it. Two members declaring one name with
// different shapes is an InputError naming the buffer, both shapes, both ranks and the group.
void union_factored(comm::Communicator* group, std::vector<FactoredState>& states);

// Which of its tensors a rank contributes to the whole model, besides what each tensor's replica facts say
// (nn::Replicas::saved: one copy of each tp-replicated or tied tensor).
struct ReplicaPlace {
  bool dense = true;  // every tensor but local experts: ep rank 0 only (when experts are local)
};

class StateConsolidator {
 public:
  // local: this rank's finalized registry; full: the same model declared whole (finalized). experts: the
  // ep group when local holds local experts (the ranks holding the model's other experts), else null.
  StateConsolidator(const nn::ParamRegistry& local, const nn::ParamRegistry& full, ReplicaPlace place,
                    comm::Communicator* replica, comm::Communicator* experts = nullptr);
  size_t whole_size() const { return full_.size(); }
  size_t local_size() const { return local_.size(); }
  const nn::ParamRegistry& full() const { return full_; }

  // Pure. contribute: writes this rank's elements into whole (full.size() floats), leaves the rest alone.
  void contribute(const float* local, float* whole) const;
  // Pure. extract: local (local.size() floats) = this rank's elements of whole.
  void extract(const float* whole, float* local) const;
  // Collective over the replica group (then the ep group): whole = the sum of every member's contribution.
  void to_whole(const float* local, std::vector<float>& whole) const;
  // Collective over the replica group, then the ep group: union_factored over each.
  void factored_to_whole(std::vector<FactoredState>& states) const;

 private:
  const nn::ParamRegistry& local_;
  const nn::ParamRegistry& full_;
  ReplicaPlace place_;
  comm::Communicator* replica_;
  comm::Communicator* experts_;
};

// Whole parameters and optimizer state of the run (both stages above; collective over the layout).
class Consolidation {
 public:
  Consolidation(StateConsolidator whole, FlatSource& source, optim::Optimizer& opt)
      : whole_(std::move(whole)), source_(source), opt_(opt) {}
  const StateConsolidator& layout() const { return whole_; }
  // Runs before every parameter gather (Local SGD averages its replicas there: a sync the run keeps).
  void set_before_gather(std::function<void()> fn) { before_gather_ = std::move(fn); }
  void gather_params(std::vector<float>& whole);
  // One whole buffer per optimizer state buffer, with its name (a PS worker's are empty but named), then the
  // second weight version of the delay-1 rule when the run keeps one (kOtherParams: its tensors are
  // "weights.previous/<param name>" in the checkpoint's optimizer file, beside "adamw.m/<param name>").
  void gather_states(std::vector<std::pair<std::string, std::vector<float>>>& out);
  std::vector<std::string> state_names() const;
  static constexpr const char* kOtherParams = "weights.previous";
  // Every factored state buffer of the model once, sorted by name (collective over the layout: stage 3 above).
  void gather_factored(std::vector<FactoredState>& out);
  // Every rank: loads its part of whole parameters and state buffers (the order of state_names()).
  void load(const float* params, const std::vector<std::vector<float>>& states);
  // Where a resume reads this rank's factored state: each buffer the optimizer declared, by name and shape.
  std::vector<checkpoint::NamedTensorOut> factored_targets();

 private:
  StateConsolidator whole_;
  FlatSource& source_;
  optim::Optimizer& opt_;
  std::vector<float> flat_;
  std::function<void()> before_gather_;
};

}  // namespace mt::train
