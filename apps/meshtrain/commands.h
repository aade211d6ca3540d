// Subcommands of the `meshtrain` CLI. Each add_* function registers one subcommand (its flags and its
// callback) on the given parent; main.cpp only wires them together.
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <string>

#include "core/error.h"
#include "train/train_config.h"

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
// A flag whose value is one of a few names, held as the enum E (train/train_config.h lists the names in
// flag_values): mapped once, while parsing. A bad value is an InputError naming the flag, the value and the
// choices ("meshtrain: error: --model must be one of gpt, mlp; got 'x'"), exit 1. --help shows type_name
// (TEXT; "TEXT:{auto,shm,mpi}" spells the choices out as CLI::IsMember would) and, when show_default, the
// current value's name as the default.
template <class E>
CLI::Option* add_enum_option(CLI::App* app, const std::string& flag, E& value, const std::string& help,
                             bool show_default, const std::string& type_name = "TEXT") {
  CLI::Option* o = app->add_option_function<std::string>(
      flag,
      [&value, flag](const std::string& s) {
        std::string choices;
        for (const auto& f : train::flag_values(E{})) {
          if (s == f.name) {
            value = f.value;
            return;
          }
          choices += (choices.empty() ? "" : ", ") + std::string(f.name);
        }
        MT_CHECK_INPUT(false, flag, " must be one of ", choices, "; got '", s, "'");
      },
      help);
  o->type_name(type_name);
  if (show_default) o->default_str(train::flag_name(value));
  return o;
}

// Whole numbers >= 1 (CLI::PositiveNumber's message prints DBL_MAX as its bound).
inline const CLI::Range kPositiveInt(1, 2147483647);
inline const CLI::Range kNonNegativeInt(0, 2147483647);
// --threads: libgomp crashes far beyond this (100000 segfaults, 2^31-1 fails in its allocator), and threads past
// the cores only contend; 1024 covers the largest CPU hosts (two sockets of 192 cores, 2-way SMT is 768).
inline const CLI::Range kThreads(1, train::kMaxThreads);

void add_train_command(CLI::App& app);
void add_prepare_command(CLI::App& app);
void add_sample_command(CLI::App& app);
void add_decode_command(CLI::App& app);
void add_simulate_command(CLI::App& app);
void add_report_command(CLI::App& app);
void add_flight_command(CLI::App& app);  // meshtrain flight (gather MPI ranks' flight recorder rings)
void add_bench_train_command(CLI::App& bench);  // meshtrain bench train
void add_bench_comm_command(CLI::App& bench);   // meshtrain bench comm
void add_bench_pipeline_command(CLI::App& bench);  // meshtrain bench pipeline
void add_bench_tokenizer_command(CLI::App& bench);  // meshtrain bench tokenizer
void add_bench_offload_command(CLI::App& bench);  // meshtrain bench offload

}  // namespace mt::cli
