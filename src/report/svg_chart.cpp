#include "report/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "report/html.h"

namespace mt::report {

namespace {

// Layout in px: the plot area is the box inside the margins; the title and legend sit in the top margin.
constexpr double kW = 560, kH = 300, kLeft = 70, kRight = 16, kTop = 52, kBottom = 44;

// Coordinates with 2 decimals: enough for a 640 px chart, and short.
std::string px(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

std::string text(double x, double y, const std::string& s, const char* anchor = "middle", const char* extra = "") {
  return "<text x=\"" + px(x) + "\" y=\"" + px(y) + "\" text-anchor=\"" + anchor + "\"" + extra + ">" + html_escape(s) +
         "</text>\n";
}

std::string svg_open(const std::string& id, const std::string& kind, double w, double h) {
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"" + kind + "\" data-chart=\"" + html_escape(id) +
         "\" width=\"" + px(w) + "\" height=\"" + px(h) + "\" viewBox=\"0 0 " + px(w) + " " + px(h) +
         "\" font-family=\"sans-serif\" font-size=\"11\">\n";
}

// Legend entries left to right in the top margin, under the title.
std::string legend(const std::vector<std::string>& names) {
  std::string o;
  double x = kLeft;
  for (size_t i = 0; i < names.size(); i++) {
    o += "<rect x=\"" + px(x) + "\" y=\"30\" width=\"12\" height=\"10\" fill=\"" + series_colour(i) + "\"/>";
    o += text(x + 16, 39, names[i], "start");
    x += 28 + 6.5 * names[i].size();
  }
  return o;
}

// Horizontal grid lines and y tick labels; the x axis line at the bottom of the plot.
std::string y_axis(const AxisRange& y, double w, const std::string& label) {
  std::string o;
  const double plot_h = kH - kTop - kBottom;
  const int n = (int)std::llround((y.hi - y.lo) / y.step);
  for (int k = 0; k <= n; k++) {
    const double v = y.lo + k * y.step, py = kH - kBottom - plot_h * k / std::max(n, 1);
    o += "<line x1=\"" + px(kLeft) + "\" x2=\"" + px(w - kRight) + "\" y1=\"" + px(py) + "\" y2=\"" + px(py) +
         "\" stroke=\"#e4e4e4\"/>";
    o += text(kLeft - 6, py + 4, short_number(std::fabs(v) < y.step * 1e-9 ? 0.0 : v), "end");
  }
  o += "<line x1=\"" + px(kLeft) + "\" x2=\"" + px(w - kRight) + "\" y1=\"" + px(kH - kBottom) + "\" y2=\"" +
       px(kH - kBottom) + "\" stroke=\"#444\"/>";
  o += text(14, kTop + plot_h / 2, label, "middle",
            (" transform=\"rotate(-90 14 " + px(kTop + plot_h / 2) + ")\"").c_str());
  return o;
}

}  // namespace

const std::string& series_colour(size_t i) {
  static const std::string kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                         "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  return kPalette[i % 8];
}

AxisRange nice_range(double lo, double hi, int ticks) {
  if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi) return {};
  if (lo == hi) {  // one value: a span around it, so the point sits mid-plot
    const double pad = lo == 0 ? 1.0 : std::fabs(lo) / 3;
    lo -= pad, hi += pad;
  }
  const double raw = (hi - lo) / std::max(ticks, 1), mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * mag;
  for (double f : {1.0, 2.0, 5.0})
    if (f * mag >= raw) {
      step = f * mag;
      break;
    }
  // A small tolerance: 0.30000000000000004 / 0.1 should not round up to a new tick.
  const double a = std::floor(lo / step + 1e-9) * step, b = std::ceil(hi / step - 1e-9) * step;
  return {a, b, step};
}

std::string line_chart_svg(const LineChart& c) {
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const Series& s : c.series)
    for (auto [x, y] : s.points)
      if (std::isfinite(x) && std::isfinite(y))
        x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
  const bool empty = !(x0 <= x1);
  if (c.y_from_zero && !empty) y0 = std::min(y0, 0.0);
  const AxisRange xr = empty ? AxisRange{} : nice_range(x0, x1, 6), yr = empty ? AxisRange{} : nice_range(y0, y1);
  const double plot_w = kW - kLeft - kRight, plot_h = kH - kTop - kBottom;
  auto X = [&](double x) { return kLeft + plot_w * (x - xr.lo) / (xr.hi - xr.lo); };
  auto Y = [&](double y) { return kH - kBottom - plot_h * (y - yr.lo) / (yr.hi - yr.lo); };

