#include "nn/params.h"

#include "core/error.h"
#include "core/rng.h"

namespace mt::nn {

int64_t Param::full_index(size_t i) const {
  if (shard.axis < 0) return (int64_t)i;
  // Decompose i in the local shape, map the sharded axis into the full one, recompose in the full shape.
  int64_t idx = 0, rem = (int64_t)i;
  std::vector<int64_t> coord(local_shape.size());
  for (int d = (int)local_shape.size() - 1; d >= 0; d--) {
    coord[d] = rem % local_shape[d];
    rem /= local_shape[d];
  }
  const int64_t width = shard.end - shard.begin, block = full_shape[shard.axis] / shard.blocks;
  const int64_t c = coord[shard.axis];
  coord[shard.axis] = (c / width) * block + shard.begin + c % width;
  for (size_t d = 0; d < full_shape.size(); d++) idx = idx * full_shape[d] + coord[d];
  return idx;
}

Param& ParamRegistry::add(const std::string& name, std::vector<int64_t> full_shape, Shard shard, int group) {
  MT_ASSERT(!finalized_, "add after finalize: ", name);
  MT_ASSERT(!index_.count(name), "duplicate parameter ", name);
  Param p;
  p.name = name;
  p.full_shape = std::move(full_shape);
  p.shard = shard;
  p.local_shape = p.full_shape;
  if (shard.axis >= 0) {
    MT_ASSERT(shard.axis < (int)p.full_shape.size() && shard.blocks >= 1 &&
                  p.full_shape[shard.axis] % shard.blocks == 0 && shard.begin <= shard.end &&
                  shard.end <= p.full_shape[shard.axis] / shard.blocks,
              "bad shard of ", name);
    p.local_shape[shard.axis] = shard.blocks * (shard.end - shard.begin);
  }
  p.numel = 1;
  for (int64_t d : p.local_shape) p.numel *= (size_t)d;
  p.decay = p.full_shape.size() >= 2;
  MT_ASSERT(params_.empty() || group >= params_.back().group, "parameter groups must be contiguous: ", name);
  p.group = group;
  p.offset = total_;
  total_ += p.numel;
  index_[name] = params_.size();
  params_.push_back(std::move(p));
  return params_.back();
}

void ParamRegistry::finalize(bool allocate_data, bool allocate_grad) {
  MT_ASSERT(!finalized_);
  if (allocate_data) data_.resize(total_);
  if (allocate_grad) grad_.resize(total_);
  for (Param& p : params_) {
    p.data = allocate_data ? data_.data() + p.offset : nullptr;
    p.grad = allocate_grad ? grad_.data() + p.offset : nullptr;
  }
  finalized_ = true;
}

int ParamRegistry::num_groups() const { return params_.empty() ? 0 : params_.back().group + 1; }

Param* ParamRegistry::find(const std::string& name) {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &params_[it->second];
}

Param& ParamRegistry::get(const std::string& name) {
  Param* p = find(name);
  MT_ASSERT(p, "no parameter named ", name);
  return *p;
}

const Param& ParamRegistry::get(const std::string& name) const {
  return const_cast<ParamRegistry*>(this)->get(name);
}

void ParamRegistry::init_normal(const std::string& name, uint64_t seed, float stddev) {
  Param& p = get(name);
  CounterRng rng(seed, name);
  for (size_t i = 0; i < p.numel; i++) p.data[i] = (float)(rng.normal((uint64_t)p.full_index(i)) * stddev);
}

void ParamRegistry::init_constant(const std::string& name, float value) {
  Param& p = get(name);
  for (size_t i = 0; i < p.numel; i++) p.data[i] = value;
}

}  // namespace mt::nn
