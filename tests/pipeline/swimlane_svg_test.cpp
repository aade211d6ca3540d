// The swimlane SVG writer (trace/swimlane_svg.h) and the simulated pipeline drawn with it
// (plan/sim_swimlane.h): a well-formed document, one box per computation at the right place, labels,
// colours by direction, the title's figures, escaped text.
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "plan/sim_swimlane.h"
#include "plan/simulator.h"
#include "trace/swimlane_svg.h"

namespace {

using mt::trace::Swimlane;

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) n++;
  return n;
}

// Elements open and close in nesting order; every attribute value is quoted; no raw '&' outside entities.
// Not a full XML parser, enough to catch a writer that forgets to close or escape something.
::testing::AssertionResult well_formed(const std::string& doc) {
  if (doc.rfind("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) != 0)
    return ::testing::AssertionFailure() << "does not start with the XML declaration and <svg xmlns=...>";
  std::vector<std::string> open;
  const std::regex tag(R"(<(/?)([a-zA-Z]+)((?:\s+[a-zA-Z][a-zA-Z0-9-]*="[^"<]*")*)\s*(/?)>)");
  size_t pos = doc.find("<svg");
  while (pos < doc.size()) {
    const size_t lt = doc.find('<', pos);
    const std::string text = doc.substr(pos, lt == std::string::npos ? std::string::npos : lt - pos);
    for (size_t a = text.find('&'); a != std::string::npos; a = text.find('&', a + 1))
      if (!std::regex_search(text.substr(a), std::regex("^&(amp|lt|gt|quot|apos);")))
        return ::testing::AssertionFailure() << "raw & in text: " << text;
    if (lt == std::string::npos) break;
    std::smatch mm;
    const std::string rest = doc.substr(lt, 2000);
    if (!std::regex_search(rest, mm, tag, std::regex_constants::match_continuous))
      return ::testing::AssertionFailure() << "bad tag at " << lt << ": " << rest.substr(0, 80);
    if (mm[1] == "/") {
      if (open.empty() || open.back() != mm[2])
        return ::testing::AssertionFailure() << "</" << mm[2] << "> closes " << (open.empty() ? "nothing" : open.back());
      open.pop_back();
    } else if (mm[4] != "/") {
      open.push_back(mm[2]);
    }
    pos = lt + mm.length(0);
  }
  if (!open.empty()) return ::testing::AssertionFailure() << "<" << open.back() << "> never closed";
  return ::testing::AssertionSuccess();
}

TEST(SwimlaneSvg, GenericDiagram) {
  Swimlane d;
  d.title = "a <b> & \"c\"";
  d.subtitle = "sub";
  d.lanes = {{"lane A", {{0, 2, "#000000", "x", "tip <1>"}, {3, 4, "#ffffff", "y", ""}}}, {"lane B", {}}};
  d.legend = {{"#123456", "thing"}};
  const std::string svg = mt::trace::swimlane_svg(d);
  EXPECT_TRUE(well_formed(svg)) << svg;
  EXPECT_NE(svg.find("a &lt;b&gt; &amp; &quot;c&quot;"), std::string::npos);
  EXPECT_NE(svg.find("<title>tip &lt;1&gt;</title>"), std::string::npos);
  EXPECT_NE(svg.find(">lane A</text>"), std::string::npos);
  EXPECT_NE(svg.find(">lane B</text>"), std::string::npos);
  EXPECT_NE(svg.find(">thing</text>"), std::string::npos);
  EXPECT_NE(svg.find(">idle</text>"), std::string::npos);  // the hatching is explained
  EXPECT_EQ(count(svg, "fill=\"url(#idle)\""), 2u + 1u);    // one per lane, one legend swatch
  // Labels contrast with their box: white on black, black on white.
  EXPECT_NE(svg.find("fill=\"#ffffff\">x</text>"), std::string::npos) << svg;
  EXPECT_NE(svg.find("fill=\"#111111\">y</text>"), std::string::npos) << svg;
  // A fill that is not #rrggbb never reaches the document.
  d.lanes[0].boxes[0].fill = "red\" onload=\"x";
  EXPECT_EQ(mt::trace::swimlane_svg(d).find("onload"), std::string::npos);
}

TEST(SwimlaneSvg, GpipeFourStagesFourMicroBatches) {
  const mt::pipeline::ScheduleSpec spec{"gpipe", 4, 4, 1};
  const mt::plan::CostModel cost;
  const mt::plan::SimResult r = mt::plan::simulate(spec, cost);
  const std::string svg = mt::trace::swimlane_svg(mt::plan::swimlane_of(spec, cost, r));
  EXPECT_TRUE(well_formed(svg));
  EXPECT_NE(svg.find("gpipe schedule: p = 4 stages, m = 4 micro-batches  -  utilization 57.1%"), std::string::npos);
  EXPECT_NE(svg.find("bubble 42.9% (ideal (p-1)/(m+p-1) = 42.9%); busy 48 of 84"), std::string::npos);
  for (int j = 0; j < 4; j++) EXPECT_NE(svg.find(">rank " + std::to_string(j) + "</text>"), std::string::npos);
  // 4 ranks x 4 micro-batches x (forward, backward) boxes, each in its own group with a tooltip.
  EXPECT_EQ(count(svg, "<g><title>"), 32u);
  EXPECT_EQ(count(svg, "fill=\"#2b6cb0\" stroke=\"#ffffff\""), 16u);  // forwards
  EXPECT_EQ(count(svg, "fill=\"#b7521b\" stroke=\"#ffffff\""), 16u);  // backwards
  EXPECT_EQ(count(svg, ">3</text>"), 8u);                 // micro-batch 3: one forward, one backward per rank
  EXPECT_NE(svg.find("<title>rank 3: backward of micro-batch 0 (stage 3), 7 to 9</title>"), std::string::npos);
  // 21 time units at 36 px from x = 16 + 6 * 6.5 = 55: rank 0's last backward ends at the right edge.
  EXPECT_NE(svg.find("<rect x=\"739\" y=\"84\" width=\"72\" height=\"28\" fill=\"#b7521b\""), std::string::npos);
}

TEST(SwimlaneSvg, InterleavedLabelsCarryTheChunk) {
  const mt::pipeline::ScheduleSpec spec{"interleaved", 2, 2, 2};
  const mt::plan::CostModel cost;
  const std::string svg =
      mt::trace::swimlane_svg(mt::plan::swimlane_of(spec, cost, mt::plan::simulate(spec, cost)));
  EXPECT_TRUE(well_formed(svg));
  EXPECT_NE(svg.find("V = 2 chunks per rank"), std::string::npos);
  EXPECT_NE(svg.find(">rank 1 (stages 1,3)</text>"), std::string::npos);
  EXPECT_NE(svg.find(">1c1</text>"), std::string::npos);
  EXPECT_NE(svg.find(">forward, chunk 1</text>"), std::string::npos);
  EXPECT_EQ(count(svg, "<g><title>"), 2u * 2 * 2 * 2);
}

}  // namespace
