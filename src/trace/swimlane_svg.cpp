#include "trace/swimlane_svg.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace mt::trace {

namespace {

// Layout in px. Character widths are estimates for a sans-serif font; they only decide whether a label fits.
constexpr double kCharW11 = 6.5;  // at font-size 11
constexpr double kLaneH = 28, kLaneGap = 8, kTop = 84, kRightMargin = 24;

std::string esc(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += ch;
    }
  }
  return out;
}

// Up to 3 decimals, trailing zeros dropped: 12, 4.5, 0.333.
std::string num(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", x);
  std::string s = buf;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s == "-0" ? "0" : s;
}

// A valid "#rrggbb", or a neutral grey: the fill goes into an attribute, so it must not carry markup.
std::string safe_fill(const std::string& fill) {
  bool ok = fill.size() == 7 && fill[0] == '#' &&
            std::all_of(fill.begin() + 1, fill.end(), [](char ch) { return std::isxdigit((unsigned char)ch); });
  return ok ? fill : "#999999";
}

// Black text on light fills, white on dark ones (relative luminance of sRGB, roughly).
const char* text_colour(const std::string& fill) {
  long rgb = std::strtol(fill.c_str() + 1, nullptr, 16);
  double r = (rgb >> 16) & 255, g = (rgb >> 8) & 255, b = rgb & 255;
  return 0.2126 * r + 0.7152 * g + 0.0722 * b > 140 ? "#111111" : "#ffffff";
}

// A 1-2-5 step giving about 10 ticks over [0, span].
double tick_step(double span) {
  double raw = span / 10, mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0, 10.0})
    if (f * mag >= raw) return f * mag;
  return 10 * mag;
}

}  // namespace

