// GEMM through oneDNN matmul primitives (the default backend; see blas.h). oneDNN picks its kernel from the
// instruction set CPUID reports (AVX-512, AVX2+FMA, ...), not from the CPU model, so a hypervisor that hides
// the model costs nothing. Debian's oneDNN is built on the OpenMP runtime (libgomp, the same as ours): one
// thread pool serves its kernels and meshtrain's loops, omp_set_num_threads() sets its width, and a call
// made inside a parallel region (attention's per-head products) runs on the calling thread.
//
// Primitives are cached per (shape, strides, alpha, beta, epilogue, threads): creating one costs ~50-500 us
// (kernel JIT, blocking plan), executing a cached one adds ~2 us to the product. A training run meets a
// few dozen shapes, so the cache stays small. Scratchpads are owned by the caller (one per thread), so one
// primitive may run on several threads at once.
//
// Precision::bf16 on a CPU with bf16 instructions: A and B are packed into this thread's bf16 copies (as
// stored, row stride = stored columns; one pass over each, threaded when large) and a matmul with bf16 sources
// and weights and float32 destination, bias, scales and sum multiplies them (vdpbf16ps: exact products of bf16
// pairs, float32 accumulation). Elsewhere, or when forced, the emulated path of gemm_bf16.cpp.
#include <dnnl.hpp>
#include <omp.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "tensor/bf16.h"
#include "tensor/blas.h"
#include "tensor/gemm_bf16.h"

namespace mt {

namespace {

using dnnl::memory;

int g_threads = 1;

struct Key {
  bool ta, tb, bias, in_parallel, bf16;
  int M, N, K, lda, ldb, ldc, threads;
  uint32_t alpha, beta;  // bit patterns
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 0;
    for (uint64_t v : {(uint64_t)k.ta, (uint64_t)k.tb, (uint64_t)k.bias, (uint64_t)k.in_parallel, (uint64_t)k.bf16,
                       (uint64_t)k.M, (uint64_t)k.N, (uint64_t)k.K, (uint64_t)k.lda, (uint64_t)k.ldb, (uint64_t)k.ldc,
                       (uint64_t)k.threads, (uint64_t)k.alpha, (uint64_t)k.beta})
      h = (h ^ v) * 0x100000001b3ull;
    return h;
  }
};

struct Entry {
  dnnl::matmul prim;
  memory::desc a, b, c, bias, scratch;
  size_t scratch_bytes = 0;
  std::string impl;
};

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

std::mutex g_mu;
std::unordered_map<Key, std::unique_ptr<Entry>, KeyHash> g_cache;  // entries never move or die
std::vector<std::string> g_impls;                                  // distinct kernel names, first use first

// op(A)[M,K] of a row-major A with row stride ld: transposed storage reads it with strides {1, ld}.
memory::desc matrix(int rows, int cols, int ld, bool trans, memory::data_type dt = memory::data_type::f32) {
  return memory::desc({rows, cols}, dt, trans ? memory::dims{1, ld} : memory::dims{ld, 1});
}

std::unique_ptr<Entry> create(const Key& k, float alpha, float beta) {
  auto e = std::make_unique<Entry>();
  const memory::data_type in = k.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  e->a = matrix(k.M, k.K, k.lda, k.ta, in);
  e->b = matrix(k.K, k.N, k.ldb, k.tb, in);
  e->c = matrix(k.M, k.N, k.ldc, false);
  if (k.bias) e->bias = memory::desc({1, k.N}, memory::data_type::f32, memory::dims{k.N, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  try {
    dnnl::matmul::desc d = k.bias ? dnnl::matmul::desc(e->a, e->b, e->bias, e->c) : dnnl::matmul::desc(e->a, e->b, e->c);
    dnnl::matmul::primitive_desc pd(d, attr, cpu_engine());
    e->scratch = pd.scratchpad_desc();
    e->scratch_bytes = e->scratch.get_size();
    e->impl = pd.impl_info_str();
    e->prim = dnnl::matmul(pd);
  } catch (const dnnl::error& err) {
    throw Error(str("oneDNN cannot make a ", k.bf16 ? "bf16" : "f32", " matmul for ", k.ta ? "A^T" : "A", "[", k.M, "x",
                    k.K, "] ", k.tb ? "B^T" : "B", "[", k.K, "x", k.N, "] (lda ", k.lda, ", ldb ", k.ldb, ", ldc ",
                    k.ldc, "): ", err.what()));
  }
  return e;
}

const Entry& lookup(const Key& k, float alpha, float beta) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_cache.find(k);
  if (it != g_cache.end()) return *it->second;
  auto e = create(k, alpha, beta);
  bool seen = false;
  for (const std::string& s : g_impls) seen = seen || s == e->impl;
  if (!seen) g_impls.push_back(e->impl);
  return *g_cache.emplace(k, std::move(e)).first->second;
}

void execute(const Entry& e, const void* A, const void* B, const float* bias, float* C) {
  thread_local dnnl::stream stream(cpu_engine());
  // This thread's scratchpad, page-aligned (oneDNN's kernels may use aligned vector stores in it).
  thread_local std::unique_ptr<uint8_t, decltype(&std::free)> scratch(nullptr, &std::free);
  thread_local size_t scratch_size = 0;
  if (scratch_size < e.scratch_bytes) {
    scratch_size = (e.scratch_bytes + 4095) / 4096 * 4096;
    scratch.reset(static_cast<uint8_t*>(std::aligned_alloc(4096, scratch_size)));
    MT_REQUIRE(Error, scratch, "cannot allocate ", scratch_size, " bytes of GEMM scratchpad");
  }
  dnnl::engine& eng = cpu_engine();
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(e.a, eng, const_cast<void*>(A))},
                                       {DNNL_ARG_WEIGHTS, memory(e.b, eng, const_cast<void*>(B))},
                                       {DNNL_ARG_DST, memory(e.c, eng, C)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, memory(e.bias, eng, const_cast<float*>(bias)));
  if (e.scratch_bytes) args.emplace(DNNL_ARG_SCRATCHPAD, memory(e.scratch, eng, scratch.get()));
  e.prim.execute(stream, args);
}

Key make_key(bool ta, bool tb, bool bias, int M, int N, int K, int lda, int ldb, int ldc, float alpha, float beta,
             bool bf16 = false) {
  const bool par = omp_in_parallel();
  // oneDNN sizes its work split by omp_get_max_threads() when a primitive is made and runs that many threads:
  // keep it equal to meshtrain's count on this thread (the OpenMP default is every core, and a process
  // forked from one whose OpenMP pool is up cannot start a team of more than one thread).
  if (!par && omp_get_max_threads() != g_threads) omp_set_num_threads(g_threads);
  return Key{ta,
             tb,
             bias,
             par,
             bf16,
             M,
             N,
             K,
             lda,
             ldb,
             ldc,
             par ? 1 : g_threads,
             std::bit_cast<uint32_t>(alpha),
             std::bit_cast<uint32_t>(beta)};
}

// The rows x cols matrix at src (row stride ld) as contiguous bf16 in this thread's copy of operand `slot` (0: A,
// 1: B): the backend's slots of packed_bf16_scratch, apart from its callers'.
const uint16_t* packed_bf16(int slot, const float* src, int rows, int cols, int ld) {
  return packed_bf16_scratch(2 + slot, src, rows, cols, ld);
}

bool isa_has(dnnl::cpu_isa isa, dnnl::cpu_isa want) {
  return (static_cast<unsigned>(isa) & static_cast<unsigned>(want)) == static_cast<unsigned>(want);
}

// C = beta * C (+ bias): the product of an empty K.
void scale_only(int M, int N, float beta, const float* bias, float* C, int ldc) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      float& c = C[(size_t)i * ldc + j];
      c = (beta == 0.0f ? 0.0f : beta * c) + (bias ? bias[j] : 0.0f);
    }
}

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic: return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "unknown";
  }
}

}  // namespace

