#!/usr/bin/env bash
# Builds the fuzz targets of meshtrain's file readers (fuzz/: libFuzzer with AddressSanitizer and
# UndefinedBehaviorSanitizer, clang) and runs each for a bounded time, starting from its seed corpus in
# fuzz/corpus/<target>/. New inputs the fuzzer finds go to a scratch directory, not into the repository.
# A crash, a sanitizer report, a leak or a hang (FUZZ_TIMEOUT seconds on one input) fails the script and
# leaves the input that did it in $BUILD-fuzz/findings/<target>/ (rerun it: $BUILD-fuzz/<target>_fuzz FILE).
#   FUZZ_SECONDS  time per target (default 20)
#   BUILD_DIR     build directory prefix (default build; the fuzz build goes to $BUILD_DIR-fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${FUZZ_SECONDS:-20}
ROOT=$(pwd)
OUT="${BUILD_DIR:-build}-fuzz"
case "$OUT" in /*) ;; *) OUT="$ROOT/$OUT" ;; esac
cmake -S fuzz -B "$OUT" -DCMAKE_CXX_COMPILER=clang++ > "$OUT.cmake.log" 2>&1 || { cat "$OUT.cmake.log"; exit 1; }
cmake --build "$OUT" -j "$(nproc)"
status=0
for corpus in fuzz/corpus/*/; do
  t=$(basename "$corpus")
  work="$OUT/findings/$t"
  rm -rf "$work" && mkdir -p "$work/grown"
  # -timeout: one input taking longer is a finding (a hang); -rss_limit_mb: so is runaway memory.
  if (cd "$work" && "$OUT/${t}_fuzz" grown "$ROOT/$corpus" -max_total_time="$SECONDS_PER_TARGET" \
        -timeout="${FUZZ_TIMEOUT:-10}" -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 > log 2>&1); then
    echo "fuzz $t: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$work/log" | grep -o '[0-9]*$') inputs" \
         "in ${SECONDS_PER_TARGET} s, no finding"
  else
    echo "fuzz $t: FINDING (input in $work, log below)" >&2
    tail -40 "$work/log" >&2
    status=1
  fi
done
exit $status
