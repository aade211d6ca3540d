// Subcommands of the `meshtrain` CLI. Each add_* function registers one subcommand (its flags and its
// callback) on the given parent; main.cpp only wires them together.
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <string>

namespace mt::cli {

// A finite number >= 0, with the quantity named in the message ("--comm-cost: message cost must be >= 0, got
// -1"). CLI11's own numeric validators let NaN through (every comparison with NaN is false).
inline CLI::Validator finite_non_negative(const std::string& what) {
  return CLI::Validator(
      [what](std::string& s) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(s, v)) return what + " must be a number, got " + s;
        if (!(v >= 0)) return what + " must be >= 0, got " + s;
        return std::isfinite(v) ? std::string() : what + " must be finite, got " + s;
      },
      "FINITE >= 0");
}
// Whole numbers >= 1 (CLI::PositiveNumber's message prints DBL_MAX as its bound).
inline const CLI::Range kPositiveInt(1, 2147483647);
inline const CLI::Range kNonNegativeInt(0, 2147483647);

void add_train_command(CLI::App& app);
void add_prepare_command(CLI::App& app);
void add_sample_command(CLI::App& app);
void add_simulate_command(CLI::App& app);
void add_bench_train_command(CLI::App& bench);  // meshtrain bench train
void add_bench_comm_command(CLI::App& bench);   // meshtrain bench comm
void add_bench_pipeline_command(CLI::App& bench);  // meshtrain bench pipeline

}  // namespace mt::cli
