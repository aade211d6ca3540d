// The arithmetic ceiling of this machine: fused multiply-adds per second on registers only (no memory
// traffic), the number model FLOPs utilization is measured against besides the GEMM rate.
#pragma once

#include <string>

namespace mt {

struct FmaPeak {
  double gflops = 0;  // float32 FLOP / 1e9 per second of CPU time each thread got (one FMA = 2 FLOP), summed
                      // over threads: the ceiling of `threads` cores, whoever else runs on them
  int threads = 1;
  std::string isa;    // the widest FMA the binary was built with: "avx512", "avx2", "scalar"
};

// Runs `threads` OpenMP threads, each doing independent FMA chains for about `seconds` of its CPU time.
FmaPeak measure_fma_peak(int threads, double seconds);

// The bf16 ceiling (--precision bf16's products): vdpbf16ps chains, each instruction 32 bf16 products added
// pairwise into 16 float32 lanes (64 FLOP, twice a float32 FMA's 32). isa "avx512_bf16"; on a CPU without
// it, gflops 0 and isa "none" (the emulated path's ceiling is measure_fma_peak's).
FmaPeak measure_bf16_peak(int threads, double seconds);

}  // namespace mt
