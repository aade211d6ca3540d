#include "train/model_registry.h"

#include <vector>

#include "core/error.h"

namespace mt::train {

namespace {

const ModelEntry kModels[] = {
    {ModelKind::gpt, "gpt", "tokens", true, make_gpt_task, check_gpt_shape},
    {ModelKind::mlp, "mlp", "examples", false, make_mlp_task, nullptr},
};

}  // namespace

std::span<const FlagValue<ModelKind>> flag_values(ModelKind) {
  static const std::vector<FlagValue<ModelKind>> names = [] {
    std::vector<FlagValue<ModelKind>> v;
    for (const ModelEntry& e : kModels) v.push_back({e.name, e.kind});
    return v;
  }();
  return names;
}

const ModelEntry& model_entry(ModelKind kind) {
  for (const ModelEntry& e : kModels)
    if (e.kind == kind) return e;
  MT_ASSERT(false, "model ", flag_name(kind), " has no row in model_registry.cpp");
  return kModels[0];
}

}  // namespace mt::train
