#include "train/model_registry.h"

#include "core/error.h"

namespace mt::train {

namespace {

const ModelEntry kModels[] = {
    {ModelKind::gpt, "tokens", true, make_gpt_task, check_gpt_shape},
    {ModelKind::mlp, "examples", false, make_mlp_task, nullptr},
};

}  // namespace

const ModelEntry& model_entry(ModelKind kind) {
  for (const ModelEntry& e : kModels)
    if (e.kind == kind) return e;
  MT_ASSERT(false, "model ", flag_name(kind), " has no row in model_registry.cpp");
  return kModels[0];
}

}  // namespace mt::train
