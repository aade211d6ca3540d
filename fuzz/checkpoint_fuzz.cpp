// Fuzz target: a checkpoint directory (checkpoint/checkpoint.h). The input holds the three files of
// step_00000005 (state.json, model.safetensors, optimizer.safetensors; see fuzz_input.h's Parts). The
// resume checks (checkpoint_problem, resolve_checkpoint) and the loader (load_checkpoint into a small model
// with flat and factored optimizer state) must reject bad files with mt::InputError only, and must agree: a
// directory checkpoint_problem finds damaged is never loaded.
#include <cstdint>
#include <filesystem>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "fuzz_input.h"
#include "nn/params.h"

namespace {

struct Model {
  mt::nn::ParamRegistry reg;
  std::vector<float> flat, m, v, row;
  Model() {
    reg.add("wte.weight", {4, 3});
    reg.add("ln.bias", {3});
    reg.finalize();
    flat.resize(reg.size());
    m.resize(reg.size());
    v.resize(reg.size());
    row.resize(4);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Model model;
  namespace fs = std::filesystem;
  const fs::path root = mt::fuzz::scratch_dir() / "ckpt";
  const fs::path dir = root / "step_00000005";
  fs::create_directories(dir);
  mt::fuzz::Parts parts{data, size};
  const char* names[] = {"state.json", "model.safetensors", "optimizer.safetensors"};
  for (int i = 0; i < 3; ++i) {
    const std::string bytes = parts.next(i == 2);
    mt::fuzz::write_input(std::string("ckpt/step_00000005/") + names[i],
                          reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  const std::string problem = mt::checkpoint::checkpoint_problem(dir.string());
  try {
    const std::string chosen = mt::checkpoint::resolve_checkpoint(root.string());
    if (!problem.empty() || chosen != dir.string()) __builtin_trap();  // only a complete checkpoint is chosen
  } catch (const mt::InputError&) {
    if (problem.empty()) __builtin_trap();  // a complete checkpoint must be found
  }
  bool loaded = false;
  try {
    const mt::checkpoint::NamedFlatOut flat_states = {{"adamw.m", model.m.data()}, {"adamw.v", model.v.data()}};
    const std::vector<mt::checkpoint::NamedTensorOut> factored = {{"adafactor.row/wte.weight", {4}, model.row.data()}};
    mt::checkpoint::load_checkpoint(dir.string(), model.reg, model.flat.data(), flat_states, factored);
    loaded = true;
  } catch (const mt::InputError&) {
  }
  if (loaded && !problem.empty()) __builtin_trap();
  return 0;
}
