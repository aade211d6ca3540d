// Run configuration files: TOML in (apply_config_file), TOML out (render_config). See config_file.h.
#include "apps/meshtrain/config_file.h"

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/fs.h"

namespace mt::cli {

namespace {

// What TOML type a flag's value takes, from how CLI11 declared the option.
enum class Kind { flag, integer, unsigned_integer, number, text, integer_list };

Kind kind_of(const CLI::Option& o) {
  if (o.get_expected_max() == 0) return Kind::flag;
  if (o.get_expected_max() > 1) return Kind::integer_list;  // --hidden, --stage-layers (delimiter ',')
  const std::string full = o.get_type_name();  // "INT", "INT:INT in [1 - 2147483647]", "TEXT:{auto,shm,mpi}"
  const std::string t = full.substr(0, full.find(':'));
  if (t == "INT") return Kind::integer;
  if (t == "UINT") return Kind::unsigned_integer;
  if (t == "FLOAT") return Kind::number;
  return Kind::text;  // TEXT, and the enum flags' TEXT:{...}
}

const char* kind_wanted(Kind k) {
  switch (k) {
    case Kind::flag:
      return "true or false";
    case Kind::integer:
    case Kind::unsigned_integer:
      return "an integer";
    case Kind::number:
      return "a number";
    case Kind::text:
      return "a string in quotes";
    case Kind::integer_list:
      return "an array of integers such as [2, 3, 3]";
  }
  return "";
}

const char* toml_type_name(toml::node_type t) {
  switch (t) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a floating-point number";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    default:
      return "nothing";
  }
}

// The shortest text that CLI11 reads back as exactly d, as a TOML float: 0.001, 1e-08, 300.0, inf, nan.
std::string format_double(double d) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, r.ptr);
  double back = 0;
  if (!CLI::detail::lexical_cast(s, back) || !(back == d || (std::isnan(back) && std::isnan(d)))) {
    std::snprintf(buf, sizeof buf, "%.17g", d);
    s = buf;
  }
  // A whole number stays a TOML float (300.0, not 300), so the file's types say which flags take numbers.
  if (s.find_first_not_of("-0123456789") == std::string::npos) s += ".0";
  return s;
}

// A TOML value as the strings CLI11 would have received on the command line; "" in *why when its TOML type
// does not fit the flag's kind.
std::vector<std::string> cli_inputs(const toml::node& v, Kind k, std::string* why) {
  const toml::node_type t = v.type();
  auto integer = [](const toml::node& n) { return std::to_string(n.as_integer()->get()); };
  switch (k) {
    case Kind::flag:
      if (t == toml::node_type::boolean) return {v.as_boolean()->get() ? "true" : "false"};
      break;
    case Kind::integer:
      if (t == toml::node_type::integer) return {integer(v)};
      break;
    case Kind::unsigned_integer:  // seeds above 2^63 - 1 do not fit a TOML integer: they are written as strings
      if (t == toml::node_type::integer) return {integer(v)};
      if (t == toml::node_type::string) return {v.as_string()->get()};
      break;
    case Kind::number:
      if (t == toml::node_type::integer) return {integer(v)};
      if (t == toml::node_type::floating_point) return {format_double(v.as_floating_point()->get())};
      break;
    case Kind::text:
      if (t == toml::node_type::string) return {v.as_string()->get()};
      break;
    case Kind::integer_list: {
      if (t == toml::node_type::integer) return {integer(v)};
      if (t != toml::node_type::array) break;
      std::vector<std::string> out;
      for (const toml::node& e : *v.as_array()) {
        if (e.type() != toml::node_type::integer) {
          *why = std::string("an array holding ") + toml_type_name(e.type());
          return {};
        }
        out.push_back(integer(e));
      }
      if (out.empty()) *why = "an empty array";
      return out;
    }
  }
  *why = toml_type_name(t);
  return {};
}

// Levenshtein distance, for "did you mean" on unknown keys.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); j++) row[j] = j;
  for (size_t i = 1; i <= a.size(); i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); j++) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string suggestion(const CLI::App& sub, const std::string& key) {
  std::string best;
  size_t best_d = 3;  // suggest only near misses
  for (const CLI::Option* o : sub.get_options()) {
    const std::string name = o->get_name().substr(std::min<size_t>(2, o->get_name().size()));
    const size_t d = edit_distance(key, name);
    if (d < best_d) best_d = d, best = name;
  }
  return best.empty() ? "" : "; did you mean '" + best + "'?";
}

// The text of line `line` (1-based) of `path`, for syntax errors.
std::string line_text(const std::string& path, int line) {
  std::istringstream in(read_file(path));
  std::string s;
  for (int i = 0; i < line && std::getline(in, s); i++) {
  }
  return s;
}

toml::table parse_or_throw(const std::string& path) {
  std::string text;
  try {
    text = read_file(path);
  } catch (const InputError& e) {
    throw InputError(str("--config: ", e.what()));  // "--config: cannot open PATH: No such file or directory"
  }
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    const auto& at = e.source().begin;
    std::string where = line_text(path, (int)at.line);
    const size_t eq = where.find('=');
    const std::string key = eq == std::string::npos ? "" : where.substr(0, eq);
    const std::string quoted = key.empty() ? "" : " (key '" + key.substr(0, key.find_last_not_of(" \t") + 1) + "')";
    throw InputError(str(path, ":", at.line, ":", at.column, ": TOML syntax error", quoted, ": ", e.description(),
                         "; the line reads: ", where));
  }
}

}  // namespace

