// Subcommands of the `meshtrain` CLI. Each add_* function registers one subcommand (its flags and its
// callback) on the given parent; main.cpp only wires them together.
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <string>

namespace mt::cli {

// CLI11's numeric validators let NaN through (every comparison with NaN is false); this one rejects NaN and
// the infinities. Chain it: ->check(kFinite & kNonNegative).
inline const CLI::Validator kFinite(
    [](std::string& s) -> std::string {
      double v = 0;
      if (!CLI::detail::lexical_cast(s, v)) return "not a number: " + s;
      return std::isfinite(v) ? std::string() : "must be a finite number, got " + s;
    },
    "FINITE");
inline const CLI::Validator kNonNegative(
    [](std::string& s) -> std::string {
      double v = 0;
      if (!CLI::detail::lexical_cast(s, v)) return "not a number: " + s;
      return v >= 0 ? std::string() : "must be >= 0, got " + s;
    },
    "NONNEGATIVE");
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
