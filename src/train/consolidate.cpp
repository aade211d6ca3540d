#include "train/consolidate.h"

#include <cstring>

#include "core/error.h"
#include "parallel/async/param_server.h"
#include "parallel/data/data_parallel.h"

namespace mt::train {

namespace {

class EngineSource : public FlatSource {
 public:
  explicit EngineSource(parallel::DataParallel& e) : e_(e) {}
  void gather_params(std::vector<float>& flat) override { e_.full_params(flat); }
  void gather_state(const float* shard, std::vector<float>& flat) override { e_.full_state(shard, flat); }
  void load_params(const float* flat) override { e_.load_full_params(flat); }
  void load_state(const float* flat, float* shard) override { e_.load_full_state(flat, shard); }

 private:
  parallel::DataParallel& e_;
};

}  // namespace

std::unique_ptr<FlatSource> engine_source(parallel::DataParallel& engine) {
  return std::make_unique<EngineSource>(engine);
}

// ---- Parameter server. ----

PsSource::PsSource(comm::Communicator& world, parallel::DataParallel& engine, const parallel::PsLayout& layout,
                   size_t psi, int world_rank, std::shared_ptr<parallel::PsServer> server)
    : world_(world), engine_(engine), psi_(psi), is_server_(layout.is_server(world_rank)), server_(std::move(server)) {
  if (is_server_) {
    const comm::Shard s = layout.slice(psi, world_rank - layout.workers);
    offset_ = s.offset;
    count_ = s.count;
  }
}

PsSource::~PsSource() = default;

void PsSource::from_servers(const float* slice, std::vector<float>& flat) {
  flat.assign(psi_, 0.0f);
  if (is_server_) std::memcpy(flat.data() + offset_, slice, count_ * sizeof(float));
  world_.all_reduce(flat.data(), flat.data(), flat.size(), comm::DType::f32, comm::ReduceOp::sum);
}

void PsSource::gather_params(std::vector<float>& flat) {
  MT_ASSERT(!is_server_ || server_, "a parameter server's PsSource without its server");
  from_servers(is_server_ ? server_->slice() : nullptr, flat);
}

void PsSource::gather_state(const float* shard, std::vector<float>& flat) { from_servers(shard, flat); }

// The servers take their slices from the registry when the run begins (PsServer::reload); workers receive versions from
// them.
void PsSource::load_params(const float* flat) { engine_.load_full_params(flat); }

void PsSource::load_state(const float* flat, float* shard) {
  if (is_server_) std::memcpy(shard, flat + offset_, count_ * sizeof(float));
}

// ---- Tensor-parallel shards and pipeline stages. ----

StateConsolidator::StateConsolidator(const nn::ParamRegistry& local, const nn::ParamRegistry& full,
                                     ReplicaPlace place, comm::Communicator* replica, comm::Communicator* experts)
    : local_(local), full_(full), place_(place), replica_(replica), experts_(experts) {}

void StateConsolidator::contribute(const float* local, float* whole) const {
  for (const nn::Param& p : local_.params()) {
    const nn::Param& f = full_.get(p.name);
    if (!p.replicas.saved) continue;           // another rank's copy goes in
    if (!p.expert && !place_.dense) continue;  // ep rank 0 has the same
    if (p.shard.axis < 0) {
      std::memcpy(whole + f.offset, local + p.offset, sizeof(float) * p.numel);
    } else {
      for (size_t i = 0; i < p.numel; i++) whole[f.offset + (size_t)p.full_index(i)] = local[p.offset + i];
    }
  }
}

void StateConsolidator::extract(const float* whole, float* local) const {
  for (const nn::Param& p : local_.params()) {
    const nn::Param& f = full_.get(p.name);
    for (size_t i = 0; i < p.numel; i++)
      local[p.offset + i] = whole[f.offset + (p.shard.axis < 0 ? i : (size_t)p.full_index(i))];
  }
}

void StateConsolidator::to_whole(const float* local, std::vector<float>& whole) const {
  whole.assign(full_.size(), 0.0f);
  contribute(local, whole.data());
  for (comm::Communicator* c : {replica_, experts_})
    if (c) c->all_reduce(whole.data(), whole.data(), whole.size(), comm::DType::f32, comm::ReduceOp::sum);
}

// ---- Both. ----

void Consolidation::gather_params(std::vector<float>& whole) {
  if (before_gather_) before_gather_();
  source_.gather_params(flat_);
  whole_.to_whole(flat_.data(), whole);
}

void Consolidation::gather_states(std::vector<std::pair<std::string, std::vector<float>>>& out) {
  optim::StateStore& st = opt_.state();
  const std::vector<size_t> flat = st.flat();
  out.resize(flat.size());
  for (size_t k = 0; k < flat.size(); k++) {
    source_.gather_state(st.data(flat[k]), flat_);
    out[k].first = st.at(flat[k]).name;
    whole_.to_whole(flat_.data(), out[k].second);
  }
}

std::vector<std::string> Consolidation::state_names() const {
  std::vector<std::string> out;
  for (size_t k : opt_.state().flat()) out.push_back(opt_.state().at(k).name);
  return out;
}

void Consolidation::load(const float* params, const std::vector<std::vector<float>>& states) {
  optim::StateStore& st = opt_.state();
  const std::vector<size_t> flat = st.flat();
  MT_ASSERT(states.size() == flat.size(), states.size(), " state buffers for an optimizer with ", flat.size());
  std::vector<float> local(whole_.local_size());
  whole_.extract(params, local.data());
  source_.load_params(local.data());
  for (size_t k = 0; k < flat.size(); k++) {
    whole_.extract(states[k].data(), local.data());
    source_.load_state(local.data(), st.data(flat[k]));
  }
}

}  // namespace mt::train
