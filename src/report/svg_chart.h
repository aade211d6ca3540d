// Charts as inline SVG for the HTML report: line charts (one polyline plus one dot per data point per series,
// so a reader can hover a point and a test can count them) and grouped bar charts. The output is an <svg>
// element without an XML declaration, to sit inside HTML; text is escaped; no script, no external fonts.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace mt::report {

// The colour of series i: a fixed palette of 8 distinguishable colours, repeating.
const std::string& series_colour(size_t i);

// An axis from lo to hi in steps of `step`: [lo, hi] covers the data, lo and hi are multiples of step, and step
// is 1, 2 or 5 times a power of ten giving about `ticks` intervals. Empty or non-finite data gives [0, 1];
// a single value v gives a range around it (v = 3: [2, 4] in steps of 0.5; v = 0: [-1, 1]).
struct AxisRange {
  double lo = 0, hi = 1, step = 0.2;
};
AxisRange nice_range(double lo, double hi, int ticks = 5);

struct Series {
  std::string name;                               // legend text; also the points' data-run attribute
  std::vector<std::pair<double, double>> points;  // (x, y); non-finite y values are left out of the drawing
};

struct LineChart {
  std::string id;  // data-chart attribute: "loss", "val_loss", ...
  std::string title, x_label, y_label;
  std::vector<Series> series;
  bool y_from_zero = false;  // bytes, throughput: the axis starts at 0
};

// 560 x 300 px (two side by side on a 1200 px page). A chart whose series hold no finite point says "no data"
// and draws no dots. Each dot is a <circle class="pt" data-run="NAME"> holding a <title> "NAME: x X, y Y".
// The line goes through every finite point; dots are drawn for all of them up to kMaxDots, beyond that for
// every k-th (k = ceil(n / kMaxDots)) and the last, so a 100k-step run gives a page of a few MB, not 60.
constexpr size_t kMaxDots = 2000;
std::string line_chart_svg(const LineChart& chart);

struct BarChart {
  std::string id;
  std::string title, y_label;
  std::vector<std::string> series;          // bar kinds within a group, in the legend
  std::vector<std::string> groups;          // x-axis categories (ranks, experts)
  std::vector<std::vector<double>> values;  // [group][series]
};

// One <rect class="bar"> per (group, series) value, with a <title> "GROUP, SERIES: VALUE"; width adapts to the
// number of bars (560 to 1600 px).
std::string bar_chart_svg(const BarChart& chart);

}  // namespace mt::report
