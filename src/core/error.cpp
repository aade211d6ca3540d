#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace mt {

void assert_fail(const char* file, int line, const char* expr, const std::string& msg) {
  std::fprintf(stderr, "meshtrain: internal error at %s:%d: assertion `%s` failed%s%s\n", file, line, expr,
               msg.empty() ? "" : ": ", msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace mt
