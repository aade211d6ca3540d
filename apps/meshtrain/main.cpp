// meshtrain: the command-line entry point. Subcommands live in cmd_*.cpp; any mt::Error escaping a
// subcommand becomes one line on stderr and exit code 1.
#include <cstdio>
#include <exception>

#include "apps/meshtrain/commands.h"
#include "core/error.h"
#include "tensor/buffer.h"

int main(int argc, char** argv) {
  CLI::App app{"meshtrain: parallel and distributed training of neural networks on CPUs"};
  app.require_subcommand(1);
  mt::cli::add_train_command(app);
  mt::cli::add_prepare_command(app);
  mt::cli::add_sample_command(app);
  mt::cli::add_decode_command(app);
  mt::cli::add_simulate_command(app);
  mt::cli::add_report_command(app);
  mt::cli::add_flight_command(app);
  CLI::App* bench = app.add_subcommand("bench", "benchmarks that compare against a peer in the same run");
  bench->require_subcommand(1);
  mt::cli::add_bench_train_command(*bench);
  mt::cli::add_bench_comm_command(*bench);
  mt::cli::add_bench_pipeline_command(*bench);
  mt::cli::add_bench_tokenizer_command(*bench);
  mt::cli::add_bench_offload_command(*bench);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // a subcommand that already reported its failure (e.g. a failed rank)
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the message (naming the flag); its exit codes (105-114) become the documented 1.
    return app.exit(e) == 0 ? 0 : 1;
  } catch (const mt::Error& e) {
    std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
    return 1;
  } catch (const mt::OutOfMemory& e) {
    std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc& e) {
    std::fprintf(stderr, "meshtrain: error: out of memory; reduce the model shape, --batch-size or --seq-len\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshtrain: unexpected error: %s\n", e.what());
    return 1;
  }
  return 0;
}
