#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
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

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", (long long)step);
  return buf;
}

std::string save_checkpoint(const std::string& dir, int64_t step, const nn::ParamRegistry& params,
                            const float* flat_params, const NamedFlat& flat_states,
                            const std::map<std::string, std::string>& model_metadata, const nlohmann::json& state,
                            int keep, const std::vector<NamedTensor>& factored_states) {
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
    for (const NamedTensor& t : factored_states) w.add_f32(t.name, t.shape, t.data);  // a repeated name throws
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
    // Only steps up to this one (latest's target) compete for the `keep` places; newer ones stay.
    std::vector<int64_t> older;
    for (auto& e : fs::directory_iterator(dir)) {
      const int64_t n = checkpoint_step(e.path().filename().string());
      if (n >= 0 && n <= step && e.is_directory()) older.push_back(n);
    }
    std::sort(older.begin(), older.end(), std::greater<>());
    for (size_t i = (size_t)keep; i < older.size(); i++) {
      const fs::path victim = fs::path(dir) / step_name(older[i]);
      const fs::path doomed = fs::path(dir) / (step_name(older[i]) + ".tmp.prune." + std::to_string(::getpid()));
      fs::rename(victim, doomed, ec);
      if (!ec) fs::remove_all(doomed, ec);
    }
  }
  return final_path.string();
}

int64_t checkpoint_step(const std::string& name) {
  if (name.size() <= 5 || name.rfind("step_", 0) != 0) return -1;
  if (name.find_first_not_of("0123456789", 5) != std::string::npos || name.size() > 5 + 18) return -1;
  return std::stoll(name.substr(5));
}

namespace {
std::string latest_target(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(dir / "latest", ec)) return "";
  std::string name = read_file((dir / "latest").string());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  return name;
}

// The pid after the last ".tmp." of a temporary's name, or -1.
pid_t temp_owner(const std::string& name) {
  const size_t p = name.rfind(".tmp.");
  if (p == std::string::npos) return -1;
  std::string tail = name.substr(p + 5);
  if (tail.rfind("prune.", 0) == 0) tail = tail.substr(6);
  if (tail.empty() || tail.find_first_not_of("0123456789") != std::string::npos || tail.size() > 9) return -1;
  return (pid_t)std::stol(tail);
}
}  // namespace

void check_fresh_checkpoint_dir(const std::string& dir, const std::string& resume) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  std::vector<int64_t> steps;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t n = checkpoint_step(e.path().filename().string());
    if (n >= 0) steps.push_back(n);
  }
  const std::string latest = latest_target(dir);
  if (steps.empty() && latest.empty()) return;
  std::sort(steps.begin(), steps.end());
  std::string names;
  for (size_t i = 0; i < steps.size() && i < 6; i++) names += (i ? ", " : "") + step_name(steps[i]);
  if (steps.size() > 6) names += str(" and ", steps.size() - 6, " more");
  const std::string held = str("--checkpoint-dir ", dir, " already holds checkpoints of another run (",
                               names.empty() ? std::string("no step directories") : names,
                               latest.empty() ? "" : "; latest -> " + latest, ")");
  if (!resume.empty())  // pruning would delete them as this run's checkpoints arrive
    throw InputError(str(held, ", not of the run --resume ", resume, " continues: give --checkpoint-dir ", resume,
                         " (or another, empty directory), or pass --overwrite-checkpoints to delete them"));
  throw InputError(str(held, ": continue it with --resume ", dir,
                       ", choose another --checkpoint-dir, or pass --overwrite-checkpoints to delete them"));
}

std::vector<std::string> clean_checkpoint_dir(const std::string& dir, bool overwrite) {
  std::vector<std::string> removed;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return removed;
  const std::string latest = latest_target(dir);
  std::vector<fs::path> doomed;
  if (overwrite && fs::exists(fs::path(dir) / "latest", ec)) {  // first: never a latest naming a deleted step
    fs::remove(fs::path(dir) / "latest", ec);
    removed.push_back("latest");
  }
  for (auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    const pid_t owner = temp_owner(n);
    const bool ours = n.rfind("step_", 0) == 0 || n.rfind("latest.tmp.", 0) == 0;
    if (owner > 0 && ours) {
      // A temporary of a live process (another job on this directory, or this one) is not ours to remove.
      if (owner != ::getpid() && ::kill(owner, 0) == 0) continue;
      doomed.push_back(e.path());
    } else if (checkpoint_step(n) >= 0) {
      const bool whole = fs::exists(e.path() / "model.safetensors") && fs::exists(e.path() / "optimizer.safetensors") &&
                         fs::exists(e.path() / "state.json");
      if (overwrite || (!whole && n != latest)) doomed.push_back(e.path());
    }
  }
  for (const fs::path& p : doomed) {
    fs::remove_all(p, ec);
    removed.push_back(p.filename().string());
  }
  return removed;
}

