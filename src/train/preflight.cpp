// Start-of-run checks of output locations (see the header).
#include "train/preflight.h"

#include <unistd.h>

#include <filesystem>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "core/fs.h"

namespace mt::train {

namespace {

namespace fs = std::filesystem;

// A dangling symlink at --checkpoint-dir or on the way to it is refused rather than its target created: a
// link whose target is missing usually names a disk that is not mounted or a directory moved away, and
// creating the target would put the checkpoints on whatever disk holds the mount point (or under a typo),
// silently; fs::create_directories would fail only at the first save, after the work.
void check_no_dangling_link(const std::string& d) {
  std::error_code ec;
  for (fs::path a = fs::absolute(d, ec); !a.empty() && !fs::exists(a, ec); a = a.parent_path()) {
    if (fs::is_symlink(fs::symlink_status(a, ec))) {
      const std::string target = resolve_symlinks(a.string());  // throws naming a link loop
      throw InputError(str("--checkpoint-dir ", d, ": ", a.string(), " is a symlink to ", target,
                           ", which does not exist: create it (or mount its disk), or point the link elsewhere"));
    }
    if (a == a.parent_path()) break;
  }
}

// Whether the checkpoint --resume names lives in dir (the same run continuing), by file identity.
bool resumes_into(const std::string& resume, const std::string& dir) {
  const fs::path from = checkpoint::resolve_checkpoint(resume);  // throws when there is none
  return same_file(resume, dir) || same_file(from.parent_path().string(), dir);
}

// --checkpoint-dir: a writable directory (or one that can be made), holding no other run's checkpoints.
void check_checkpoint_dir(const TrainConfig& cfg) {
  const std::string& d = cfg.checkpoint_dir;
  std::error_code ec;
  check_no_dangling_link(d);
  if (fs::exists(d, ec)) {
    MT_CHECK_INPUT(fs::is_directory(d, ec), "--checkpoint-dir ", d, " exists and is not a directory");
    MT_CHECK_INPUT(::access(d.c_str(), W_OK | X_OK) == 0, "--checkpoint-dir ", d, ": cannot write there");
  } else {
    // It will be created: its nearest existing ancestor must be a writable directory.
    fs::path a = fs::absolute(d, ec).parent_path();
    while (!a.empty() && !fs::exists(a, ec) && a != a.parent_path()) a = a.parent_path();
    MT_CHECK_INPUT(fs::is_directory(a, ec) && ::access(a.c_str(), W_OK | X_OK) == 0, "--checkpoint-dir ", d,
                   ": cannot be created (", a.string(), " is not a writable directory)");
  }
  // A resumed run writing beside its own checkpoint continues that run; anywhere else it is a fresh writer.
  const bool same_run = !cfg.resume.empty() && resumes_into(cfg.resume, d);
  if (cfg.overwrite_checkpoints)
    MT_CHECK_INPUT(!same_run, "--overwrite-checkpoints would delete the checkpoint --resume ", cfg.resume,
                   " continues from (it is in --checkpoint-dir ", d, "); drop --overwrite-checkpoints");
  else if (!same_run)
    checkpoint::check_fresh_checkpoint_dir(d, cfg.resume);
}

}  // namespace

void check_outputs(const TrainConfig& cfg) {
  const std::vector<std::pair<const char*, std::string>> inputs = {
      {"--data", cfg.data}, {"--val-data", cfg.val_data}, {"--labels", cfg.labels},
      {"--val-labels", cfg.val_labels}, {"--init", cfg.init}};
  const std::vector<std::pair<const char*, std::string>> outputs = {
      {"--metrics", cfg.metrics}, {"--save", cfg.save}, {"--summary", cfg.summary}, {"--trace", cfg.trace}};
  for (size_t i = 0; i < outputs.size(); i++) {
    const auto& [flag, path] = outputs[i];
    if (path.empty()) continue;
    check_output_path(flag, path);
    // Devices are shared sinks: --metrics /dev/null --summary /dev/null is fine.
    const bool device = file_kind(resolve_symlinks(path)) == "character device";
    for (const auto& [iflag, ipath] : inputs)
      MT_CHECK_INPUT(ipath.empty() || !same_file(path, ipath), flag, " ", path, " is the same file as ", iflag, " ",
                     ipath, ": writing it would destroy the input; choose another path");
    for (size_t j = i + 1; j < outputs.size() && !device; j++)
      MT_CHECK_INPUT(outputs[j].second.empty() || !same_file(path, outputs[j].second), flag, " and ", outputs[j].first,
                     " name the same file ", path, "; give each its own");
  }
  if (!cfg.checkpoint_dir.empty()) check_checkpoint_dir(cfg);
}

}  // namespace mt::train
