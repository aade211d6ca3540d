// meshtrain bench train: GPT training throughput against PyTorch in the same run, model FLOPs utilization
// against this machine's single-process SGEMM rate on the model's own GEMM shapes, and peak memory against
// the bytes training needs (params + grads + Adam state + the activations backward reads).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/meshtrain/commands.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/rng.h"
#include "data/token_shard.h"
#include "model/gpt.h"
#include "tensor/bf16.h"
#include "tensor/blas.h"
#include "tensor/buffer.h"
#include "tensor/fma_peak.h"
#include "train/trainer.h"

namespace mt::cli {

namespace {

struct BenchArgs {
  int threads = 1, steps = 5, warmup = 2, batch = 8, seq = 256;
  model::GptConfig shape{6, 6, 384, 8192, 256};  // "gpt-bench", about 13.9M parameters
  std::string torch_script = std::string(MESHTRAIN_SOURCE_DIR) + "/bench/torch_gpt_bench.py";
  bool no_torch = false;
  Precision precision = Precision::fp32;  // meshtrain's products; bf16 runs PyTorch under autocast bf16
  // PyTorch runs once per OPENBLAS_CORETYPE value ("unset" removes the variable) and the best counts.
  std::string torch_coretypes = "unset,SkylakeX,Cooperlake,Haswell";
};

struct GemmShape {
  bool ta, tb;
  int M, N, K;
};

// Every GEMM of one GPT training step outside attention (forward, input and weight gradients of each
// linear layer and of the tied logits), with its multiplicity.
std::vector<std::pair<GemmShape, int>> model_gemms(const model::GptConfig& c, int N) {
  const int C = c.n_embd, V = c.vocab_size, L = c.n_layer;
  std::vector<std::pair<GemmShape, int>> g;
  for (auto [in, out] : std::array<std::pair<int, int>, 4>{{{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}}}) {
    g.push_back({{false, false, N, out, in}, L});  // forward
    g.push_back({{false, true, N, in, out}, L});   // dinp
    g.push_back({{true, false, in, out, N}, L});   // dW
  }
  g.push_back({{false, true, N, V, C}, 1});   // logits
  g.push_back({{false, false, N, C, V}, 1});  // dlnf
  g.push_back({{true, false, V, C, N}, 1});   // dwte
  return g;
}

// GFLOP/s of this process's GEMM in `prec` over the model's GEMM shapes, after checking one result element per
// shape against a double-precision dot product (of the rounded inputs for bf16).
double measure_sgemm(const model::GptConfig& c, int N, int repeats, Precision prec) {
  auto in = [prec](float x) { return prec == Precision::bf16 ? (double)bf16_round(x) : (double)x; };
  auto shapes = model_gemms(c, N);
  size_t most = 0;
  for (auto& [s, k] : shapes) most = std::max({most, (size_t)s.M * s.K, (size_t)s.K * s.N, (size_t)s.M * s.N});
  AlignedBuffer A(most), B(most), Cm(most);
  CounterRng rng(1, "sgemm");
  for (size_t i = 0; i < most; i++) {
    A[i] = (float)rng.uniform(i) - 0.5f;
    B[i] = (float)rng.uniform(i + most) - 0.5f;
  }
  double flops = 0, secs = 0;
  for (auto& [s, mult] : shapes) {
    int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    gemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, Cm.data(), s.N, prec);  // warm-up
    double ref = 0;
    for (int k = 0; k < s.K; k++) {
      int i = s.M - 1, j = s.N / 2;
      double a = in(s.ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]);
      double b = in(s.tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
      ref += a * b;
    }
    double got = Cm[(size_t)(s.M - 1) * s.N + s.N / 2];
    MT_REQUIRE(Error, std::fabs(got - ref) <= 1e-3 * (1 + std::fabs(ref)), "SGEMM check failed for ", s.M, "x",
               s.N, "x", s.K, ": ", got, " vs ", ref, " (is this OpenBLAS kernel right for this CPU?)");
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < repeats * mult; r++)
      gemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, Cm.data(), s.N, prec);
    secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    flops += 2.0 * s.M * s.N * (double)s.K * repeats * mult;
  }
  return flops / secs / 1e9;
}

