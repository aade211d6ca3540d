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

void check_outputs(const TrainConfig& cfg) {
  namespace fs = std::filesystem;
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
  if (!cfg.checkpoint_dir.empty()) {
    const std::string& d = cfg.checkpoint_dir;
    std::error_code ec;
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
    if (cfg.resume.empty() && !cfg.overwrite_checkpoints) checkpoint::check_fresh_checkpoint_dir(d);
  }
}

}  // namespace mt::train