ConfigLines apply_config_file(CLI::App& sub, const std::string& path) {
  const toml::table file = parse_or_throw(path);
  ConfigLines lines;
  for (const auto& [k, v] : file) {
    const std::string key(k.str());
    const int line = (int)k.source().begin.line;
    const std::string at = str(path, ":", line, ": key '", key, "'");
    std::string flag = "--" + key;
    std::replace(flag.begin() + 2, flag.end(), '_', '-');  // batch_size = batch-size
    CLI::Option* o = key.empty() ? nullptr : sub.get_option_no_throw(flag);
    MT_CHECK_INPUT(o != nullptr && flag != "--help" && flag != "--config", at,
                   flag == "--config" ? ": a configuration file cannot name another one"
                   : v.is_table()     ? ": tables ([section]) are not read; write the keys at the top of the file"
                                      : ": unknown key, not a flag of meshtrain train (see meshtrain train --help)",
                   o == nullptr && !v.is_table() ? suggestion(sub, key) : "");
    auto [prev, fresh] = lines.emplace(flag, line);
    MT_CHECK_INPUT(fresh, at, ": ", flag.substr(2), " is already set on line ", prev->second,
                   " (dashes and underscores name the same key)");
    const Kind kind = kind_of(*o);
    std::string got;
    std::vector<std::string> inputs = cli_inputs(v, kind, &got);
    MT_CHECK_INPUT(got.empty(), at, ": wrong type: ", flag, " takes ", kind_wanted(kind), ", got ", got);
    if (o->count() > 0) continue;  // the command line gave this flag: it wins
    try {
      o->add_result(inputs);
      o->run_callback();  // the flag's own conversion, validators and callback
    } catch (const CLI::Error& e) {
      throw InputError(str(at, ": ", e.what()));
    } catch (const Error& e) {
      throw InputError(str(at, ": ", e.what()));
    }
  }
  return lines;
}

namespace {

// One option's value as a TOML value (text), from its results or its declared default; "" when neither exists.
std::string toml_value(const CLI::Option& o) {
  const Kind kind = kind_of(o);
  std::vector<std::string> vals = o.results();
  if (o.count() == 0) {
    std::string d = o.get_default_str();
    if (kind == Kind::flag) return d.empty() ? "false" : d;
    if (d.empty()) return "";
    vals.clear();
    if (kind == Kind::integer_list) {  // "[256,128]"
      d = d.substr(d.front() == '[' ? 1 : 0);
      if (!d.empty() && d.back() == ']') d.pop_back();
      std::stringstream in(d);
      for (std::string e; std::getline(in, e, ',');) vals.push_back(e);
    } else {
      vals.push_back(d);
    }
  }
  if (kind == Kind::flag) return o.as<bool>() ? "true" : "false";
  std::vector<std::string> out;
  for (const std::string& s : vals) {
    if (kind == Kind::number) {
      double d = 0;
      MT_ASSERT(CLI::detail::lexical_cast(s, d), o.get_name(), " holds a non-number '", s, "'");
      out.push_back(format_double(d));
    } else if (kind == Kind::integer || kind == Kind::integer_list) {
      int64_t i = 0;
      MT_ASSERT(CLI::detail::lexical_cast(s, i), o.get_name(), " holds a non-integer '", s, "'");
      out.push_back(std::to_string(i));
    } else if (kind == Kind::unsigned_integer) {
      uint64_t u = 0;
      MT_ASSERT(CLI::detail::lexical_cast(s, u), o.get_name(), " holds a non-integer '", s, "'");
      std::ostringstream os;
      if (u > (uint64_t)INT64_MAX)
        os << toml::value<std::string>(std::to_string(u));
      else
        os << u;
      out.push_back(os.str());
    } else {
      std::ostringstream os;
      os << toml::value<std::string>(s);  // quoted, with TOML's escapes
      out.push_back(os.str());
    }
  }
  if (kind != Kind::integer_list) return out.empty() ? "" : out.back();
  std::string list = "[";
  for (size_t i = 0; i < out.size(); i++) list += (i ? ", " : "") + out[i];
  return list + "]";
}

}  // namespace

std::string render_config(const CLI::App& sub, const std::set<std::string>& skip,
                          const std::set<std::string>& not_repeated) {
  std::string out =
      "# meshtrain train: the resolved configuration of a run, every flag's value (defaults included).\n"
      "# Repeat the run: meshtrain train --config THIS_FILE (flags given beside --config override keys here).\n";
  for (const CLI::Option* o : sub.get_options()) {
    const std::string& flag = o->get_name();
    if (flag.size() < 3 || flag == "--help" || flag == "--config" || skip.count(flag)) continue;
    const std::string key = flag.substr(2);
    const std::string value = toml_value(*o);
    if (not_repeated.count(flag))
      out += "# " + key + (o->count() ? " = " + value : ": not set") + "  (never repeated from a file: give " + flag +
             " yourself)\n";
    else if (value.empty())
      out += "# " + key + ": not set\n";
    else
      out += key + " = " + value + "\n";
  }
  return out;
}

std::string resolved_config_path(const std::string& metrics, const std::string& save) {
  for (const std::string& beside : {metrics, save}) {
    if (beside.empty()) continue;
    const std::string kind = file_kind(resolve_symlinks(beside));
    if (kind == "character device" || kind == "FIFO") continue;  // no "beside" a device
    return std::filesystem::path(beside).replace_extension(".toml").string();
  }
  return "";
}

}  // namespace mt::cli