namespace detail {

bool bf16_isa_native() {
  static const bool native = isa_has(dnnl::get_effective_cpu_isa(), dnnl::cpu_isa::avx512_core_bf16);
  return native;
}

std::string bf16_isa_name() {
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  return isa_has(isa, dnnl::cpu_isa::avx512_core_amx) ? "avx512_core_amx" : "avx512_core_bf16";
}

}  // namespace detail

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc, Precision prec) {
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_only(M, N, beta, nullptr, C, ldc);
  if (prec == Precision::bf16) {
    if (!bf16_native())
      return detail::gemm_bf16_emulated(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    // Stored shapes: A is [M,K], or [K,M] when transposed; B is [K,N], or [N,K].
    const int ac = trans_a ? M : K, bc = trans_b ? K : N;
    const uint16_t* a = packed_bf16(0, A, trans_a ? K : M, ac, lda);
    const uint16_t* b = packed_bf16(1, B, trans_b ? N : K, bc, ldb);
    const Entry& e = lookup(make_key(trans_a, trans_b, false, M, N, K, ac, bc, ldc, alpha, beta, true), alpha, beta);
    return execute(e, a, b, nullptr, C);
  }
  const Entry& e = lookup(make_key(trans_a, trans_b, false, M, N, K, lda, ldb, ldc, alpha, beta), alpha, beta);
  execute(e, A, B, nullptr, C);
}

void gemm_bias(int M, int N, int K, const float* A, const float* B, const float* bias, float* C, bool accumulate,
               Precision prec) {
  if (M == 0 || N == 0) return;
  const float beta = accumulate ? 1.0f : 0.0f;
  if (K == 0) return scale_only(M, N, beta, bias, C, N);
  if (prec == Precision::bf16) {
    if (!bf16_native()) return detail::gemm_bias_bf16_emulated(M, N, K, A, B, bias, C, accumulate);
    const uint16_t* a = packed_bf16(0, A, M, K, K);
    const uint16_t* b = packed_bf16(1, B, K, N, N);
    const Entry& e = lookup(make_key(false, false, true, M, N, K, K, N, N, 1.0f, beta, true), 1.0f, beta);
    return execute(e, a, b, bias, C);
  }
  const Entry& e = lookup(make_key(false, false, true, M, N, K, K, N, N, 1.0f, beta), 1.0f, beta);
  execute(e, A, B, bias, C);
}

void gemm_a16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A16, int lda,
              const float* B, int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_only(M, N, beta, nullptr, C, ldc);
  if (!bf16_native())
    return detail::gemm_a16_emulated(trans_a, trans_b, M, N, K, alpha, A16, lda, B, ldb, beta, C, ldc);
  const int bc = trans_b ? K : N;
  const uint16_t* b = packed_bf16(1, B, trans_b ? N : K, bc, ldb);
  const Entry& e = lookup(make_key(trans_a, trans_b, false, M, N, K, lda, bc, ldc, alpha, beta, true), alpha, beta);
  execute(e, A16, b, nullptr, C);
}

