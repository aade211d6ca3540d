#include "report/html.h"

#include <cmath>
#include <cstdio>

namespace mt::report {

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

std::string json_text(const nlohmann::json& v) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

std::string short_number(double x, int digits) {
  if (!std::isfinite(x)) return std::isnan(x) ? "NaN" : (x > 0 ? "inf" : "-inf");
  const double a = std::fabs(x);
  const char* suffix = "";
  if (a >= 1e12)
    x /= 1e12, suffix = "T";
  else if (a >= 1e9)
    x /= 1e9, suffix = "G";
  else if (a >= 1e6)
    x /= 1e6, suffix = "M";
  else if (a >= 1e4)
    x /= 1e3, suffix = "k";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g%s", digits, x, suffix);
  return buf;
}

std::string html_table(const std::string& css_class, const std::vector<std::string>& header,
                       const std::vector<std::vector<Cell>>& rows) {
  std::string o = "<table class=\"" + html_escape(css_class) + "\">\n<thead><tr>";
  for (const std::string& h : header) o += "<th>" + html_escape(h) + "</th>";
  o += "</tr></thead>\n<tbody>\n";
  for (const auto& row : rows) {
    o += "<tr>";
    for (size_t i = 0; i < row.size(); i++) {
      const Cell& c = row[i];
      const char* tag = i == 0 ? "th" : "td";
      o += std::string("<") + tag;
      if (!c.key.empty()) o += " data-key=\"" + html_escape(c.key) + "\"";
      if (!c.run.empty()) o += " data-run=\"" + html_escape(c.run) + "\"";
      o += ">" + html_escape(c.text) + "</" + tag + ">";
    }
    o += "</tr>\n";
  }
  return o + "</tbody></table>\n";
}

}  // namespace mt::report
