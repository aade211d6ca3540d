#include "report/report_html.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

#include "core/error.h"
#include "report/html.h"
#include "report/pipeline_view.h"
#include "report/svg_chart.h"

namespace mt::report {

namespace {

constexpr const char* kStyle = R"(body{font-family:sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}h3{font-size:15px}
table{border-collapse:collapse;margin:8px 0;font-size:13px}th,td{border:1px solid #ddd;padding:3px 8px;text-align:right}
thead th{background:#f4f4f4}tbody th{text-align:left;font-weight:normal;background:#fafafa}
figure{margin:8px 0;display:inline-block;vertical-align:top}.charts{display:flex;flex-wrap:wrap;gap:8px}
pre{background:#f7f7f7;padding:8px;font-size:12px;overflow:auto;max-height:400px}
.note{color:#666;font-size:13px}figure.swimlane{display:block}figure.swimlane svg{max-width:100%;height:auto})";

// The rows' items per second key: GPT rows count tokens, MLP rows examples.
std::string rate_key(const RunData& r) {
  for (const auto& row : r.rows)
    if (row.contains("examples_per_s")) return "examples_per_s";
  return "tokens_per_s";
}

bool any_row_has(const std::vector<RunData>& runs, const std::string& key) {
  for (const RunData& r : runs)
    for (const auto& row : r.rows)
      if (row.contains(key) && row[key].is_number()) return true;
  return false;
}

// The last row's value of key that is a number (val_loss is only on evaluation rows), or null.
nlohmann::json last_of(const RunData& r, const std::string& key) {
  for (auto it = r.rows.rbegin(); it != r.rows.rend(); ++it)
    if (it->contains(key) && (*it)[key].is_number()) return (*it)[key];
  return nullptr;
}

// Mean of key over the rows after the first (the first step allocates and warms caches), or null.
nlohmann::json mean_after_first(const RunData& r, const std::string& key) {
  double sum = 0;
  int n = 0;
  for (size_t i = r.rows.size() > 1 ? 1 : 0; i < r.rows.size(); i++)
    if (r.rows[i].contains(key) && r.rows[i][key].is_number()) sum += r.rows[i][key].get<double>(), n++;
  return n ? nlohmann::json(sum / n) : nlohmann::json(nullptr);
}

nlohmann::json summary_at(const RunData& r, const std::string& section, const std::string& key) {
  if (!r.summary.is_object()) return nullptr;
  const nlohmann::json* s = &r.summary;
  if (!section.empty()) {
    if (!s->contains(section) || !(*s)[section].is_object()) return nullptr;
    s = &(*s)[section];
  }
  return s->contains(key) ? (*s)[key] : nlohmann::json(nullptr);
}

std::string overview(const std::vector<RunData>& runs) {
  std::vector<std::string> head = {""};
  for (const RunData& r : runs) head.push_back(r.name);
  std::vector<std::vector<Cell>> rows;
  auto add = [&](const std::string& label, const std::string& key, auto value_of) {
    std::vector<Cell> row = {{label, "", ""}};
    for (const RunData& r : runs) row.push_back({json_text(value_of(r)), key, r.name});
    rows.push_back(std::move(row));
  };
  add("metrics file", "metrics_path", [](const RunData& r) { return nlohmann::json(r.metrics_path); });
  add("steps (rows)", "rows", [](const RunData& r) { return nlohmann::json(r.rows.size()); });
  add("final loss", "final_loss", [](const RunData& r) { return r.rows.back()["loss"]; });
  add("last validation loss", "last_val_loss", [](const RunData& r) { return last_of(r, "val_loss"); });
  add("items/s (mean after step 1)", "mean_rate", [](const RunData& r) { return mean_after_first(r, rate_key(r)); });
  add("step time s (mean after step 1)", "mean_step_time",
      [](const RunData& r) { return mean_after_first(r, "step_time_s"); });
  add("bytes sent, total", "bytes_sent_total", [](const RunData& r) { return last_of(r, "comm_bytes_total"); });
  for (const char* k : {"dp", "tp", "pp", "zero", "params", "tokens_per_s"})
    add(std::string("summary: ") + k, std::string("summary_") + k,
        [k](const RunData& r) { return summary_at(r, "", k); });
  add("expert parallel (ep)", "summary_ep", [](const RunData& r) { return summary_at(r, "moe", "ep"); });
  for (const char* k : {"schedule", "micro_batches", "bubble_measured", "bubble_simulated", "bubble_ideal"})
    add(std::string("pipeline: ") + k, std::string("pipeline_") + k,
        [k](const RunData& r) { return summary_at(r, "pipeline", k); });
  return "<h2 id=\"overview\">Runs</h2>\n" + html_table("overview", head, rows);
}

std::string curve(const std::vector<RunData>& runs, const std::string& id, const std::string& title,
                  const std::string& y_label, bool from_zero,
                  const std::function<std::string(const RunData&)>& key_of) {
  LineChart c{id, title, "step (the metrics file's, from 0)", y_label, {}, from_zero};
  for (const RunData& r : runs) c.series.push_back({r.name, column(r, key_of(r))});
  return "<figure>" + line_chart_svg(c) + "</figure>\n";
}

std::string curves(const std::vector<RunData>& runs) {
  auto fixed = [](const char* k) { return [k](const RunData&) { return std::string(k); }; };
  std::string o = "<h2 id=\"curves\">Curves</h2>\n<div class=\"charts\">\n";
  o += curve(runs, "loss", "Training loss", "loss", false, fixed("loss"));
  o += curve(runs, "val_loss", "Validation loss (evaluation steps)", "validation loss", false, fixed("val_loss"));
  o += curve(runs, "rate", "Throughput", "items/s (tokens or examples)", true, rate_key);
  if (any_row_has(runs, "mfu")) o += curve(runs, "mfu", "Model FLOPs utilization", "MFU", true, fixed("mfu"));
  o += curve(runs, "comm_bytes", "Bytes sent per step (gradient exchange, lead rank)", "bytes", true,
             fixed("comm_bytes"));
  if (any_row_has(runs, "moe_dropped"))
    o += curve(runs, "moe_dropped", "MoE: fraction of expert choices dropped", "dropped", true, fixed("moe_dropped"));
  return o + "</div>\n";
}

std::string memory_of(const RunData& r) {
  static const char* const kKinds[] = {"param_bytes", "grad_bytes", "optimizer_bytes", "activation_peak_bytes",
                                       "peak_rss_bytes"};
  static const char* const kLegend[] = {"params", "grads", "optimizer", "activations (peak)", "peak RSS"};
  const nlohmann::json ranks = summary_at(r, "", "ranks");
  if (!ranks.is_array() || ranks.empty()) return "";
  BarChart c{"memory", "Memory per rank: " + r.name, "MiB", {}, {}, {}};
  std::vector<std::string> head = {"rank"};
  for (const char* k : kKinds) head.push_back(k);
  for (const char* k : kLegend) c.series.push_back(k);
  std::vector<std::vector<Cell>> rows;
  for (size_t i = 0; i < ranks.size(); i++) {
    const nlohmann::json& m = ranks[i];
    c.groups.push_back("rank " + std::to_string(i));
    std::vector<double> v;
    std::vector<Cell> row = {{"rank " + std::to_string(i), "", ""}};
    for (const char* k : kKinds) {
      const nlohmann::json x = m.contains(k) ? m[k] : nlohmann::json(nullptr);
      v.push_back(x.is_number() ? x.get<double>() / (1 << 20) : NAN);
      row.push_back({json_text(x), k, r.name});
    }
    c.values.push_back(v);
    rows.push_back(std::move(row));
  }
  return "<h3>" + html_escape(r.name) + "</h3>\n<figure>" + bar_chart_svg(c) + "</figure>\n" +
         html_table("memory", head, rows);
}

std::string pipeline_of(const RunData& r) {
  const nlohmann::json p = summary_at(r, "", "pipeline");
  if (!p.is_object()) return "";
  std::string o;
  o += "<h3>" + html_escape(r.name) + "</h3>\n<p>bubble measured " +
       json_text(p.value("bubble_measured", nlohmann::json())) + ", simulated " +
       json_text(p.value("bubble_simulated", nlohmann::json())) + ", ideal " +
       json_text(p.value("bubble_ideal", nlohmann::json())) + " (fractions of the step's rank-time)</p>\n";
  o += "<figure class=\"swimlane\" data-chart=\"swimlane-simulated\" data-run=\"" + html_escape(r.name) + "\">" +
       inline_swimlane_svg(simulated_swimlane(p, r.summary_path)) + "</figure>\n";
  if (r.trace.is_object()) {
    const trace::Swimlane d = measured_swimlane(r.trace);
    if (!d.lanes.empty())
      o += "<figure class=\"swimlane\" data-chart=\"swimlane-measured\" data-run=\"" + html_escape(r.name) + "\">" +
           inline_swimlane_svg(d) + "</figure>\n";
  } else {
    o += "<p class=\"note\">No trace.json beside the metrics: run with --trace for the measured swimlane.</p>\n";
  }
  return o;
}

// One MoE block's expert_fraction per step from the rows' "moe" arrays: a line per expert, so a collapse onto a
// few experts shows when it started.
LineChart expert_load_over_steps(const RunData& r, const nlohmann::json& layer, const std::string& block) {
  LineChart c{
      "expert_load_steps", "Expert load per step, " + block + ": " + r.name, "step", "admitted fraction", {}, true};
  for (const nlohmann::json& row : r.rows) {
    if (!row.contains("moe") || !row["moe"].is_array()) continue;
    for (const nlohmann::json& l : row["moe"]) {
      if (!l.is_object() || l.value("layer", nlohmann::json()) != layer) continue;
      const auto frac = l.value("expert_fraction", std::vector<double>{});
      if (c.series.size() < frac.size()) c.series.resize(frac.size());
      for (size_t e = 0; e < frac.size(); e++) {
        c.series[e].name = "expert " + std::to_string(e);
        c.series[e].points.push_back({row["step"].get<double>(), frac[e]});
      }
    }
  }
  return c;
}

std::string experts_of(const RunData& r) {
  const nlohmann::json layers = summary_at(r, "moe", "layers");
  if (!layers.is_array()) return "";
  std::string o;
  o += "<h3>" + html_escape(r.name) + "</h3>\n<div class=\"charts\">\n";
  std::vector<std::vector<Cell>> rows;
  for (const nlohmann::json& l : layers) {
    const std::string block = "block " + json_text(l.value("layer", nlohmann::json()));
    const auto frac = l.value("expert_fraction", std::vector<double>{}),
               first = l.value("first_choice_fraction", std::vector<double>{});
    BarChart c{"expert_load",
               "Expert load, " + block + ": " + r.name,
               "fraction of tokens",
               {"admitted", "first choice"},
               {},
               {}};
    for (size_t e = 0; e < frac.size(); e++) {
      c.groups.push_back("expert " + std::to_string(e));
      c.values.push_back({frac[e], e < first.size() ? first[e] : NAN});
      rows.push_back(
          {{block + ", expert " + std::to_string(e), "", ""},
           {json_text(l["expert_fraction"][e]), "expert_fraction", r.name},
           {e < first.size() ? json_text(l["first_choice_fraction"][e]) : "-", "first_choice_fraction", r.name}});
    }
    o += "<figure>" + bar_chart_svg(c) + "</figure>\n";
    const LineChart steps = expert_load_over_steps(r, l.value("layer", nlohmann::json()), block);
    if (!steps.series.empty()) o += "<figure>" + line_chart_svg(steps) + "</figure>\n";
  }
  o += "</div>\n" + html_table("experts", {"", "admitted fraction", "first-choice fraction"}, rows);
  return o;
}

// One section over all runs from a per-run part; a summary of an unexpected shape (another meshtrain
// version, a hand-edited file) is an input error naming it.
std::string section(const std::vector<RunData>& runs, const std::string& heading, std::string (*part)(const RunData&)) {
  std::string o;
  for (const RunData& r : runs) {
    try {
      o += part(r);
    } catch (const nlohmann::json::exception& e) {
      throw InputError(
          str(r.summary_path, ": unexpected content (", e.what(), "); was it written by meshtrain train --summary?"));
    }
  }
  return o.empty() ? "" : heading + o;
}

std::string configuration(const std::vector<RunData>& runs) {
  std::string o = "<h2 id=\"config\">Resolved configuration</h2>\n";
  for (const RunData& r : runs) {
    o += "<h3>" + html_escape(r.name) + "</h3>\n";
    o += r.config_path.empty()
             ? "<p class=\"note\">No configuration file beside " + html_escape(r.metrics_path) + ".</p>\n"
             : "<p class=\"note\">" + html_escape(r.config_path) + "</p>\n<pre class=\"config\" data-run=\"" +
                   html_escape(r.name) + "\">" + html_escape(r.config_text) + "</pre>\n";
  }
  return o;
}

// Every row of every run, the numbers as the file spells them, folded away by default. Past kMaxTableRows
// rows, every k-th row, every evaluation row and the last (a 100k-step run would otherwise add ~10 MB).
constexpr size_t kMaxTableRows = 5000;

std::string data_tables(const std::vector<RunData>& runs) {
  std::string o = "<h2 id=\"data\">Metrics rows</h2>\n";
  for (const RunData& r : runs) {
    const std::vector<std::string> keys = {
        "step", "loss", "val_loss", rate_key(r), "step_time_s", "comm_bytes", "comm_bytes_total", "lr", "grad_norm"};
    const size_t n = r.rows.size(), stride = (n + kMaxTableRows - 1) / kMaxTableRows;
    std::vector<std::vector<Cell>> rows;
    for (size_t i = 0; i < n; i++) {
      const nlohmann::json& row = r.rows[i];
      if (i % stride != 0 && i + 1 != n && !row.contains("val_loss")) continue;
      std::vector<Cell> cells;
      for (const std::string& k : keys) cells.push_back({json_text(row.value(k, nlohmann::json())), k, r.name});
      rows.push_back(std::move(cells));
    }
    const std::string shown =
        stride == 1 ? "" : str(" (one row in ", stride, ", every evaluation row and the last shown)");
    o += "<details><summary>" + html_escape(r.name) + ": " + std::to_string(n) + " rows" + shown + "</summary>\n" +
         html_table("rows", keys, rows) + "</details>\n";
  }
  return o;
}

}  // namespace

std::string report_html(const std::vector<RunData>& runs) {
  MT_ASSERT(!runs.empty(), "report_html needs at least one run");
  std::string names;
  for (const RunData& r : runs) names += (names.empty() ? "" : ", ") + r.name;
  std::string o = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>meshtrain report: " +
                  html_escape(names) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n";
  o += "<h1>meshtrain report: " + html_escape(names) + "</h1>\n";
  o += "<p class=\"note\"><a href=\"#overview\">runs</a> · <a href=\"#curves\">curves</a> · <a href=\"#memory\">"
       "memory</a> · <a href=\"#pipeline\">pipeline</a> · <a href=\"#experts\">experts</a> · <a href=\"#config\">"
       "configuration</a> · <a href=\"#data\">rows</a></p>\n";
  o += overview(runs) + curves(runs);
  o += section(runs, "<h2 id=\"memory\">Memory per rank (bytes, from --summary)</h2>\n", memory_of);
  o += section(runs, "<h2 id=\"pipeline\">Pipeline</h2>\n", pipeline_of);
  o += section(runs, "<h2 id=\"experts\">Expert load per MoE block (run totals, from --summary)</h2>\n", experts_of);
  o += configuration(runs) + data_tables(runs);
  return o + "</body>\n</html>\n";
}

}  // namespace mt::report
