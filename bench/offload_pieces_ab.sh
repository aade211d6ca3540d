#!/bin/bash
# ZeRO 3 --overlap-update at width 384, batch 4 (GPT 4 layers, V 8192, T 256, one thread, 8M tiles): the exact
# offloaded step, the overlapped one, and (with a second binary) the overlapped one of that binary, alternating
# in every round of one job (bench/offload_bound_bench.py --base). Prints per kind and round
# step / max(compute, I/O) with the load and the forward's wait for the update (overlap_update.waited_s).
# Usage: bash bench/offload_pieces_ab.sh [build/meshtrain] [base binary or ""] [out-prefix]   (about 5 min idle)
set -e
MT=$(realpath "${1:-build/meshtrain}")
BASE=${2:+$(realpath "$2")}
OUT=${3:-bench/results/offload/pieces_ab}
cd "$(dirname "$0")/.."
echo "host: $(uname -r), load $(cut -d' ' -f1 /proc/loadavg), $(date -u +%FT%TZ); binary $MT; base ${BASE:-none}"
/usr/bin/python3 bench/offload_bound_bench.py --meshtrain "$MT" ${BASE:+--base "$BASE"} --widths 384 --batch 4 \
  --steps 8 --rounds 4 --kinds "opt+params,opt+params overlapped" --out "${OUT}.json"
