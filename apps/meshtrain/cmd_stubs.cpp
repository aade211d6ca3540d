// Temporary registrations for subcommands not written yet; each fails with "not supported yet".
#include "apps/meshtrain/commands.h"
#include "core/error.h"

namespace mt::cli {

void add_bench_train_command(CLI::App& bench) {
  CLI::App* sub = bench.add_subcommand("train", "(not supported yet)");
  sub->allow_extras();
  sub->callback([] { throw mt::InputError("`bench train` is not supported yet"); });
}

}  // namespace mt::cli
