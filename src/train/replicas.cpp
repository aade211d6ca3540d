#include "train/replicas.h"

namespace mt::train {

void set_replica_facts(nn::ParamRegistry& params, int tp_rank, int tp_size, const std::set<std::string>& tied,
                       bool first_stage) {
  for (nn::Param& p : params.params()) {
    nn::Replicas r;
    if (tp_size > 1 && p.shard.axis < 0) {
      r.groups |= (uint8_t)nn::CopyGroup::tp;
      r.counted = r.saved = tp_rank == 0;
    }
    if (tied.count(p.name)) {
      r.groups |= (uint8_t)nn::CopyGroup::tie;
      r.summed = true;
      r.counted = r.counted && first_stage;
      r.saved = r.saved && first_stage;
    }
    p.replicas = r;
  }
}

void set_mirror_facts(nn::ParamRegistry& params, int tp_rank, int tp_size, const std::set<std::string>& counted_here) {
  set_replica_facts(params, tp_rank, tp_size, {}, true);
  for (nn::Param& p : params.params()) {
    nn::Replicas& r = p.replicas;
    r.groups |= (uint8_t)nn::CopyGroup::tie;
    r.summed = true;
    r.counted = r.counted && counted_here.count(p.name) > 0;
    r.saved = r.saved && counted_here.count(p.name) > 0;
  }
}

std::set<std::string> common_tensors(const nn::ParamRegistry& a, const nn::ParamRegistry& b) {
  std::set<std::string> out;
  for (const nn::Param& p : a.params())
    if (b.find(p.name)) out.insert(p.name);
  return out;
}

}  // namespace mt::train
