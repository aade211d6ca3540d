#include "trace/swimlane_svg.h"

#include <cmath>
#include <cstdio>

namespace mt::trace {

std::string swimlane_svg(const plan::Simulation& sim, const std::string& title, bool show_chunks) {
  const double left = 70, top = 40, lane = 34, width = 900, bottom = 40;
  const double scale = sim.makespan > 0 ? width / sim.makespan : 1;
  const double height = top + lane * sim.ranks + bottom;
  char buf[512];
  std::string s;
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                left + width + 20, height);
  s += buf;
  std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"22\" font-size=\"14\">%s</text>\n", left, title.c_str());
  s += buf;
  for (int j = 0; j < sim.ranks; j++) {
    double y = top + j * lane;
    std::snprintf(buf, sizeof buf,
                  "<text x=\"8\" y=\"%.1f\">rank %d</text>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                  "fill=\"none\" stroke=\"#ccc\"/>\n",
                  y + lane / 2 + 4, j, left, y + 2, width, lane - 4);
    s += buf;
  }
  for (const plan::Box& b : sim.boxes) {
    double x = left + b.start * scale, w = (b.end - b.start) * scale, y = top + b.rank * lane + 4;
    bool fwd = b.kind == pipeline::ActionKind::forward;
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" stroke=\"white\"/>\n", x, y,
                  w, lane - 8, fwd ? "#4C78A8" : "#F58518");
    s += buf;
    if (w >= 12) {
      std::string label = std::to_string(b.micro_batch);
      if (show_chunks) label += "." + std::to_string(b.chunk);
      std::snprintf(buf, sizeof buf, "<text x=\"%.2f\" y=\"%.1f\" fill=\"white\" text-anchor=\"middle\">%s</text>\n",
                    x + w / 2, y + (lane - 8) / 2 + 4, label.c_str());
      s += buf;
    }
  }
  // Time axis: about ten ticks at a round step.
  double step = std::pow(10.0, std::floor(std::log10(std::max(sim.makespan, 1e-9) / 10)));
  if (sim.makespan / step > 20) step *= 2;
  if (sim.makespan / step > 20) step *= 2.5;
  double axis_y = top + lane * sim.ranks + 6;
  for (double t = 0; t <= sim.makespan + 1e-9; t += step) {
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888\"/>\n"
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#555\">%g</text>\n",
                  left + t * scale, axis_y, left + t * scale, axis_y + 5, left + t * scale, axis_y + 18, t);
    s += buf;
  }
  s += "</svg>\n";
  return s;
}

}  // namespace mt::trace
