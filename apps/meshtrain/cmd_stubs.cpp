// Temporary registrations for subcommands not written yet; each fails with "not supported yet".
#include "apps/meshtrain/commands.h"
#include "core/error.h"

namespace mt::cli {

namespace {
void stub(CLI::App& parent, const char* name) {
  CLI::App* sub = parent.add_subcommand(name, "(not supported yet)");
  sub->allow_extras();
  sub->callback([name] { throw mt::InputError(mt::str("`", name, "` is not supported yet")); });
}
}  // namespace

void add_train_command(CLI::App& app) { stub(app, "train"); }
void add_prepare_command(CLI::App& app) { stub(app, "prepare"); }
void add_sample_command(CLI::App& app) { stub(app, "sample"); }
void add_bench_train_command(CLI::App& bench) { stub(bench, "train"); }

}  // namespace mt::cli