nlohmann::json run_torch(const BenchArgs& a, const std::string& coretype) {
  std::string cmd = "/usr/bin/python3 '" + a.torch_script + "' --threads " + std::to_string(a.threads) + " --steps " +
                    std::to_string(a.steps) + " --warmup " + std::to_string(a.warmup) + " --batch-size " +
                    std::to_string(a.batch) + " --seq-len " + std::to_string(a.seq) + " --n-layer " +
                    std::to_string(a.shape.n_layer) + " --n-head " + std::to_string(a.shape.n_head) + " --n-embd " +
                    std::to_string(a.shape.n_embd) + " --vocab-size " + std::to_string(a.shape.vocab_size) +
                    (a.precision == Precision::bf16 ? " --autocast bf16" : "");
  // PyTorch's OpenBLAS must use the same thread count as ours.
  cmd = "OPENBLAS_NUM_THREADS=" + std::to_string(a.threads) + " OMP_NUM_THREADS=" + std::to_string(a.threads) + " " +
        cmd;
  cmd = (coretype == "unset" ? "env -u OPENBLAS_CORETYPE " : "env OPENBLAS_CORETYPE='" + coretype + "' ") + cmd;
  std::FILE* p = popen(cmd.c_str(), "r");
  MT_REQUIRE(Error, p, "cannot run ", cmd);
  std::string out, last;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  int rc = pclose(p);
  MT_REQUIRE(Error, rc == 0, "the PyTorch benchmark failed (", cmd, "):\n", out);
  size_t end = out.find_last_not_of("\n");
  size_t start = out.rfind('\n', end);
  last = out.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1) + 1);
  try {
    return nlohmann::json::parse(last);
  } catch (const nlohmann::json::exception&) {
    throw Error(str("the PyTorch benchmark's last line is not JSON: ", last));
  }
}

void run(const BenchArgs& a) {
  set_num_threads(a.threads);
  std::printf("meshtrain bench train: GPT L=%d H=%d C=%d V=%d, B=%d T=%d, %d thread(s), --precision %s, GEMM %s\n",
              a.shape.n_layer, a.shape.n_head, a.shape.n_embd, a.shape.vocab_size, a.batch, a.seq, a.threads,
              train::flag_name(a.precision), gemm_kernel_line().c_str());
  std::fflush(stdout);

  // Data: random tokens, enough for every step.
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("meshtrain_bench_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  struct RemoveOnExit {  // also when training throws
    std::filesystem::path d;
    ~RemoveOnExit() {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  } cleanup{dir};
  const int total_steps = a.warmup + a.steps;
  std::vector<uint16_t> tokens((size_t)a.batch * a.seq * total_steps + 1);
  CounterRng rng(7, "bench-data");
  for (size_t i = 0; i < tokens.size(); i++) tokens[i] = (uint16_t)(rng.bits(i) % a.shape.vocab_size);
  write_token_shard((dir / "data.bin").string(), tokens);

  train::TrainConfig cfg;
  cfg.gpt = a.shape;
  cfg.data = (dir / "data.bin").string();
  cfg.batch_size = a.batch;
  cfg.seq_len = a.seq;
  cfg.steps = total_steps;
  cfg.threads = a.threads;
  cfg.precision = a.precision;
  cfg.weight_decay = 0.1;
  cfg.metrics = (dir / "metrics.jsonl").string();
  cfg.progress = false;
  // CPU time against wall time x threads: below ~95% someone else was using these cores during the run.
  auto cpu_seconds = [] {
    rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  };
  const double cpu0 = cpu_seconds();
  const auto wall0 = std::chrono::steady_clock::now();
  train::TrainSummary sum = train::run_training(cfg);
  const double cpu_share = (cpu_seconds() - cpu0) /
                           (std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count() * a.threads);
  size_t rss = peak_rss_bytes();
  std::vector<double> times;
  std::ifstream mf(cfg.metrics);
  std::string line;
  while (std::getline(mf, line)) {
    auto row = nlohmann::json::parse(line);
    if (row["step"].get<int>() >= a.warmup) times.push_back(row["step_time_s"].get<double>());
  }
  std::filesystem::remove_all(dir);
  std::sort(times.begin(), times.end());
  double step_s = times[times.size() / 2];
  double ours = (double)a.batch * a.seq / step_s;

  double sgemm = measure_sgemm(a.shape, a.batch * a.seq, 2, a.precision);
  FmaPeak peak = measure_fma_peak(a.threads, 1.0);
  // bf16: MFU against the bf16 dot-product ceiling (the float32 one where the products are emulated).
  if (a.precision == Precision::bf16 && bf16_native()) peak = measure_bf16_peak(a.threads, 1.0);
  double flops_tok = a.shape.flops_per_token(a.seq);
  double mfu = flops_tok * ours / (sgemm * 1e9);
  double mfu_peak = flops_tok * ours / (peak.gflops * 1e9);
  const train::RankMemory& mem = sum.ranks.at(0);
  double need = mem.param_bytes + mem.grad_bytes + mem.optimizer_bytes + mem.activation_bytes;

  std::printf("GEMM kernels used: %s\n", gemm_kernel_line().c_str());
  std::printf("\n%-34s %12s\n", "", "value");
  std::printf("%-34s %12lld\n", "parameters", (long long)a.shape.num_params());
  std::printf("%-34s %12.1f\n",
              a.precision == Precision::bf16 ? "bf16 GEMM GFLOP/s (model shapes)" : "SGEMM GFLOP/s (model GEMM shapes)",
              sgemm);
  std::printf("%-34s %12.1f   (%s, %d thread(s))\n",
              peak.isa == "avx512_bf16" ? "bf16 dot-product peak GFLOP/s" : "FMA peak GFLOP/s", peak.gflops,
              peak.isa.c_str(), peak.threads);
  std::printf("%-34s %11.1f%%\n", peak.isa == "avx512_bf16" ? "bf16 GEMM / bf16 peak" : "SGEMM / FMA peak",
              100 * sgemm / peak.gflops);
  std::printf("%-34s %12.1f\n", "model MFLOP per token", flops_tok / 1e6);
  std::printf("%-34s %12.3f\n", "meshtrain step time (median, s)", step_s);
  std::printf("%-34s %12.0f\n", "meshtrain tokens/s", ours);
  std::printf("%-34s %11.1f%%   (CPU time / wall / threads; lower: cores shared)\n", "meshtrain CPU share", 100 * cpu_share);
  // Goals: float32 MFU >= 90% of SGEMM and >= 80% of the FMA peak; bf16 MFU >= 85% of the bf16 GEMM rate.
  const bool bf16 = a.precision == Precision::bf16;
  std::printf("%-34s %11.1f%%   (goal >= %s)\n", bf16 ? "meshtrain MFU vs bf16 GEMM" : "meshtrain MFU vs SGEMM",
              100 * mfu, bf16 ? "85%" : "90%");
  if (bf16)
    std::printf("%-34s %11.1f%%\n", "meshtrain MFU vs bf16 peak", 100 * mfu_peak);
  else
    std::printf("%-34s %11.1f%%   (goal >= 80%%)\n", "meshtrain MFU vs FMA peak", 100 * mfu_peak);
  std::printf("%-34s %12.1f\n", "params+grads+Adam (MiB)",
              (mem.param_bytes + mem.grad_bytes + mem.optimizer_bytes) / 1048576.0);
  std::printf("%-34s %12.1f\n", "activations for backward (MiB)", mem.activation_bytes / 1048576.0);
  std::printf("%-34s %12.1f\n", "peak RSS (MiB)", rss / 1048576.0);
  std::printf("%-34s %12.2fx  (goal <= 1.3x)\n", "peak RSS / needed", (double)rss / need);
  std::fflush(stdout);
  if (a.no_torch) return;
  double theirs = 0;
  std::string best;
  std::stringstream list(a.torch_coretypes);
  for (std::string ct; std::getline(list, ct, ',');) {
    if (ct.empty()) continue;
    nlohmann::json t = run_torch(a, ct);
    double tps = t.at("tokens_per_s").get<double>();
    std::printf("%-34s %12.0f\n", ("PyTorch tokens/s, CORETYPE " + ct).c_str(), tps);
    std::fflush(stdout);
    if (tps > theirs) theirs = tps, best = ct;
  }
  MT_CHECK_INPUT(theirs > 0, "--torch-coretypes lists no value: give e.g. unset,SkylakeX");
  std::printf("%-34s %12.0f   (OPENBLAS_CORETYPE %s)\n", "PyTorch tokens/s, best", theirs, best.c_str());
  std::printf("%-34s %11.1f%%\n", bf16 ? "PyTorch MFU vs bf16 GEMM" : "PyTorch MFU vs SGEMM",
              100 * flops_tok * theirs / (sgemm * 1e9));
  std::printf("%-34s %12.2fx  (goal >= 1.5x)\n", "meshtrain / PyTorch best", ours / theirs);
}

}  // namespace

