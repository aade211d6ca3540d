// Swimlane diagrams as SVG: one horizontal lane per rank (or stage), boxes on a shared time axis, idle time
// drawn as a hatched background, so a pipeline bubble is visible at a glance. The writer knows nothing of
// pipelines: callers fill Swimlane (plan/sim_swimlane.h from a simulated schedule; a real run's measured
// events could fill it the same way). Plain SVG 1.1, no script, no external fonts: any browser, rsvg or
// ImageMagick renders it; hovering a box shows its tooltip.
#pragma once

#include <string>
#include <vector>

namespace mt::trace {

struct SwimlaneBox {
  double start = 0, end = 0;    // in the diagram's time unit
  std::string fill = "#4a90d9";  // "#rrggbb"; the label is drawn black or white, whichever reads better
  std::string label;            // drawn inside the box when it fits
  std::string tooltip;          // shown on hover
};

struct SwimlaneLane {
  std::string name;  // drawn left of the lane
  std::vector<SwimlaneBox> boxes;
};

struct SwimlaneLegendEntry {
  std::string fill;  // "#rrggbb"
  std::string text;
};

struct Swimlane {
  std::string title;     // first line, bold
  std::string subtitle;  // second line
  std::string time_label = "time";
  std::vector<SwimlaneLane> lanes;
  std::vector<SwimlaneLegendEntry> legend;  // an "idle" entry for the hatching is always added
  double end_time = 0;                      // right end of the axis; 0: the latest box end
};

// The whole document, starting with the XML declaration. Text is escaped; sizes adapt to the number of
// lanes and the time span: 36 px per time unit, or enough for the shortest box to get 30 px, within a
// plot 720 to 2400 px wide.
std::string swimlane_svg(const Swimlane& diagram);

}  // namespace mt::trace
