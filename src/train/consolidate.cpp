#include "train/consolidate.h"

#include <algorithm>
#include <cstring>
#include <map>

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
  bool has_other_params() override { return e_.versions() != nullptr && e_.versions()->other() != nullptr; }
  void gather_other_params(std::vector<float>& flat) override { e_.full_other_params(flat); }
  void load_other_params(const float* flat) override { e_.load_full_other_params(flat); }

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

// ---- Factored optimizer state. ----

namespace {

size_t numel_of(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= (size_t)d;
  return n;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); i++) s += (i ? "," : "") + std::to_string(shape[i]);
  return s;
}

// One line per buffer, "name\tdim,dim\n": what a member tells the others it holds.
std::string name_list(const std::vector<FactoredState>& states) {
  std::string out;
  for (const FactoredState& f : states) {
    MT_ASSERT(f.name.find_first_of("\t\n") == std::string::npos, "factored state name with a tab or newline: ", f.name);
    out += f.name + "\t" + shape_text(f.shape) + "\n";
  }
  return out;
}

// The (name, shape) lines of name_list, in order.
std::vector<std::pair<std::string, std::vector<int64_t>>> parse_name_list(const char* text, size_t len) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  const std::string all(text, len);
  size_t at = 0;
  while (at < all.size()) {
    const size_t tab = all.find('\t', at), end = all.find('\n', at);
    MT_ASSERT(tab < end && end != std::string::npos, "malformed factored state list from a peer");
    std::vector<int64_t> shape;
    for (size_t d = tab + 1; d < end;) {
      const size_t comma = std::min(all.find(',', d), end);
      shape.push_back(std::stoll(all.substr(d, comma - d)));
      d = comma + 1;
    }
    out.push_back({all.substr(at, tab - at), std::move(shape)});
    at = end + 1;
  }
  return out;
}

}  // namespace

void union_factored(comm::Communicator* group, std::vector<FactoredState>& states) {
  std::sort(states.begin(), states.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  if (!group || group->size() == 1) return;
  // 1. Every member's name list, padded to the longest (lengths as floats: exact below 2^24 bytes).
  const int n = group->size();
  std::string mine = name_list(states);
  MT_ASSERT(mine.size() < (1u << 24), "factored state names take ", mine.size(), " bytes");
  const float my_len = (float)mine.size();
  std::vector<float> lens((size_t)n);
  group->all_gather(&my_len, lens.data(), (size_t)n, comm::DType::f32);
  const size_t width = (size_t)*std::max_element(lens.begin(), lens.end());
  if (width == 0) return;  // no member holds any (every optimizer so far)
  mine.resize(width, '\0');
  std::vector<char> lists(width * (size_t)n);
  group->all_gather(mine.data(), lists.data(), lists.size(), comm::DType::u8);
  // 2. Each name's owner: the lowest member declaring it; the others must declare the same shape.
  std::map<std::string, std::pair<int, std::vector<int64_t>>> owner;
  for (int r = 0; r < n; r++) {
    for (auto& [name, shape] : parse_name_list(&lists[width * (size_t)r], (size_t)lens[(size_t)r])) {
      auto [it, fresh] = owner.try_emplace(name, r, shape);
      MT_CHECK_INPUT(fresh || it->second.second == shape, "factored optimizer state ", name, " has shape [",
                     shape_text(it->second.second), "] on rank ", it->second.first, " of group ", group->name(),
                     " but [", shape_text(shape), "] on rank ", r, ": one name must mean one buffer");
    }
  }
  // 3. Each buffer from its owner, in name order on every member.
  std::vector<FactoredState> out;
  size_t k = 0;  // states is sorted by name, as owner is
  for (auto& [name, o] : owner) {
    while (k < states.size() && states[k].name < name) k++;
    const bool have = k < states.size() && states[k].name == name;
    FactoredState f{name, o.second, have ? std::move(states[k].data) : std::vector<float>(numel_of(o.second))};
    if (!f.data.empty()) group->broadcast(f.data.data(), f.data.size(), comm::DType::f32, o.first);
    out.push_back(std::move(f));
  }
  states = std::move(out);
}

void StateConsolidator::factored_to_whole(std::vector<FactoredState>& states) const {
  for (comm::Communicator* c : {replica_, experts_}) union_factored(c, states);
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
    st.visit(flat[k], false, [&](float* v, size_t) { source_.gather_state(v, flat_); });
    out[k].first = st.at(flat[k]).name;
    whole_.to_whole(flat_.data(), out[k].second);
  }
  if (source_.has_other_params()) {
    source_.gather_other_params(flat_);
    out.emplace_back(kOtherParams, std::vector<float>());
    whole_.to_whole(flat_.data(), out.back().second);
  }
}

std::vector<std::string> Consolidation::state_names() const {
  std::vector<std::string> out;
  for (size_t k : opt_.state().flat()) out.push_back(opt_.state().at(k).name);
  if (source_.has_other_params()) out.push_back(kOtherParams);
  return out;
}

void Consolidation::gather_factored(std::vector<FactoredState>& out) {
  optim::StateStore& st = opt_.state();
  out.clear();
  for (size_t k : st.factored())
    out.push_back({st.at(k).name, st.at(k).shape, std::vector<float>(st.data(k), st.data(k) + st.size(k))});
  union_factored(source_.factored_group(), out);
  whole_.factored_to_whole(out);
}

std::vector<checkpoint::NamedTensorOut> Consolidation::factored_targets() {
  optim::StateStore& st = opt_.state();
  std::vector<checkpoint::NamedTensorOut> out;
  for (size_t k : st.factored()) out.push_back({st.at(k).name, st.at(k).shape, st.data(k)});
  return out;
}

void Consolidation::load(const float* params, const std::vector<std::vector<float>>& states) {
  optim::StateStore& st = opt_.state();
  const std::vector<size_t> flat = st.flat();
  const bool other = source_.has_other_params();
  MT_ASSERT(states.size() == flat.size() + other, states.size(), " state buffers for an optimizer with ", flat.size(),
            other ? " and a second weight version" : "");
  std::vector<float> local(whole_.local_size());
  whole_.extract(params, local.data());
  source_.load_params(local.data());
  for (size_t k = 0; k < flat.size(); k++) {
    whole_.extract(states[k].data(), local.data());
    st.visit(flat[k], true, [&](float* v, size_t) { source_.load_state(local.data(), v); });
  }
  if (other) {
    whole_.extract(states.back().data(), local.data());
    source_.load_other_params(local.data());
  }
}

}  // namespace mt::train
