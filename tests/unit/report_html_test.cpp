// report/html.h, report/svg_chart.h, report/pipeline_view.h: the pieces of meshtrain report's page.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "report/html.h"
#include "report/pipeline_view.h"
#include "report/svg_chart.h"

namespace {

using namespace mt::report;

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) n++;
  return n;
}

TEST(ReportHtml, EscapesMarkupAndQuotes) {
  EXPECT_EQ(html_escape("<a href=\"x\">&'</a> é"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt; é");
  EXPECT_EQ(html_escape(""), "");
}

TEST(ReportHtml, JsonTextIsTheFilesSpelling) {
  EXPECT_EQ(json_text(nlohmann::json::parse("5.483323097229004")), "5.483323097229004");
  EXPECT_EQ(json_text(0.1), "0.1");
  EXPECT_EQ(json_text(832512), "832512");
  EXPECT_EQ(json_text(nullptr), "-");
  EXPECT_EQ(json_text("1f1b"), "1f1b");
}

TEST(ReportHtml, ShortNumbers) {
  EXPECT_EQ(short_number(1.5e6), "1.5M");
  EXPECT_EQ(short_number(20000), "20k");
  EXPECT_EQ(short_number(0.00012), "0.00012");
  EXPECT_EQ(short_number(5.46), "5.46");
  EXPECT_EQ(short_number(NAN), "NaN");
}

TEST(ReportHtml, TableCellsCarryKeyAndRun) {
  const std::string t = html_table("x", {"", "a<b"}, {{{"final loss", "", ""}, {"5.5", "final_loss", "r\"1"}}});
  EXPECT_NE(t.find("<th>a&lt;b</th>"), std::string::npos) << t;
  EXPECT_NE(t.find("<th>final loss</th><td data-key=\"final_loss\" data-run=\"r&quot;1\">5.5</td>"), std::string::npos)
      << t;
}

TEST(ReportAxis, NiceRangesCoverTheDataInOneTwoFiveSteps) {
  AxisRange r = nice_range(0, 5.3);  // 5.3 / 5 = 1.06: the next 1-2-5 step is 2
  EXPECT_DOUBLE_EQ(r.lo, 0);
  EXPECT_DOUBLE_EQ(r.hi, 6);
  EXPECT_DOUBLE_EQ(r.step, 2);
  r = nice_range(5.46, 5.551);  // a loss curve: steps of 0.02, ends on multiples of it
  EXPECT_NEAR(r.step, 0.02, 1e-15);
  EXPECT_NEAR(r.lo, 5.46, 1e-12);
  EXPECT_NEAR(r.hi, 5.56, 1e-12);
  r = nice_range(0, 832512);
  EXPECT_DOUBLE_EQ(r.step, 200000);
  EXPECT_DOUBLE_EQ(r.hi, 1e6);
  r = nice_range(3, 3);  // one value: a span around it
  EXPECT_DOUBLE_EQ(r.lo, 2);
  EXPECT_DOUBLE_EQ(r.hi, 4);
  EXPECT_DOUBLE_EQ(r.step, 0.5);
  r = nice_range(0, 0);
  EXPECT_DOUBLE_EQ(r.lo, -1);
  EXPECT_DOUBLE_EQ(r.hi, 1);
  r = nice_range(NAN, 1);  // no usable data
  EXPECT_DOUBLE_EQ(r.lo, 0);
  EXPECT_DOUBLE_EQ(r.hi, 1);
}

TEST(ReportLineChart, OneDotPerFinitePointPerSeries) {
  LineChart c{"loss", "Loss", "step", "loss", {}, false};
  c.series.push_back({"a<1>", {{0, 5.5}, {1, 5.4}, {2, NAN}, {3, 5.2}}});
  c.series.push_back({"b", {{0, 5.6}, {1, INFINITY}}});
  const std::string svg = line_chart_svg(c);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u) << "no XML declaration inside HTML";
  EXPECT_EQ(count(svg, "<circle class=\"pt\" data-run=\"a&lt;1&gt;\""), 3u);
  EXPECT_EQ(count(svg, "<circle class=\"pt\" data-run=\"b\""), 1u);
  EXPECT_EQ(count(svg, "<path class=\"line\""), 2u);
  EXPECT_EQ(svg.find("no data"), std::string::npos);
  EXPECT_NE(svg.find("data-chart=\"loss\""), std::string::npos);
}

TEST(ReportLineChart, LongSeriesGetEveryKthDotAndTheLast) {
  LineChart c{"loss", "Loss", "step", "loss", {{"a", {}}, {"b", {}}}, false};
  for (int i = 0; i < 5000; i++) c.series[0].points.push_back({(double)i, 1.0 / (i + 1)});
  for (int i = 0; i < (int)kMaxDots; i++) c.series[1].points.push_back({(double)i, 2.0});
  const std::string svg = line_chart_svg(c);
  // 5000 points: k = 3, dots at 0, 3, ..., 4998 (1667) and the last, 4999.
  EXPECT_EQ(count(svg, "<circle class=\"pt\" data-run=\"a\""), 1668u);
  EXPECT_NE(svg.find("<title>a: x 4999,"), std::string::npos);
  EXPECT_EQ(count(svg, "<circle class=\"pt\" data-run=\"b\""), kMaxDots);  // up to kMaxDots: every point
  EXPECT_EQ(count(svg, " L"), 4999u + kMaxDots - 1);                       // the lines go through every point
}

TEST(ReportLineChart, EmptySeriesSayNoData) {
  LineChart c{"val_loss", "Validation", "step", "loss", {{"a", {}}, {"b", {{1, NAN}}}}, false};
  const std::string svg = line_chart_svg(c);
  EXPECT_NE(svg.find("class=\"no-data\""), std::string::npos);
  EXPECT_EQ(count(svg, "<circle"), 0u);
  EXPECT_EQ(count(svg, "<path"), 0u);
}

TEST(ReportLineChart, PointsLandInsideThePlot) {
  // y from 10 to 20: the axis is [10, 20]; the first point is on the bottom line (y = 300 - 44), the last
  // on the top (52); x 0 at the left edge (70), x 4 at the right (560 - 16).
  LineChart c{"t", "t", "x", "y", {{"s", {{0, 10}, {4, 20}}}}, false};
  const std::string svg = line_chart_svg(c);
  EXPECT_NE(svg.find("cx=\"70.00\" cy=\"256.00\""), std::string::npos) << svg;
  EXPECT_NE(svg.find("cx=\"544.00\" cy=\"52.00\""), std::string::npos) << svg;
}

TEST(ReportBarChart, OneBarPerValue) {
  BarChart c{"memory", "Memory", "MiB", {"params", "grads", "rss"}, {"rank 0", "rank 1"}, {{1, 2, 3}, {4, NAN, 6}}};
  const std::string svg = bar_chart_svg(c);
  EXPECT_EQ(count(svg, "<rect class=\"bar\""), 5u);
  EXPECT_NE(svg.find("<title>rank 1, rss: 6</title>"), std::string::npos) << svg;
  BarChart empty{"e", "E", "", {"a"}, {}, {}};
  EXPECT_NE(bar_chart_svg(empty).find("no data"), std::string::npos);
}

TEST(ReportSwimlane, MeasuredTakesEachRanksLastStep) {
  // Two ranks, two steps each: only the events after the first "optimizer step" of each rank are drawn,
  // in ms from the earliest of them (rank 1's F0 at 2000 us).
  auto ev = [](int pid, int tid, const char* name, const char* cat, double ts, double dur) {
    return nlohmann::json{{"ph", "X"},  {"pid", pid}, {"tid", tid}, {"name", name},
                          {"cat", cat}, {"ts", ts},   {"dur", dur}};
  };
  nlohmann::json t = {{"traceEvents",
                       {ev(0, 0, "F0", "forward", 0, 100),
                        ev(0, 0, "optimizer step", "compute", 200, 50),
                        ev(1, 0, "F0", "forward", 100, 100),
                        ev(1, 0, "optimizer step", "compute", 300, 50),
                        ev(0, 0, "F0", "forward", 2500, 500),
                        ev(0, 0, "B0", "backward", 3000, 1000),
                        ev(0, 2, "send activation", "p2p", 2900, 10),
                        ev(0, 0, "optimizer step", "compute", 4000, 100),
                        ev(1, 0, "F0", "forward", 2000, 100),
                        ev(1, 0, "optimizer step", "compute", 4000, 100),
                        {{"ph", "M"}, {"pid", 0}, {"tid", 0}, {"name", "thread_name"}}}}};
  const mt::trace::Swimlane d = measured_swimlane(t);
  ASSERT_EQ(d.lanes.size(), 2u);
  ASSERT_EQ(d.lanes[0].boxes.size(), 3u);  // F0, B0, optimizer step; not the p2p track
  EXPECT_EQ(d.lanes[0].boxes[0].label, "F0");
  EXPECT_DOUBLE_EQ(d.lanes[0].boxes[0].start, 0.5);
  EXPECT_DOUBLE_EQ(d.lanes[0].boxes[1].end, 2.0);
  EXPECT_EQ(d.lanes[0].boxes[1].fill, "#dd7a32");
  ASSERT_EQ(d.lanes[1].boxes.size(), 2u);
  EXPECT_DOUBLE_EQ(d.lanes[1].boxes[0].start, 0);
  EXPECT_TRUE(measured_swimlane(nlohmann::json{{"traceEvents", nlohmann::json::array()}}).lanes.empty());
}

TEST(ReportSwimlane, SimulatedNeedsEveryField) {
  nlohmann::json p = {{"schedule", "1f1b"},         {"stages", 2},
                      {"micro_batches", 4},         {"virtual_stages", 1},
                      {"stage_forward_ms", {1, 1}}, {"stage_backward_ms", {2, 2}},
                      {"message_latency_ms", 0.0}};
  const mt::trace::Swimlane d = simulated_swimlane(p, "s.json");
  ASSERT_EQ(d.lanes.size(), 2u);
  EXPECT_EQ(d.lanes[0].boxes.size() + d.lanes[1].boxes.size(), 16u);  // p x 2m
  EXPECT_EQ(inline_swimlane_svg(d).rfind("<svg", 0), 0u);
  p.erase("stage_backward_ms");
  try {
    simulated_swimlane(p, "s.json");
    ADD_FAILURE() << "accepted a pipeline section without stage_backward_ms";
  } catch (const mt::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("s.json: the \"pipeline\" section has no \"stage_backward_ms\""),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
