// Peak float32 FMA rate of this machine (register-only FMA chains; see src/tensor/fma_peak.cpp), per
// thread count: the physical ceiling `meshtrain bench train` reports MFU against; and the bf16 dot-product
// (vdpbf16ps) rate where the CPU has it, the ceiling of --precision bf16.
// Usage: fma_peak [max_threads] [seconds]
#include <omp.h>

#include <cstdio>
#include <cstdlib>

#include "tensor/fma_peak.h"

int main(int argc, char** argv) {
  int max_threads = argc > 1 ? std::atoi(argv[1]) : omp_get_num_procs();
  double seconds = argc > 2 ? std::atof(argv[2]) : 1.0;
  if (max_threads < 1 || seconds <= 0) {
    std::fprintf(stderr, "usage: fma_peak [max_threads >= 1] [seconds > 0]\n");
    return 1;
  }
  std::printf("%8s %12s %14s  %-8s %14s  %s\n", "threads", "GFLOP/s", "per thread", "ISA", "bf16 GFLOP/s", "bf16 ISA");
  for (int t = 1; t <= max_threads; t++) {
    mt::FmaPeak p = mt::measure_fma_peak(t, seconds);
    mt::FmaPeak b = mt::measure_bf16_peak(t, seconds);
    std::printf("%8d %12.1f %14.1f  %-8s %14.1f  %s\n", t, p.gflops, p.gflops / t, p.isa.c_str(), b.gflops,
                b.isa.c_str());
  }
  return 0;
}