void set_latest(const std::string& dir, const std::string& name) {
  write_file_atomic((fs::path(dir) / "latest").string(), name + "\n");
}

std::string checkpoint_problem(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  if (!fs::is_directory(p, ec)) return "does not exist";
  for (const char* f : {"state.json", "model.safetensors", "optimizer.safetensors"})
    if (!fs::exists(p / f, ec)) return str("lacks ", f);
  try {
    const nlohmann::json st = nlohmann::json::parse(read_file((p / "state.json").string()));
    if (!st.is_object() || !st.contains("step") || !st["step"].is_number_integer() || st["step"].get<int64_t>() < 0)
      return "has no valid \"step\" in state.json";
    const fs::path named = p.has_filename() ? p : p.parent_path();
    const int64_t n = checkpoint_step(named.filename().string());
    if (n >= 0 && n != st["step"].get<int64_t>())
      return str("has a state.json that says step ", st["step"].get<int64_t>(), " in directory ",
                 named.filename().string());
    SafetensorsReader model((p / "model.safetensors").string()), opt((p / "optimizer.safetensors").string());
  } catch (const nlohmann::json::exception& e) {
    return str("has a state.json that is not valid JSON (", e.what(), ")");
  } catch (const std::exception& e) {
    return str("is damaged: ", e.what());
  }
  return "";
}

std::string resolve_checkpoint(const std::string& dir, std::string* note) {
  const fs::path d(dir);
  std::error_code ec;
  if (fs::exists(d / "state.json", ec)) return d.string();
  // latest first; when it is missing or names a deleted or damaged step, the newest complete step_N (a
  // complete one is written whole before latest moves, so it is a state this or an earlier run reached).
  const fs::path latest = d / "latest";
  std::string why = str(latest.string(), " does not exist");
  if (fs::exists(latest, ec)) {
    const std::string name = latest_target(d);
    const std::string problem = name.empty() ? "names nothing" : checkpoint_problem((d / name).string());
    if (problem.empty()) return (d / name).string();
    why = str(latest.string(), " points at ", name, ", which ", problem);
  }
  std::vector<int64_t> steps;
  for (auto& e : fs::directory_iterator(d, ec))
    if (const int64_t n = checkpoint_step(e.path().filename().string()); n >= 0) steps.push_back(n);
  std::sort(steps.begin(), steps.end(), std::greater<>());
  std::string rejected;
  for (int64_t n : steps) {
    const fs::path p = d / step_name(n);
    const std::string problem = checkpoint_problem(p.string());
    if (problem.empty()) {
      if (note) *note = str(why, "; resuming from the newest complete checkpoint, ", p.string());
      return p.string();
    }
    rejected += str("; ", step_name(n), " ", problem);
  }
  MT_CHECK_INPUT(!steps.empty() || fs::exists(latest, ec), "--resume ", dir, ": no checkpoint there (neither ",
                 latest.string(), " nor state.json exists)");
  throw InputError(str("--resume ", dir, ": ", why, ", and no complete checkpoint is there",
                       steps.empty() ? std::string(" (no step directories)") : rejected));
}

nlohmann::json load_checkpoint(const std::string& path, const nn::ParamRegistry& params, float* flat_params,
                               const NamedFlatOut& flat_states, const std::vector<NamedTensorOut>& factored_states) {
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
  MT_CHECK_INPUT(state["step"].get<int64_t>() >= 0, state_path, ": step ", state["step"].get<int64_t>(), " is negative");
  // The directory name is what latest, pruning and people go by: a copy edited into the wrong place is refused.
  const fs::path named = p.has_filename() ? p : p.parent_path();
  const int64_t dir_step = checkpoint_step(named.filename().string());
  MT_CHECK_INPUT(dir_step < 0 || dir_step == state["step"].get<int64_t>(), state_path, " says step ",
                 state["step"].get<int64_t>(), " but its directory is ", named.filename().string(), " (step ", dir_step,
                 "): the checkpoint was renamed or edited; fix one of them to match the weights it holds");
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
  for (const NamedTensorOut& f : factored_states) {
    const TensorInfo* t = ost.find(f.name);
    MT_CHECK_INPUT(t, ost.path(), ": no optimizer tensor ", f.name, " (was the checkpoint written with another",
                   " --optimizer or model?)");
    MT_CHECK_INPUT(t->shape == f.shape, ost.path(), ": optimizer tensor ", f.name, " has shape ", shape_str(t->shape),
                   ", the optimizer declares ", shape_str(f.shape));
    ost.read_f32(f.name, f.data, t->numel());
  }
  return state;
}

}  // namespace mt::checkpoint
