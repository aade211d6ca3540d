// Subcommands of the `meshtrain` CLI. Each add_* function registers one subcommand (its flags and its
// callback) on the given parent; main.cpp only wires them together.
#pragma once

#include <CLI/CLI.hpp>

namespace mt::cli {

void add_train_command(CLI::App& app);
void add_prepare_command(CLI::App& app);
void add_sample_command(CLI::App& app);
void add_simulate_command(CLI::App& app);
void add_bench_train_command(CLI::App& bench);  // meshtrain bench train
void add_bench_comm_command(CLI::App& bench);   // meshtrain bench comm
void add_bench_pipeline_command(CLI::App& bench);  // meshtrain bench pipeline

}  // namespace mt::cli
