#include "nn/params.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "core/env.h"
#include "core/error.h"
#include "core/rng.h"
#include "tensor/bf16.h"

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

void ParamRegistry::finalize(bool allocate_data, bool allocate_grad, bool shared_data) {
  MT_ASSERT(!finalized_);
  if (shared_data) data_ = AlignedBuffer::shared(0);
  if (allocate_data) data_.resize(total_);
  if (allocate_grad) grad_.resize(total_);
  for (Param& p : params_) {
    p.data = allocate_data ? data_.data() + p.offset : nullptr;
    p.grad = allocate_grad ? grad_.data() + p.offset : nullptr;
  }
  group_first_.assign(num_groups() + 1, params_.size());
  for (size_t i = params_.size(); i-- > 0;) group_first_[params_[i].group] = i;
  for (int g = num_groups(); g-- > 0;) group_first_[g] = std::min(group_first_[g], group_first_[g + 1]);
  finalized_ = true;
}

void ParamRegistry::enable_mirror() {
  MT_ASSERT(finalized_, "enable_mirror needs the finalized registry");
  if (std::none_of(params_.begin(), params_.end(), [](const Param& p) { return p.products; })) return;
  mirror_.assign(total_, 0);
  for (Param& p : params_) p.data16 = p.products ? mirror_.data() + p.offset : nullptr;
  if (data_.size() == total_) refresh_mirror();  // else the parameters' owner fills it (parallel/data/param_file.h)
}

void ParamRegistry::refresh_mirror(size_t begin, size_t count) {
  if (mirror_.empty()) return;
  const size_t end = count > total_ - begin ? total_ : begin + count;
  for (Param& p : params_) {
    if (!p.products || p.offset + p.numel <= begin || p.offset >= end || p.numel == 0) continue;
    MT_ASSERT(p.offset >= begin && p.offset + p.numel <= end, "refresh_mirror: [", begin, ", ", end,
              ") cuts tensor ", p.name);
    // As rows of its last axis: pack_bf16 threads over rows when the tensor is large.
    const int cols = (int)p.local_shape.back(), rows = (int)(p.numel / (size_t)cols);
    pack_bf16(p.data, rows, cols, cols, mirror_.data() + p.offset);
  }
}

void ParamRegistry::zero_grad() {
  grad_.zero();
  for (Param& p : params_) p.grad_fresh = false;
}

namespace {
// The NaN that MESHTRAIN_CHECK_GRAD_WRITES fills unwritten gradients with. x86 arithmetic passes a NaN
// operand's payload on, so a sum that started from it still carries it; a NaN of a diverged step does not.
constexpr uint32_t kUnwritten = 0x7fcdead5u;
bool is_unwritten(float x) { return (std::bit_cast<uint32_t>(x) & 0x7fffffffu) == kUnwritten; }
}  // namespace

ParamRegistry::ParamRegistry() : check_(env_flag("MESHTRAIN_CHECK_GRAD_WRITES").value_or(false)) {}

void ParamRegistry::begin_grads(size_t begin, size_t count) {
  const size_t end = count > total_ - begin ? total_ : begin + count;
  for (Param& p : params_) {
    if (p.offset + p.numel <= begin || p.offset >= end || p.numel == 0) continue;
    MT_ASSERT(p.offset >= begin && p.offset + p.numel <= end, "begin_grads: [", begin, ", ", end, ") cuts tensor ",
              p.name);
    MT_ASSERT(p.grad, "begin_grads: ", p.name, " has no gradient buffer bound");
    p.grad_fresh = true;
    if (check_) std::fill(p.grad, p.grad + p.numel, std::bit_cast<float>(kUnwritten));
  }
}

void ParamRegistry::settle_grads(int group) {
  MT_ASSERT(finalized_ && group >= 0 && group < num_groups(), "settle_grads: no group ", group);
  for (size_t i = group_first_[group]; i < group_first_[group + 1]; i++) {
    Param& p = params_[i];
    if (p.grad_fresh) {
      if (check_)
        for (size_t j = 0; j < p.numel; j++)
          MT_ASSERT(is_unwritten(p.grad[j]), "MESHTRAIN_CHECK_GRAD_WRITES: ", p.name, " [", j,
                    "] was written without grad_out/grad_acc this step: settling would zero it");
      std::memset(p.grad, 0, sizeof(float) * p.numel);
      p.grad_fresh = false;
      continue;
    }
    if (!check_ || !p.grad) continue;
    for (size_t j = 0; j < p.numel; j++)
      MT_ASSERT(!is_unwritten(p.grad[j]), "MESHTRAIN_CHECK_GRAD_WRITES: the gradient of ", p.name, " [", j,
                "] still holds the unwritten marker after its group's backward: a kernel added to it (or left it) ",
                "before anything wrote it this step");
  }
}

int ParamRegistry::num_groups() const { return params_.empty() ? 0 : params_.back().group + 1; }

Param* ParamRegistry::find(const std::string& name) {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &params_[it->second];
}

const Param* ParamRegistry::find(const std::string& name) const {
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