  std::string o = svg_open(c.id, "chart line-chart", kW, kH);
  o += text(kLeft, 16, c.title, "start", " font-weight=\"bold\" font-size=\"13\"");
  std::vector<std::string> names;
  for (const Series& s : c.series) names.push_back(s.name);
  o += legend(names) + y_axis(yr, kW, c.y_label);
  for (double v = xr.lo; v <= xr.hi + xr.step * 1e-6; v += xr.step) o += text(X(v), kH - kBottom + 16, short_number(v));
  o += text(kLeft + plot_w / 2, kH - 6, c.x_label);
  if (empty)
    return o + text(kLeft + plot_w / 2, kTop + plot_h / 2, "no data", "middle", " class=\"no-data\"") + "</svg>\n";
  for (size_t i = 0; i < c.series.size(); i++) {
    const Series& s = c.series[i];
    const std::string run = html_escape(s.name), colour = series_colour(i);
    const size_t n = std::count_if(s.points.begin(), s.points.end(),
                                   [](auto p) { return std::isfinite(p.first) && std::isfinite(p.second); });
    const char* radius = n > 200 ? "1.5" : "3";                                // dots shrink as they crowd
    const size_t stride = (n + kMaxDots - 1) / std::max<size_t>(kMaxDots, 1);  // 1 up to kMaxDots points
    std::string d, dots;
    size_t k = 0;
    for (auto [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      d += (d.empty() ? "M" : " L") + px(X(x)) + " " + px(Y(y));
      if (k++ % stride != 0 && k != n) continue;
      dots += "<circle class=\"pt\" data-run=\"" + run + "\" cx=\"" + px(X(x)) + "\" cy=\"" + px(Y(y)) + "\" r=\"" +
              radius + "\" fill=\"" + colour + "\"><title>" + run + ": x " + short_number(x, 8) + ", y " +
              short_number(y, 8) + "</title></circle>\n";
    }
    // Dashes tell apart runs whose curves coincide (layouts that agree to float32 rounding draw one line).
    static const char* const kDash[] = {"", " stroke-dasharray=\"7 4\"", " stroke-dasharray=\"2 3\"",
                                        " stroke-dasharray=\"9 3 2 3\""};
    if (!d.empty())
      o += "<path class=\"line\" data-run=\"" + run + "\" d=\"" + d + "\" fill=\"none\" stroke=\"" + colour +
           "\" stroke-width=\"1.5\"" + kDash[i % 4] + "/>\n";
    o += dots;
  }
  return o + "</svg>\n";
}

std::string bar_chart_svg(const BarChart& c) {
  const size_t G = c.groups.size(), S = c.series.size();
  const double bar_w = 14, group_gap = 18;
  const double w = std::clamp(kLeft + kRight + G * (S * bar_w + group_gap), kW, 1600.0);
  double hi = 0;
  bool any = false;
  for (const auto& g : c.values)
    for (double v : g)
      if (std::isfinite(v)) hi = std::max(hi, v), any = true;
  const AxisRange yr = nice_range(0, hi > 0 ? hi : 1);
  const double plot_w = w - kLeft - kRight, plot_h = kH - kTop - kBottom;
  const double group_w = G ? plot_w / G : plot_w,
               bw = std::min(bar_w * 2, (group_w - group_gap) / std::max<size_t>(S, 1));

  std::string o = svg_open(c.id, "chart bar-chart", w, kH);
  o += text(kLeft, 16, c.title, "start", " font-weight=\"bold\" font-size=\"13\"");
  o += legend(c.series) + y_axis(yr, w, c.y_label);
  if (!any)
    return o + text(kLeft + plot_w / 2, kTop + plot_h / 2, "no data", "middle", " class=\"no-data\"") + "</svg>\n";
  for (size_t g = 0; g < G; g++) {
    const double gx = kLeft + g * group_w + (group_w - bw * S) / 2;
    o += text(kLeft + (g + 0.5) * group_w, kH - kBottom + 16, c.groups[g]);
    for (size_t s = 0; s < S && g < c.values.size() && s < c.values[g].size(); s++) {
      const double v = c.values[g][s];
      if (!std::isfinite(v)) continue;
      const double h = plot_h * std::max(v, 0.0) / (yr.hi - yr.lo);
      o += "<rect class=\"bar\" x=\"" + px(gx + s * bw) + "\" y=\"" + px(kH - kBottom - h) + "\" width=\"" +
           px(bw - 1) + "\" height=\"" + px(h) + "\" fill=\"" + series_colour(s) + "\"><title>" +
           html_escape(c.groups[g] + ", " + c.series[s] + ": ") + short_number(v, 8) + "</title></rect>\n";
    }
  }
  return o + "</svg>\n";
}

}  // namespace mt::report
