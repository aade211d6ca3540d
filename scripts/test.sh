#!/usr/bin/env bash
# Sets up (apt, idempotent), builds and runs the whole test suite. This is the README's test command and
# what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's time goes to stderr when it ends ("test.sh: <stage> took N s"), so CI's log shows where time goes.
stage_start=$SECONDS
stage_done() { echo "test.sh: $1 took $((SECONDS - stage_start)) s (total $SECONDS s)" >&2; stage_start=$SECONDS; }
bash scripts/setup.sh test
stage_done "setup"
BUILD=${BUILD_DIR:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release > "$BUILD.cmake.log" 2>&1 || { cat "$BUILD.cmake.log"; exit 1; }
cmake --build "$BUILD" -j "$(nproc)"
stage_done "build"
# OpenMPI refuses to run as root without these; the tests start mpirun with --oversubscribe themselves.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
(cd "$BUILD" && ctest --output-on-failure -j "$(nproc)" --timeout 900)
stage_done "ctest"
# The OpenBLAS backend (-DMESHTRAIN_BLAS=openblas, the build option beside the default oneDNN) must keep
# building and computing right; its build doubles as the sanitizer build: AddressSanitizer (with its leak
# check) and UndefinedBehaviorSanitizer at -O1 with assertions, running the unit, io and comm tests (the
# kernels, layers, models, optimizers, readers and collectives). Any report stops the test that made it.
SAN="$BUILD-openblas-asan"
cmake -S . -B "$SAN" -DCMAKE_BUILD_TYPE=Release -DMESHTRAIN_BLAS=openblas -DMESHTRAIN_SANITIZE="address,undefined" \
  -DMESHTRAIN_PYTHON=OFF \
  > "$SAN.cmake.log" 2>&1 || { cat "$SAN.cmake.log"; exit 1; }
cmake --build "$SAN" -j "$(nproc)" --target test_unit test_io test_comm
stage_done "ASan + UBSan build"
# Mpi.* run under mpirun in the main build (tests/comm/extra.cmake); Bf16Env.* needs its variable per run.
# allocator_may_return_null: the tests of failed allocations ask for more than ASan allows and expect null.
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
for t in unit io comm; do
  "$SAN/tests/test_$t" --gtest_brief=1 --gtest_filter="-Mpi.*:Bf16Env.*"
done
unset ASAN_OPTIONS UBSAN_OPTIONS
stage_done "ASan + UBSan tests"
# ThreadSanitizer: the comm tests (the collectives, their waits and the failure paths) in a build of their own,
# which compiles only the communication library (src/comm, src/core) and tests/comm. MESHTRAIN_TSAN=0 skips it.
if [ "${MESHTRAIN_TSAN:-1}" = 1 ]; then
  TSAN="$BUILD-tsan"
  cmake -S . -B "$TSAN" -DCMAKE_BUILD_TYPE=Release -DMESHTRAIN_SANITIZE=thread -DMESHTRAIN_PYTHON=OFF -DMESHTRAIN_BENCH=OFF \
    > "$TSAN.cmake.log" 2>&1 || { cat "$TSAN.cmake.log"; exit 1; }
  cmake --build "$TSAN" -j "$(nproc)" --target test_comm
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 "$TSAN/tests/test_comm" --gtest_brief=1 --gtest_filter="-Mpi.*"
  stage_done "ThreadSanitizer build and comm tests"
fi
# The readers' fuzz targets (clang's libFuzzer), each for a bounded time over its seed corpus: 10 s each here
# (FUZZ_SECONDS), to keep the whole command within CI's budget; scripts/fuzz.sh alone runs 20 s each.
FUZZ_SECONDS="${FUZZ_SECONDS:-10}" BUILD_DIR="$BUILD" bash scripts/fuzz.sh
stage_done "fuzz"