std::string swimlane_svg(const Swimlane& d) {
  double t_end = d.end_time, shortest = 0;
  for (const SwimlaneLane& lane : d.lanes) {
    for (const SwimlaneBox& b : lane.boxes) {
      t_end = std::max(t_end, b.end);
      if (b.end > b.start && (shortest == 0 || b.end - b.start < shortest)) shortest = b.end - b.start;
    }
  }
  if (!(t_end > 0)) t_end = 1;
  // 36 px per time unit, more if the shortest box would get less than 30 px (room for "12c3").
  const double px_per_unit = shortest > 0 ? std::max(36.0, 30.0 / shortest) : 36.0;

  size_t name_chars = 4;
  for (const SwimlaneLane& lane : d.lanes) name_chars = std::max(name_chars, lane.name.size());
  const double left = 16 + name_chars * kCharW11;
  const double plot_w = std::clamp(t_end * px_per_unit, 720.0, 2400.0), scale = plot_w / t_end;
  const double lanes_h = d.lanes.size() * (kLaneH + kLaneGap);
  const double axis_y = kTop + lanes_h;
  const double width = left + plot_w + kRightMargin, height = axis_y + 52;
  auto x_of = [&](double t) { return left + t * scale; };

  std::string o;
  o += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(width) + "\" height=\"" + num(height) +
       "\" viewBox=\"0 0 " + num(width) + " " + num(height) + "\" font-family=\"DejaVu Sans, Arial, sans-serif\">\n";
  o += "<defs><pattern id=\"idle\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
       "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#f3f3f3\"/>"
       "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#d0d0d0\" stroke-width=\"2\"/></pattern></defs>\n";
  o += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  o += "<text x=\"" + num(left) + "\" y=\"24\" font-size=\"16\" font-weight=\"bold\">" + esc(d.title) + "</text>\n";
  o += "<text x=\"" + num(left) + "\" y=\"44\" font-size=\"12\" fill=\"#333333\">" + esc(d.subtitle) + "</text>\n";

  // Legend: swatches in a row, the idle hatching last.
  std::vector<SwimlaneLegendEntry> legend = d.legend;
  legend.push_back({"url(#idle)", "idle"});
  double lx = left;
  for (const SwimlaneLegendEntry& e : legend) {
    const std::string fill = e.fill == "url(#idle)" ? e.fill : safe_fill(e.fill);
    o += "<rect x=\"" + num(lx) + "\" y=\"56\" width=\"14\" height=\"12\" fill=\"" + fill +
         "\" stroke=\"#888888\" stroke-width=\"0.5\"/>";
    o += "<text x=\"" + num(lx + 19) + "\" y=\"66\" font-size=\"11\">" + esc(e.text) + "</text>\n";
    lx += 19 + e.text.size() * kCharW11 + 18;
  }

  // Lanes: name, idle background over the whole span.
  for (size_t n = 0; n < d.lanes.size(); n++) {
    const double y = kTop + n * (kLaneH + kLaneGap);
    o += "<text x=\"" + num(left - 8) + "\" y=\"" + num(y + kLaneH / 2 + 4) +
         "\" font-size=\"11\" text-anchor=\"end\">" + esc(d.lanes[n].name) + "</text>";
    o += "<rect x=\"" + num(left) + "\" y=\"" + num(y) + "\" width=\"" + num(plot_w) + "\" height=\"" + num(kLaneH) +
         "\" fill=\"url(#idle)\"/>\n";
  }

  // Time axis with a faint grid through the lanes.
  const double step = tick_step(t_end);
  o += "<line x1=\"" + num(left) + "\" y1=\"" + num(axis_y) + "\" x2=\"" + num(left + plot_w) + "\" y2=\"" +
       num(axis_y) + "\" stroke=\"#333333\"/>\n";
  for (int n = 0; n * step <= t_end * (1 + 1e-9); n++) {
    const double x = x_of(n * step);
    o += "<line x1=\"" + num(x) + "\" y1=\"" + num(kTop - 4) + "\" x2=\"" + num(x) + "\" y2=\"" + num(axis_y) +
         "\" stroke=\"#000000\" stroke-opacity=\"0.12\"/>";
    o += "<line x1=\"" + num(x) + "\" y1=\"" + num(axis_y) + "\" x2=\"" + num(x) + "\" y2=\"" + num(axis_y + 5) +
         "\" stroke=\"#333333\"/>";
    o += "<text x=\"" + num(x) + "\" y=\"" + num(axis_y + 17) + "\" font-size=\"10\" text-anchor=\"middle\">" +
         num(n * step) + "</text>\n";
  }
  o += "<text x=\"" + num(left + plot_w / 2) + "\" y=\"" + num(axis_y + 38) +
       "\" font-size=\"11\" text-anchor=\"middle\">" + esc(d.time_label) + "</text>\n";

  // Boxes, drawn over the idle background; a thin white edge keeps neighbours apart.
  for (size_t n = 0; n < d.lanes.size(); n++) {
    const double y = kTop + n * (kLaneH + kLaneGap);
    for (const SwimlaneBox& b : d.lanes[n].boxes) {
      const double x0 = x_of(b.start), w = std::max(0.0, (b.end - b.start) * scale);
      const std::string fill = safe_fill(b.fill);
      o += "<g>";
      if (!b.tooltip.empty()) o += "<title>" + esc(b.tooltip) + "</title>";
      o += "<rect x=\"" + num(x0) + "\" y=\"" + num(y) + "\" width=\"" + num(w) + "\" height=\"" + num(kLaneH) +
           "\" fill=\"" + fill + "\" stroke=\"#ffffff\" stroke-width=\"1\"/>";
      if (!b.label.empty() && b.label.size() * kCharW11 + 4 <= w)
        o += "<text x=\"" + num(x0 + w / 2) + "\" y=\"" + num(y + kLaneH / 2 + 4) +
             "\" font-size=\"11\" text-anchor=\"middle\" fill=\"" + text_colour(fill) + "\">" + esc(b.label) +
             "</text>";
      o += "</g>\n";
    }
  }
  o += "</svg>\n";
  return o;
}

}  // namespace mt::trace
