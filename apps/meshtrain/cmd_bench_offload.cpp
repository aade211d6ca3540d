// meshtrain bench offload: the offload files' own disk bandwidth (offload::ShardFile, the file behind
// --offload params / grads / activations), for bench/offload_fio_bench.py to set beside fio on the same
// directory with the same block size, queue depth and direct flag. Writes a file of --bytes in jobs of
// --range bytes (each job starting --skew bytes past a 4096-byte boundary, as a bucket's or a tile's slice of
// a shard does; 0: aligned jobs), --ahead jobs queued at once as the training's read-ahead and write-behind
// do, then reads it back the same way and checks every value. Prints one JSON line: the engine and mode used,
// the bytes and the wall seconds of each pass (first queue to last completion) and the bandwidth.
#include <chrono>
#include <cstdio>
#include <deque>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/meshtrain/commands.h"
#include "core/error.h"
#include "offload/shard_file.h"

namespace mt::cli {

void add_bench_offload_command(CLI::App& bench) {
  struct Args {
    std::string dir;
    uint64_t bytes = uint64_t(256) << 20, range = uint64_t(4) << 20;
    uint64_t skew = 4, block = uint64_t(1) << 20;
    int depth = 8, ahead = 4;
    std::string engine = "io_uring";
    bool buffered = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = bench.add_subcommand("offload", "the offload files' disk bandwidth (write, then read, checked)");
  sub->add_option("--dir", a->dir, "directory (as --offload-dir)")->required();
  sub->add_option("--bytes", a->bytes, "file size in bytes")->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--range", a->range, "bytes per queued job")->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--skew", a->skew, "each job starts this many bytes past a 4096-byte boundary (a multiple of 4)")
      ->capture_default_str();
  sub->add_option("--block", a->block, "bytes per I/O (a multiple of 4096)")->capture_default_str();
  sub->add_option("--depth", a->depth, "I/Os in flight (io_uring)")->capture_default_str()->check(kPositiveInt);
  sub->add_option("--ahead", a->ahead, "jobs queued at once")->capture_default_str()->check(kPositiveInt);
  sub->add_option("--engine", a->engine, "io_uring or psync")->capture_default_str()->check(CLI::IsMember({"io_uring", "psync"}));
  sub->add_flag("--buffered", a->buffered, "through the page cache (no O_DIRECT)");
  sub->callback([a] {
    MT_CHECK_INPUT(a->skew % 4 == 0 && a->skew < 4096, "--skew must be a multiple of 4 below 4096, got ", a->skew);
    MT_CHECK_INPUT(a->range % 4 == 0 && a->block % 4096 == 0, "--range must be a multiple of 4 and --block of 4096");
    const size_t rf = a->range / 4, skew = a->skew / 4;
    const size_t jobs = (a->bytes / 4 - skew) / rf;
    MT_CHECK_INPUT(jobs >= 1, "--bytes ", a->bytes, " holds no job of --range ", a->range);
    offload::ShardFile::Options o;
    o.dir = a->dir;
    o.kind = "bench data";
    o.n = skew + jobs * rf;
    o.io_block = a->block;
    o.io_depth = a->depth;
    o.direct = !a->buffered;
    o.uring = a->engine == "io_uring";
    o.timeout_s = 600;
    offload::ShardFile f(o);
    // Job k holds k * rf + i + 1 at place i (exact in float32 below 2^24; wraps harmlessly above).
    auto value = [&](size_t k, size_t i) { return (float)((k * rf + i) % 16777216 + 1); };
    std::vector<std::vector<float>> bufs((size_t)a->ahead, std::vector<float>(rf));
    using Clock = std::chrono::steady_clock;
    auto pass = [&](bool write) {
      std::deque<std::pair<offload::ShardFile::Ticket, size_t>> q;  // (ticket, job)
      size_t bad = 0;
      auto retire = [&] {
        f.wait(q.front().first);
        const size_t k = q.front().second;
        q.pop_front();
        if (!write) {
          const std::vector<float>& b = bufs[k % bufs.size()];
          for (size_t i = 0; i < rf; i++) bad += b[i] != value(k, i);
        }
      };
      const Clock::time_point t0 = Clock::now();
      for (size_t k = 0; k < jobs; k++) {
        if (q.size() == bufs.size()) retire();
        std::vector<float>& b = bufs[k % bufs.size()];
        if (write) {
          for (size_t i = 0; i < rf; i++) b[i] = value(k, i);
          q.push_back({f.write_async(skew + k * rf, rf, b.data()), k});
        } else {
          q.push_back({f.read_async(skew + k * rf, rf, b.data()), k});
        }
      }
      while (!q.empty()) retire();
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      MT_CHECK_INPUT(bad == 0, "bench offload: ", bad, " values read back differ from those written in ", a->dir);
      return s;
    };
    const double ws = pass(true), rs = pass(false);
    const double bytes = (double)(jobs * rf * 4);
    const offload::IoCounters c = f.counters();
    nlohmann::json j = {{"engine", f.engine()},       {"direct_io", f.direct_io()},  {"io_depth", f.io_depth()},
                        {"io_block_bytes", f.io_block()}, {"range_bytes", a->range}, {"skew_bytes", a->skew},
                        {"ahead", a->ahead},          {"bytes", bytes},              {"write_s", ws},
                        {"read_s", rs},               {"write_bytes_per_s", bytes / ws},
                        {"read_bytes_per_s", bytes / rs}, {"io_write_s", c.write_s}, {"io_read_s", c.read_s}};
    std::printf("%s\n", j.dump().c_str());
  });
}

}  // namespace mt::cli
