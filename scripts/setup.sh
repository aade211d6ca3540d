#!/usr/bin/env bash
# Installs every dependency meshtrain needs from Debian packages. Idempotent: packages already present are
# not touched and apt is not even called. Run as root (or with sudo available).
set -euo pipefail

PKGS=(
  g++ cmake make pkg-config
  libdnnl-dev ocl-icd-opencl-dev  # oneDNN matrix products (default backend); its CMake config wants OpenCL
  libopenblas-dev          # CBLAS for matrix products (the -DMESHTRAIN_BLAS=openblas backend)
  libcli11-dev             # command-line parsing
  nlohmann-json3-dev       # JSON (metrics, traces, safetensors headers)
  libicu-dev               # Unicode classes for GPT-2's tokenizer (src/data/unicode_class.cpp)
  libgtest-dev googletest  # unit tests
  libbenchmark-dev         # micro-benchmarks
  libopenmpi-dev openmpi-bin  # multi-host backend and mpirun
  python3-torch python3-numpy # independent reference for parity tests and benchmarks
  nodejs npm               # reference GPT-2 encoders (npm packages) for the tokenizer test and bench
  fortunes                 # a real English text corpus for the demo
)

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
