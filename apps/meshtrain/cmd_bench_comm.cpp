// meshtrain bench comm: placeholder until the communication layer lands.
#include "apps/meshtrain/commands.h"
#include "core/error.h"

namespace mt::cli {

void add_bench_comm_command(CLI::App& bench) {
  CLI::App* sub = bench.add_subcommand("comm", "(not supported yet)");
  sub->allow_extras();
  sub->callback([] { throw mt::InputError("`bench comm` is not supported yet"); });
}

}  // namespace mt::cli
