// meshtrain report: one self-contained HTML page for one or more runs (src/report/report_html.h).
#include <cstdio>
#include <memory>

#include "apps/meshtrain/commands.h"
#include "core/fs.h"
#include "report/report_html.h"

namespace mt::cli {

namespace {

struct ReportArgs {
  std::vector<std::string> paths;
  std::string out;
};

void run_report(const ReportArgs& a) {
  check_output_path("-o", a.out);
  std::vector<report::RunData> runs;
  for (const std::string& p : a.paths) {
    runs.push_back(report::load_run(p));
    MT_CHECK_INPUT(!same_file(runs.back().metrics_path, a.out), "-o ", a.out, " is the metrics file of run ", p,
                   "; choose another output name (report.html)");
  }
  report::make_names_unique(runs);
  const std::string page = report::report_html(runs);
  write_file_atomic(a.out, page);
  std::printf("wrote %s: %zu run%s, %zu bytes\n", a.out.c_str(), runs.size(), runs.size() == 1 ? "" : "s", page.size());
}

}  // namespace

void add_report_command(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  CLI::App* sub = app.add_subcommand(
      "report", "one self-contained HTML page of one or more runs: curves, memory, pipeline, experts, configuration");
  sub->add_option("paths", a->paths,
                  "run directories (metrics.jsonl or one *.jsonl, with summary.json, trace.json and the .toml when "
                  "present) or metrics files; several are compared side by side")
      ->required()
      ->type_name("RUN_DIR|METRICS");
  sub->add_option("-o,--out", a->out, "the HTML file to write")->required();
  sub->callback([a] { run_report(*a); });
}

}  // namespace mt::cli
