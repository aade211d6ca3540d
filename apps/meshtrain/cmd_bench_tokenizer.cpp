// meshtrain bench tokenizer: GPT-2 BPE encoding speed of one text at several thread counts, checked: the ids
// are the same at every thread count and decode back to the text. Each timed run encodes the whole text
// with fresh piece caches (a cold start, as for a new file). bench/bpe_bench.py runs it beside the Node.js
// reference encoders on the same text. Prints one JSON line per thread count.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/meshtrain/commands.h"
#include "core/error.h"
#include "core/fs.h"
#include "data/bpe.h"

namespace mt::cli {

namespace {
// CPU seconds (user + system) of the whole process so far, all threads.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}
}  // namespace

void add_bench_tokenizer_command(CLI::App& bench) {
  struct Args {
    std::string text, tokenizer_dir;
    std::vector<int> threads{1, 2};
    double seconds = 3;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = bench.add_subcommand("tokenizer", "GPT-2 BPE encoding speed (MB/s, tokens/s), checked");
  sub->add_option("--text", a->text, "text file to encode")->required();
  sub->add_option("--tokenizer-dir", a->tokenizer_dir, "directory with encoder.json and vocab.bpe")->required();
  sub->add_option("--threads", a->threads, "thread counts to time")->capture_default_str()->check(kPositiveInt);
  sub->add_option("--seconds", a->seconds, "time budget per thread count (at least one run)")
      ->capture_default_str()
      ->check(finite_non_negative("seconds"));
  sub->callback([a] {
    const data::Gpt2Vocab vocab(a->tokenizer_dir);
    const std::string text = read_file(a->text);
    const std::vector<int32_t> ids = data::encode_gpt2(vocab, text, 1);
    MT_CHECK_INPUT(data::decode_gpt2(vocab, ids) == text, "bench tokenizer: decode(encode(text)) differs from ",
                   a->text, "; this is a bug in the tokenizer");
    using Clock = std::chrono::steady_clock;
    for (int t : a->threads) {
      MT_CHECK_INPUT(data::encode_gpt2(vocab, text, t) == ids, "bench tokenizer: ", t,
                     " threads give other ids than 1 thread; this is a bug in the tokenizer");
      int runs = 0;
      const double cpu0 = cpu_seconds();
      const Clock::time_point t0 = Clock::now();
      double dt = 0;
      do {
        const size_t n = data::encode_gpt2(vocab, text, t).size();
        MT_ASSERT(n == ids.size(), "token count changed between runs: ", n, " vs ", ids.size());
        ++runs;
        dt = std::chrono::duration<double>(Clock::now() - t0).count();
      } while (dt < a->seconds);
      const double cpu = cpu_seconds() - cpu0;  // below threads x dt when the cores were busy with other work
      std::printf(
          "{\"encoder\": \"meshtrain\", \"threads\": %d, \"runs\": %d, \"seconds\": %.3f, \"cpu_seconds\": %.3f, "
          "\"bytes\": %zu, \"tokens\": %zu, \"mb_per_s\": %.3f, \"tokens_per_s\": %.1f}\n",
          t, runs, dt, cpu, text.size(), ids.size(), text.size() * runs / dt / 1e6, ids.size() * runs / dt);
      std::fflush(stdout);
    }
  });
}

}  // namespace mt::cli