void add_bench_train_command(CLI::App& bench) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* sub = bench.add_subcommand("train", "GPT training speed vs PyTorch, MFU and peak memory (gpt-bench shape)");
  sub->add_option("--threads", a->threads, "threads for both meshtrain and PyTorch")
      ->capture_default_str()
      ->check(kThreads);
  sub->add_option("--steps", a->steps, "timed steps")->capture_default_str()->check(kPositiveInt);
  sub->add_option("--warmup", a->warmup, "untimed steps first")->capture_default_str()->check(kNonNegativeInt);
  sub->add_option("--batch-size", a->batch, "sequences per step")->capture_default_str()->check(kPositiveInt);
  sub->add_option("--seq-len", a->seq, "tokens per sequence")->capture_default_str()->check(kPositiveInt);
  sub->add_option("--n-layer", a->shape.n_layer)->capture_default_str()->check(kPositiveInt);
  sub->add_option("--n-head", a->shape.n_head)->capture_default_str()->check(kPositiveInt);
  sub->add_option("--n-embd", a->shape.n_embd)->capture_default_str()->check(kPositiveInt);
  sub->add_option("--vocab-size", a->shape.vocab_size)->capture_default_str()->check(CLI::Range(1, 65536));
  sub->add_option("--torch-script", a->torch_script, "the PyTorch peer")->capture_default_str();
  sub->add_flag("--no-torch", a->no_torch, "skip the PyTorch peer");
  add_enum_option(sub, "--precision", a->precision,
                  "fp32 | bf16: meshtrain's products (as train --precision) and PyTorch's (bf16: torch.autocast); "
                  "MFU is then against the bf16 GEMM rate",
                  true);
  sub->add_option("--torch-coretypes", a->torch_coretypes,
                  "OPENBLAS_CORETYPE values to run PyTorch with (unset = none); the best counts")
      ->capture_default_str();
  sub->callback([a] {
    a->shape.n_positions = std::max(a->shape.n_positions, a->seq);
    run(*a);
  });
}

}  // namespace mt::cli
