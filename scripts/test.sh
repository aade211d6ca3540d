#!/usr/bin/env bash
# Sets up (apt, idempotent), builds and runs the whole test suite. This is the README's test command and
# what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
BUILD=${BUILD_DIR:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release > "$BUILD.cmake.log" 2>&1 || { cat "$BUILD.cmake.log"; exit 1; }
cmake --build "$BUILD" -j "$(nproc)"
# OpenMPI refuses to run as root without these; the tests start mpirun with --oversubscribe themselves.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
(cd "$BUILD" && ctest --output-on-failure -j "$(nproc)" --timeout 900)
# The OpenBLAS backend (-DMESHTRAIN_BLAS=openblas, the build option beside the default oneDNN) must keep
# building and computing right: its library and the unit tests (kernels, layers, models, optimizer).
OB="$BUILD-openblas"
cmake -S . -B "$OB" -DCMAKE_BUILD_TYPE=Release -DMESHTRAIN_BLAS=openblas > "$OB.cmake.log" 2>&1 || { cat "$OB.cmake.log"; exit 1; }
cmake --build "$OB" -j "$(nproc)" --target test_unit
"$OB/tests/test_unit" --gtest_brief=1
