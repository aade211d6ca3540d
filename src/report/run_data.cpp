#include "report/run_data.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "core/fs.h"

namespace mt::report {

namespace fs = std::filesystem;

namespace {

std::vector<nlohmann::json> read_rows(const std::string& path) {
  const std::string text = read_file(path);
  std::vector<nlohmann::json> rows;
  size_t line = 0, pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string s = text.substr(pos, end - pos);
    pos = end + 1;
    line++;
    if (s.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json row = nlohmann::json::parse(s, nullptr, false);
    MT_CHECK_INPUT(row.is_object(), path, ":", line, ": not a JSON object (",
                   s.size() > 60 ? s.substr(0, 60) + "..." : s,
                   "); a metrics file holds one JSON object per line, as written by meshtrain train --metrics");
    // A non-finite loss is written as null (JSON has no NaN): kept, and left out of the charts.
    MT_CHECK_INPUT(row.contains("step") && row["step"].is_number(), path, ":", line,
                   ": the row has no number \"step\"; is this a meshtrain train --metrics file?");
    MT_CHECK_INPUT(row.contains("loss") && (row["loss"].is_number() || row["loss"].is_null()), path, ":", line,
                   ": the row has no \"loss\"; is this a meshtrain train --metrics file?");
    rows.push_back(std::move(row));
  }
  MT_CHECK_INPUT(!rows.empty(), path, ": holds no metrics rows (did the run reach its first step?)");
  return rows;
}

nlohmann::json read_json(const std::string& path, const char* what) {
  const std::string text = read_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte is the 1-based offset of the error: turn it into a line number.
    const size_t at = std::min<size_t>(e.byte ? e.byte - 1 : 0, text.size());
    const long line = 1 + std::count(text.begin(), text.begin() + (long)at, '\n');
    throw InputError(str(path, ":", line, ": not valid JSON (", what, "): ", e.what()));
  }
}

// The first of `names` (in `dir`) that is a regular file, or "".
std::string first_existing(const fs::path& dir, std::initializer_list<std::string> names) {
  for (const std::string& n : names)
    if (file_kind((dir / n).string()) == "regular file") return (dir / n).string();
  return "";
}

std::string metrics_in_dir(const fs::path& dir) {
  if (file_kind((dir / "metrics.jsonl").string()) == "regular file") return (dir / "metrics.jsonl").string();
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".jsonl" && e.is_regular_file()) found.push_back(e.path().string());
  std::sort(found.begin(), found.end());
  MT_CHECK_INPUT(!found.empty(), dir.string(),
                 ": no metrics file (*.jsonl) in this directory; pass a run directory written with "
                 "meshtrain train --metrics DIR/metrics.jsonl, or the metrics file itself");
  std::string list;
  for (const auto& f : found) list += (list.empty() ? "" : ", ") + f;
  MT_CHECK_INPUT(found.size() == 1, dir.string(), ": several metrics files (", list,
                 ") and no metrics.jsonl; pass the one to report on");
  return found[0];
}

}  // namespace

RunData load_run(const std::string& path) {
  const std::string kind = file_kind(path);
  MT_CHECK_INPUT(!kind.empty(), path,
                 ": no such file or directory (meshtrain report takes run directories or "
                 "metrics files)");
  RunData r;
  fs::path dir;
  std::string stem;
  if (kind == "directory") {
    dir = fs::path(path);
    r.metrics_path = metrics_in_dir(dir);
    r.name = fs::absolute(dir).lexically_normal().filename().string();
    if (r.name.empty()) r.name = fs::absolute(dir).lexically_normal().parent_path().filename().string();
    stem = fs::path(r.metrics_path).stem().string();
    r.summary_path = first_existing(dir, {stem + ".summary.json", "summary.json"});
    r.trace_path = first_existing(dir, {stem + ".trace.json", "trace.json"});
  } else {
    r.metrics_path = path;
    dir = fs::path(path).parent_path();
    if (dir.empty()) dir = ".";
    stem = fs::path(path).stem().string();
    r.name = stem == "metrics" ? fs::absolute(dir).lexically_normal().filename().string() : stem;
    r.summary_path = first_existing(dir, {stem + ".summary.json", "summary.json"});
    r.trace_path = first_existing(dir, {stem + ".trace.json", "trace.json"});
  }
  r.config_path = first_existing(dir, {stem + ".toml"});
  r.rows = read_rows(r.metrics_path);
  if (!r.summary_path.empty()) {
    r.summary = read_json(r.summary_path, "a run summary, as written by meshtrain train --summary");
    MT_CHECK_INPUT(r.summary.is_object(), r.summary_path, ": a run summary is a JSON object");
  }
  if (!r.trace_path.empty()) {
    r.trace = read_json(r.trace_path, "a Chrome trace, as written by meshtrain train --trace");
    MT_CHECK_INPUT(r.trace.is_object() && r.trace.contains("traceEvents") && r.trace["traceEvents"].is_array(),
                   r.trace_path, ": a Chrome trace is an object with a \"traceEvents\" array");
  }
  if (!r.config_path.empty()) r.config_text = read_file(r.config_path);
  return r;
}

std::vector<std::pair<double, double>> column(const RunData& run, const std::string& key) {
  std::vector<std::pair<double, double>> out;
  for (const nlohmann::json& row : run.rows) {
    auto it = row.find(key);
    if (it != row.end() && it->is_number()) out.push_back({row["step"].get<double>(), it->get<double>()});
  }
  return out;
}

void make_names_unique(std::vector<RunData>& runs) {
  std::map<std::string, int> seen;
  for (RunData& r : runs) {
    const int n = ++seen[r.name];
    if (n > 1) r.name += " (" + std::to_string(n) + ")";
  }
}

}  // namespace mt::report
