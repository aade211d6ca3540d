#include "core/error.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace mt {

namespace {
char* g_sink = nullptr;
size_t g_sink_bytes = 0;
}  // namespace

void set_fatal_sink(char* buf, size_t bytes) {
  g_sink = buf;
  g_sink_bytes = bytes;
}

void fatal_message(const char* const* parts, int nparts) {
  char line[1024];
  size_t n = 0;
  auto add = [&](const char* s) {
    const size_t k = std::min(std::strlen(s), sizeof line - 2 - n);
    std::memcpy(line + n, s, k);
    n += k;
  };
  if (!g_sink) add("meshtrain: error: ");
  for (int i = 0; i < nparts; i++) add(parts[i]);
  if (g_sink && g_sink_bytes > 0) {
    const size_t k = std::min(n, g_sink_bytes - 1);
    std::memcpy(g_sink, line, k);
    g_sink[k] = 0;
    return;
  }
  line[n++] = '\n';
  ssize_t ignored = ::write(2, line, n);
  (void)ignored;
}

void assert_fail(const char* file, int line, const char* expr, const std::string& msg) {
  std::fprintf(stderr, "meshtrain: internal error at %s:%d: assertion `%s` failed%s%s\n", file, line, expr,
               msg.empty() ? "" : ": ", msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace mt
