// meshtrain.train(config): the dict becomes the argv of `meshtrain train` and runs through the CLI's own parser
// and callback (apps/meshtrain/cmd_train.cpp), so the options, their checks and their messages are the CLI's by
// construction. Ranks are forked over shared memory as the CLI does (--nproc). The metrics rows come back as a
// list of dicts, read from --metrics (a temporary file when the config names none).
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "apps/meshtrain/commands.h"
#include "bindings.h"
#include "core/error.h"
#include "stderr_tee.h"
#include "tensor/buffer.h"

namespace mt::py {

namespace {

// One config entry as a flag: key "batch_size", "batch-size" or "--batch-size" -> "--batch-size"; True -> the bare
// flag, False and None -> nothing (every boolean flag defaults to off), a list -> comma-separated (--hidden,
// --stage-layers), anything else -> "--flag=str(value)" (float: repr, which round-trips).
void append_flag(std::vector<std::string>& argv, const pb::handle& key, const pb::handle& value) {
  MT_CHECK_INPUT(pb::isinstance<pb::str>(key), "train(): config keys must be strings (flag names), got ",
                 std::string(pb::str(pb::repr(key))));
  std::string name = key.cast<std::string>();
  if (name.rfind("--", 0) == 0) name.erase(0, 2);
  for (char& c : name)
    if (c == '_') c = '-';
  MT_CHECK_INPUT(!name.empty() && name != "help", "train(): '", key.cast<std::string>(),
                 "' is not an option; the keys are the flags of `meshtrain train --help`");
  const std::string flag = "--" + name;
  if (value.is_none() || (pb::isinstance<pb::bool_>(value) && !value.cast<bool>())) return;
  if (pb::isinstance<pb::bool_>(value)) {
    argv.push_back(flag);
    return;
  }
  auto text = [&](const pb::handle& v) -> std::string {
    if (pb::isinstance<pb::str>(v)) return v.cast<std::string>();
    if (pb::isinstance<pb::float_>(v)) return pb::repr(v).cast<std::string>();
    if (pb::isinstance<pb::int_>(v)) return pb::str(v).cast<std::string>();
    if (pb::hasattr(v, "__fspath__")) return pb::module_::import("os").attr("fspath")(v).cast<std::string>();
    throw InputError(str("train(): config key '", key.cast<std::string>(), "' has a value of type ",
                         std::string(pb::str(v.get_type().attr("__name__"))),
                         "; give a number, a string, a path, a bool or a list of them"));
  };
  std::string arg;
  if (pb::isinstance<pb::list>(value) || pb::isinstance<pb::tuple>(value)) {
    for (const pb::handle& v : value) arg += (arg.empty() ? "" : ",") + text(v);
  } else {
    arg = text(value);
  }
  argv.push_back(flag + "=" + arg);
}

// A scratch directory for the metrics when the config names no file; removed with everything in it.
struct TempDir {
  std::string path;
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/meshtrain-py-XXXXXX";
    MT_REQUIRE(Error, ::mkdtemp(tmpl.data()) != nullptr, "train(): cannot create a temporary directory under ",
               tmpl.substr(0, tmpl.rfind('/')), " for the metrics; set TMPDIR or give 'metrics'");
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

pb::list read_metrics(const std::string& path) {
  pb::list rows;
  std::ifstream in(path);
  if (!in) return rows;  // a device such as /dev/null, or no row written
  std::string line;
  for (int n = 1; std::getline(in, line); n++) {
    if (line.empty()) continue;
    try {
      rows.append(to_python(nlohmann::json::parse(line)));
    } catch (const nlohmann::json::exception& e) {
      throw Error(str(path, ":", n, ": a metrics row is not JSON (", e.what(), ")"));
    }
  }
  return rows;
}

// Runs `meshtrain train ARGS` in this process (ranks forked from it) with the GIL released; every failure is
// thrown as the mt::Error the CLI would have printed (module.cpp maps them to Python exceptions).
void run_cli(const std::vector<std::string>& args) {
  pb::gil_scoped_release no_gil;
  // One run at a time per process: launching ranks is not reentrant (comm/launch.h) and fd 2 is redirected.
  static std::mutex one_run;
  std::lock_guard<std::mutex> lock(one_run);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  CLI::App app{"meshtrain"};
  app.require_subcommand(1);
  cli::add_train_command(app);
  StderrTee tee;
  try {
    app.parse((int)argv.size(), argv.data());
  } catch (const CLI::RuntimeError& e) {
    // A launched job failed: launch() reported it on stderr as "meshtrain: ..." (rank and cause).
    tee.stop();
    std::string line = tee.last_line_starting("meshtrain: ");
    if (line.empty()) line = str("meshtrain: train failed with exit code ", e.get_exit_code());
    throw Error(line.substr(std::string("meshtrain: ").size()));
  } catch (const CLI::ParseError& e) {
    throw InputError(e.what());  // CLI11's own message, naming the flag
  } catch (const OutOfMemory& e) {
    throw Error(e.what());
  } catch (const std::bad_alloc&) {
    throw std::bad_alloc();  // MemoryError
  }
}

pb::list train(const pb::object& config, const pb::kwargs& kwargs) {
  std::vector<std::string> args = {"meshtrain", "train"};
  pb::dict all;
  if (!config.is_none()) {
    MT_CHECK_INPUT(pb::isinstance<pb::dict>(config), "train(config): config must be a dict of flag -> value, got ",
                   std::string(pb::str(config.get_type().attr("__name__"))));
    for (auto [k, v] : config.cast<pb::dict>()) all[k] = v;
  }
  for (auto [k, v] : kwargs) all[k] = v;
  std::string metrics;
  for (auto [k, v] : all) {
    append_flag(args, k, v);
    if (args.back().rfind("--metrics=", 0) == 0) metrics = args.back().substr(10);
  }
  std::unique_ptr<TempDir> tmp;
  if (metrics.empty()) {
    tmp = std::make_unique<TempDir>();
    metrics = tmp->path + "/metrics.jsonl";
    args.push_back("--metrics=" + metrics);
  }
  run_cli(args);
  return read_metrics(metrics);
}

}  // namespace

void add_train(pb::module_& m) {
  m.def("train", &train, pb::arg("config") = pb::none(),
        R"(Trains as `meshtrain train` would, in this process (and, with nproc > 1, ranks forked from it).

config: a dict whose keys are the flags of `meshtrain train --help` ("batch_size", "batch-size" or
"--batch-size"; keyword arguments are merged over it). True gives a bare flag, False and None leave it out, a
list is comma-separated. Returns the metrics rows (one dict per step, as in the --metrics file). A bad option
or failed run raises meshtrain.InputError / meshtrain.Error with the CLI's message.)");
}

pb::object to_python(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::object: {
      pb::dict d;
      for (const auto& [k, v] : j.items()) d[pb::str(k)] = to_python(v);
      return d;
    }
    case nlohmann::json::value_t::array: {
      pb::list l;
      for (const auto& v : j) l.append(to_python(v));
      return l;
    }
    case nlohmann::json::value_t::string:
      return pb::str(j.get<std::string>());
    case nlohmann::json::value_t::boolean:
      return pb::bool_(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
      return pb::int_(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return pb::int_(j.get<uint64_t>());
    case nlohmann::json::value_t::number_float:
      return pb::float_(j.get<double>());
    default:
      return pb::none();
  }
}

}  // namespace mt::py
