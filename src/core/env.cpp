#include "core/env.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace mt {

std::optional<bool> env_flag(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  const std::string s = v;
  MT_CHECK_INPUT(s == "0" || s == "1", name, "=", s, " is not a valid value: use 0 or 1 (or leave it unset)");
  return s == "1";
}

std::optional<long> env_int(const char* name, long lo, long hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  long x = 0;
  int used = 0;
  const bool ok = std::sscanf(v, "%ld%n", &x, &used) == 1 && v[used] == '\0' && x >= lo && x <= hi;
  MT_CHECK_INPUT(ok, name, "=", v, " is not valid: it takes an integer from ", lo, " to ", hi);
  return x;
}

std::optional<std::pair<int, int>> env_int_pair(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  int a = -1, b = -1, used = 0;
  const bool ok = std::sscanf(v, "%d,%d%n", &a, &b, &used) == 2 && v[used] == '\0' && a >= 0 && b >= 0;
  MT_CHECK_INPUT(ok, name, "=", v, " is not valid: it takes two non-negative integers, e.g. \"300,2000\"");
  return std::pair{a, b};
}

}  // namespace mt
