#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"
#include "core/error.h"
#include "core/fs.h"

namespace fs = std::filesystem;

namespace mt::checkpoint {

namespace {

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", (long long)step);
  return buf;
}

}  // namespace

std::string save_checkpoint(const std::string& dir, int64_t step, const nn::ParamRegistry& params,
                            const float* flat_params, const NamedFlat& flat_states,
                            const std::map<std::string, std::string>& model_metadata, const nlohmann::json& state,
                            int keep) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  MT_REQUIRE(Error, !ec, "cannot create checkpoint directory ", dir, ": ", ec.message());
  const std::string name = step_name(step);
  const fs::path final_path = fs::path(dir) / name;
  const fs::path tmp = fs::path(dir) / (name + ".tmp." + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  MT_REQUIRE(Error, !ec, "cannot create ", tmp.string(), ": ", ec.message());
  try {
    save_params((tmp / "model.safetensors").string(), params, model_metadata, flat_params);
    SafetensorsWriter w;
    for (auto& [sname, buf] : flat_states) {
      for (const nn::Param& p : params.params()) w.add_f32(sname + "/" + p.name, p.full_shape, buf + p.offset);
    }
    w.write((tmp / "optimizer.safetensors").string());
    write_file_atomic((tmp / "state.json").string(), state.dump(2) + "\n");
    fsync_dir(tmp);
    fs::remove_all(final_path, ec);  // a checkpoint of the same step from an earlier, interrupted run
    fs::rename(tmp, final_path);
    fsync_dir(dir);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  set_latest(dir, name);

  if (keep > 0) {
    std::vector<std::string> steps;
    for (auto& e : fs::directory_iterator(dir)) {
      std::string n = e.path().filename().string();
      if (e.is_directory() && n.rfind("step_", 0) == 0 && n.find(".tmp.") == std::string::npos) steps.push_back(n);
    }
    std::sort(steps.begin(), steps.end());
    for (size_t i = 0; i + keep < steps.size(); i++) fs::remove_all(fs::path(dir) / steps[i], ec);
  }
  return final_path.string();
}

void set_latest(const std::string& dir, const std::string& name) {
  write_file_atomic((fs::path(dir) / "latest").string(), name + "\n");
}

std::string resolve_checkpoint(const std::string& dir) {
  fs::path d(dir);
  if (fs::exists(d / "state.json")) return d.string();
  fs::path latest = d / "latest";
  MT_CHECK_INPUT(fs::exists(latest), "--resume ", dir, ": no checkpoint there (neither ", (d / "latest").string(),
                 " nor state.json exists)");
  std::string name = read_file(latest.string());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  fs::path target = d / name;
  MT_CHECK_INPUT(fs::exists(target / "state.json"), latest.string(), " points at ", target.string(),
                 ", which is not a complete checkpoint");
  return target.string();
}

nlohmann::json load_checkpoint(const std::string& path, const nn::ParamRegistry& params, float* flat_params,
                               const NamedFlatOut& flat_states) {
  const fs::path p(path);
  nlohmann::json state;
  const std::string state_path = (p / "state.json").string();
  try {
    state = nlohmann::json::parse(read_file(state_path));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(str(state_path, ": not valid JSON: ", e.what()));
  }
  MT_CHECK_INPUT(state.is_object() && state.contains("step") && state["step"].is_number_integer(), state_path,
                 ": missing integer field \"step\"");
  SafetensorsReader model((p / "model.safetensors").string());
  check_tensors(model, params);
  for (const nn::Param& prm : params.params()) {
    MT_ASSERT(prm.shard.axis < 0, "checkpoints hold whole tensors: ", prm.name);
    model.read_f32(model.find(prm.name) ? prm.name : "transformer." + prm.name, flat_params + prm.offset,
                   (int64_t)prm.numel);
  }
  SafetensorsReader ost((p / "optimizer.safetensors").string());
  for (auto& [sname, buf] : flat_states) {
    for (const nn::Param& prm : params.params()) {
      std::string n = sname + "/" + prm.name;
      const TensorInfo* t = ost.find(n);
      MT_CHECK_INPUT(t, ost.path(), ": no optimizer tensor ", n, " (was the checkpoint written with another",
                     " --optimizer or model?)");
      MT_CHECK_INPUT(t->numel() == (int64_t)prm.numel, ost.path(), ": optimizer tensor ", n, " has ", t->numel(),
                     " elements, expected ", prm.numel);
      ost.read_f32(n, buf + prm.offset, (int64_t)prm.numel);
    }
  }
  return state;
}

}  // namespace mt::checkpoint
