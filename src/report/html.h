// Small pieces of HTML text shared by the report's writers: escaping, numbers as text, and tables whose
// cells carry their key and run, so a reader (or a browser test) finds a number without parsing prose.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mt::report {

// Text for element content and attribute values: & < > " ' become entities. Bytes >= 0x80 pass through (the
// page is UTF-8).
std::string html_escape(const std::string& s);

// A JSON value as the metrics file spells it: numbers in nlohmann's shortest round-trip form (so the page
// shows exactly the file's value), strings unquoted, null as "-".
std::string json_text(const nlohmann::json& v);

// Up to `digits` significant digits, for axis labels and tooltips: 1.5e+06 -> "1.5M", 0.00012 -> "0.00012".
std::string short_number(double x, int digits = 4);

// A table: header row, then rows; every body cell is {text, key}. key (may be empty) goes into data-key so
// tests can find "final_loss" of run "dp2" as td[data-key=final_loss][data-run=dp2].
struct Cell {
  std::string text;
  std::string key;
  std::string run;
};
std::string html_table(const std::string& css_class, const std::vector<std::string>& header,
                       const std::vector<std::vector<Cell>>& rows);

}  // namespace mt::report
