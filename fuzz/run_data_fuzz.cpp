// Fuzz target: the report's run reader (report/run_data.h): a run directory with metrics.jsonl,
// summary.json and trace.json from the input (see fuzz_input.h's Parts). Bad files are rejected with
// mt::InputError only; an accepted run's rows each have a numeric step and loss.
#include <cstdint>
#include <filesystem>

#include "core/error.h"
#include "fuzz_input.h"
#include "report/run_data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  const fs::path dir = mt::fuzz::scratch_dir() / "run";
  fs::create_directories(dir);
  mt::fuzz::Parts parts{data, size};
  const char* names[] = {"metrics.jsonl", "summary.json", "trace.json"};
  for (int i = 0; i < 3; ++i) {
    const std::string bytes = parts.next(i == 2);
    const std::string rel = std::string("run/") + names[i];
    if (i > 0 && bytes.empty()) {  // an empty part: the file is absent, which the reader allows
      std::error_code ec;
      fs::remove(mt::fuzz::scratch_dir() / rel, ec);
      continue;
    }
    mt::fuzz::write_input(rel, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  try {
    const mt::report::RunData run = mt::report::load_run(dir.string());
    for (const auto& row : run.rows)
      if (!row.is_object() || !row.contains("step") || !row.contains("loss") || !row["loss"].is_number())
        __builtin_trap();
    if (mt::report::column(run, "loss").size() != run.rows.size()) __builtin_trap();
  } catch (const mt::InputError&) {
  }
  return 0;
}
