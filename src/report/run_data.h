// What the report reads of one run: its metrics rows (--metrics, JSON lines), and when present beside them
// the closing summary (--summary), the Chrome trace (--trace) and the resolved configuration (the metrics
// file's name with .toml for .jsonl). Files are read whole; a run of 100k steps is ~20 MB of metrics.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mt::report {

struct RunData {
  std::string name;                  // shown in legends and column heads: the directory's name, or the file's stem
  std::string metrics_path;          // the JSON lines file
  std::vector<nlohmann::json> rows;  // one object per step, in file order; each has "step" and "loss"
  std::string summary_path;          // "" when absent
  nlohmann::json summary;            // null when absent
  std::string trace_path;            // "" when absent
  nlohmann::json trace;              // null when absent
  std::string config_path;           // "" when absent
  std::string config_text;           // the .toml as written
};

// PATH is a run directory or a metrics file.
//  - directory: its metrics file is metrics.jsonl, else its only *.jsonl (several without a metrics.jsonl is
//    an error listing them); summary.json, trace.json and the metrics' .toml are taken from the same directory.
//  - file X.jsonl: X.summary.json (else summary.json), X.trace.json (else trace.json) and X.toml beside it.
// Throws mt::InputError naming the file (and line, for a row that is not a JSON object or lacks "step" or
// "loss" as a number) and what to do.
RunData load_run(const std::string& path);

// The rows' numeric values of `key` as (step, value) pairs; rows without the key (or with a non-number) are
// skipped. "step" is the row's 0-based step; the chart shows it as is.
std::vector<std::pair<double, double>> column(const RunData& run, const std::string& key);

// Names made unique in order: a second "run" becomes "run (2)".
void make_names_unique(std::vector<RunData>& runs);

}  // namespace mt::report
