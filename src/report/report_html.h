// `meshtrain report`: one self-contained HTML page (inline CSS and SVG; no script, no network, no fonts to
// fetch) for one or more runs side by side: a summary table with one column per run, overlaid curves (loss,
// validation loss, throughput, MFU when the rows carry it, bytes sent per step, MoE drops), per-rank memory,
// the pipeline bubble and swimlanes, expert load per MoE block, the resolved configuration, and every
// metrics row as a table. Every number drawn is also in a table as text, in the metrics file's own spelling.
#pragma once

#include <string>
#include <vector>

#include "report/run_data.h"

namespace mt::report {

// The page. Throws mt::InputError naming the file when a summary's sections do not have the expected shape.
std::string report_html(const std::vector<RunData>& runs);

}  // namespace mt::report
