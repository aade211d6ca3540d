#!/usr/bin/env bash
# The newcomer's main job: set up (apt, idempotent), build, make a byte-level corpus from Debian's
# `fortunes` package, train a small GPT on it across local worker processes (data-parallel over shared
# memory, one per core) with progress on the terminal, then print a sample.
# Outputs land in out/demo/ (metrics.jsonl, summary.json, model.safetensors, checkpoints/, report.html).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh run
BUILD=${BUILD_DIR:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release > "$BUILD.cmake.log" 2>&1 || { cat "$BUILD.cmake.log"; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" --target meshtrain
MT="$BUILD/meshtrain"
OUT=out/demo
mkdir -p "$OUT"

# Every plain-text fortune file (the .dat indexes and .u8 links are skipped), about 2.5 MB of English.
: > "$OUT/corpus.txt"
for f in /usr/share/games/fortunes/*; do
  case "$f" in *.dat|*.u8) continue ;; esac
  [ -f "$f" ] && cat "$f" >> "$OUT/corpus.txt"
done
size=$(stat -c %s "$OUT/corpus.txt")
val=$((size / 20))
head -c $((size - val)) "$OUT/corpus.txt" > "$OUT/train.txt"
tail -c "$val" "$OUT/corpus.txt" > "$OUT/val.txt"
"$MT" prepare --text "$OUT/train.txt" --out "$OUT/train.bin"
"$MT" prepare --text "$OUT/val.txt" --out "$OUT/val.bin"

"$MT" train --model gpt --data "$OUT/train.bin" --val-data "$OUT/val.bin" \
  --n-layer 4 --n-head 4 --n-embd 192 --vocab-size 256 --n-positions 128 \
  --batch-size 16 --seq-len 128 --steps "${DEMO_STEPS:-500}" \
  --lr 2e-3 --min-lr 2e-4 --warmup-steps 50 --weight-decay 0.1 --grad-clip 1.0 \
  --nproc "${DEMO_NPROC:-$(nproc)}" --threads 1 --zero 1 \
  --eval-every 100 --eval-batches 8 --log-every 25 \
  --checkpoint-dir "$OUT/checkpoints" --save-every 250 \
  --metrics "$OUT/metrics.jsonl" --summary "$OUT/summary.json" --save "$OUT/model.safetensors"

echo
echo "=== sample (temperature 0.8, top-k 40) ==="
"$MT" sample --init "$OUT/model.safetensors" --prompt "The " --max-new-tokens 400 --temperature 0.8 --top-k 40

echo
echo "=== report ==="
"$MT" report "$OUT" -o "$OUT/report.html"
echo "open $OUT/report.html in a browser: loss and validation curves, throughput, bytes sent, memory per rank"
