#!/usr/bin/env bash
# Installs the Debian packages meshtrain needs, by profile:
#   bash scripts/setup.sh run    building and running on one machine (the demo): compiler, CMake, oneDNN, CLI11,
#                                toml++, JSON, ICU, fortunes
#   bash scripts/setup.sh mpi    the above and OpenMPI (the multi-host backend and mpirun)
#   bash scripts/setup.sh test   the above and what the tests and benchmarks add: GoogleTest, Google
#                                Benchmark, OpenBLAS (the second GEMM backend), PyTorch and NumPy (the
#                                independent reference), Node.js and npm (the reference GPT-2 encoders),
#                                Chromium (headless: the browser test of meshtrain report's page),
#                                pybind11 and Python's headers (the Python module), clang (libFuzzer:
#                                the fuzz targets)
#   bash scripts/setup.sh bench  the above and fio (bench/offload_bench.py, bench/offload_fio_bench.py: the offload
#                                files' bandwidth against fio on the same directory)
# No argument means test. Idempotent: packages already present are not touched and apt is not
# even called. Run as root (or with sudo available).
set -euo pipefail

RUN_PKGS=(
  g++ cmake make pkg-config
  libdnnl-dev ocl-icd-opencl-dev  # oneDNN matrix products (default backend); its CMake config wants OpenCL
  libcli11-dev             # command-line parsing
  libtomlplusplus-dev      # TOML run configuration files (meshtrain train --config)
  nlohmann-json3-dev       # JSON (metrics, traces, safetensors headers)
  libicu-dev               # Unicode classes for GPT-2's tokenizer (src/data/unicode_class.cpp)
  fortunes                 # a real English text corpus for the demo
  liburing-dev             # io_uring for the offload files (optional: without it one pread/pwrite at a time)
)
MPI_PKGS=(
  libopenmpi-dev openmpi-bin  # multi-host backend and mpirun (optional: without it, shared memory only)
)
TEST_PKGS=(
  libopenblas-dev          # CBLAS for matrix products (the -DMESHTRAIN_BLAS=openblas backend)
  libgtest-dev googletest  # unit tests
  libbenchmark-dev         # micro-benchmarks
  python3-torch python3-numpy # independent reference for parity tests and benchmarks
  pybind11-dev python3-dev # the Python module `import meshtrain` (python/) and its test
  nodejs npm               # reference GPT-2 encoders (npm packages) for the tokenizer test and bench
  chromium                 # headless browser for tests/report/test_report_browser.py
  clang                    # libFuzzer and its sanitizers for the readers' fuzz targets (fuzz/, scripts/fuzz.sh)
)

BENCH_PKGS=(
  fio                      # disk bandwidth reference for the offload benchmarks
)

case "${1:-test}" in
  run) PKGS=("${RUN_PKGS[@]}") ;;
  mpi) PKGS=("${RUN_PKGS[@]}" "${MPI_PKGS[@]}") ;;
  test) PKGS=("${RUN_PKGS[@]}" "${MPI_PKGS[@]}" "${TEST_PKGS[@]}") ;;
  bench) PKGS=("${RUN_PKGS[@]}" "${MPI_PKGS[@]}" "${TEST_PKGS[@]}" "${BENCH_PKGS[@]}") ;;
  *) echo "setup.sh: unknown profile '$1'; use run (build and run), mpi (and OpenMPI), test (also tests and" \
       "benchmarks) or bench (also fio)" >&2; exit 2 ;;
esac

missing=()
for p in "${PKGS[@]}"; do
  # Node.js from elsewhere (e.g. NodeSource's nodejs, which bundles npm) counts: Debian's npm would conflict.
  if [ "$p" = nodejs ] && command -v node > /dev/null; then continue; fi
  if [ "$p" = npm ] && command -v npm > /dev/null; then continue; fi
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PKGS[@]} packages already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