void gemm_bias_a16(int M, int N, int K, const uint16_t* A16, const float* B, const float* bias, float* C,
                   bool accumulate) {
  if (M == 0 || N == 0) return;
  const float beta = accumulate ? 1.0f : 0.0f;
  if (K == 0) return scale_only(M, N, beta, bias, C, N);
  if (!bf16_native()) return detail::gemm_bias_a16_emulated(M, N, K, A16, B, bias, C, accumulate);
  const uint16_t* b = packed_bf16(1, B, K, N, N);
  const Entry& e = lookup(make_key(false, false, true, M, N, K, K, N, N, 1.0f, beta, true), 1.0f, beta);
  execute(e, A16, b, bias, C);
}

void gemm_bias_16(int M, int N, int K, const uint16_t* A16, const uint16_t* B16, const float* bias, float* C,
                  bool accumulate) {
  if (M == 0 || N == 0) return;
  const float beta = accumulate ? 1.0f : 0.0f;
  if (K == 0) return scale_only(M, N, beta, bias, C, N);
  if (!bf16_native()) return detail::gemm_bias_16_emulated(M, N, K, A16, B16, bias, C, accumulate);
  const Entry& e = lookup(make_key(false, false, true, M, N, K, K, N, N, 1.0f, beta, true), 1.0f, beta);
  execute(e, A16, B16, bias, C);
}

void gemm_16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A16, int lda,
             const uint16_t* B16, int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_only(M, N, beta, nullptr, C, ldc);
  if (!bf16_native())
    return detail::gemm_16_emulated(trans_a, trans_b, M, N, K, alpha, A16, lda, B16, ldb, beta, C, ldc);
  const Entry& e = lookup(make_key(trans_a, trans_b, false, M, N, K, lda, ldb, ldc, alpha, beta, true), alpha, beta);
  execute(e, A16, B16, nullptr, C);
}

void set_num_threads(int n) {
  MT_CHECK_INPUT(n >= 1, "--threads must be >= 1, got ", n);
  g_threads = n;
  omp_set_num_threads(n);
}

int num_threads() { return g_threads; }

GemmKernel gemm_kernel() {
  GemmKernel k;
  const dnnl_version_t* v = dnnl_version();
  const char* rt = v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP"
                   : v->cpu_runtime == DNNL_RUNTIME_TBB ? "TBB"
                   : v->cpu_runtime == DNNL_RUNTIME_SEQ ? "sequential"
                                                        : "threadpool";
  k.library = str("oneDNN ", v->major, ".", v->minor, ".", v->patch, " (", rt, ")");
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (const std::string& s : g_impls) k.impl += (k.impl.empty() ? "" : ", ") + s;
  }
  if (k.impl.empty()) {  // nothing multiplied yet: the kernel a square product of this thread count gets
    Key probe{false, false, false, false, false, 256, 256, 256, 256, 256, 256, g_threads, std::bit_cast<uint32_t>(1.0f),
              0};
    k.impl = create(probe, 1.0f, 0.0f)->impl;
  }
  k.isa_detail = isa_name(dnnl::get_effective_cpu_isa());
  const std::string& d = k.isa_detail;
  k.isa = d.rfind("avx512", 0) == 0 ? "avx512" : d.rfind("avx2", 0) == 0 ? "avx2" : d == "avx" ? "avx" : "sse";
  return k;
}

std::string gemm_kernel_line() {
  GemmKernel k = gemm_kernel();
  return str(k.library, " matmul ", k.impl, ", ISA ", k.isa, " (", k.isa_detail, "), bf16: ", bf16_kernel_name());
}

}  // namespace mt
