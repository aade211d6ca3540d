// Run configuration files for `meshtrain train --config run.toml`, and the resolved configuration every run
// writes beside its metrics (docs/config.md has the user's view).
//
// A file holds top-level TOML keys named like the flags without their dashes (`batch-size = 8`; `batch_size`
// is the same key), with TOML's types: integers, numbers, "strings", true/false, [arrays] for list flags. The
// file is parsed and checked by toml++ and here (file, line and key in every error), then each value is handed
// to the flag's own CLI11 option, so conversion, range checks and flag callbacks are the command line's.
// Flags given on the command line win over the file. What lives elsewhere: the flags themselves (cmd_train.cpp);
// writing the resolved text on rank 0 (train/trainer.cpp, TrainConfig::resolved_config).
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <set>
#include <string>

namespace mt::cli {

// Flag ("--batch-size") -> the line of the file that set it, for messages about values that came from a file.
using ConfigLines = std::map<std::string, int>;

// Reads `path` and gives each key's value to its option of `sub` unless the command line gave that flag.
// Throws mt::InputError "PATH:LINE: ..." naming the key for a syntax error, an unknown key, a table, a value of
// the wrong TOML type, or a value the flag refuses (range, choices). Returns where each applied flag was set.
ConfigLines apply_config_file(CLI::App& sub, const std::string& path);

// The resolved configuration of `sub` after parsing, as TOML that --config reads back into the same run: every
// option's value (given or default) in --help order; options with no value and no default as "# key: not set"
// comments; `skip` (flags of the other model) left out; `not_repeated` (--resume, --overwrite-checkpoints)
// written only as comments, so repeating a run never resumes it or deletes checkpoints unasked.
std::string render_config(const CLI::App& sub, const std::set<std::string>& skip,
                          const std::set<std::string>& not_repeated);

// Where a run writes its resolved configuration: --metrics with its extension replaced by .toml
// (metrics.jsonl -> metrics.toml); without --metrics (or when it is a device or FIFO such as /dev/null, which
// has no "beside"), --save's (model.safetensors -> model.toml); "" when neither gives a place.
std::string resolved_config_path(const std::string& metrics, const std::string& save);

}  // namespace mt::cli
