#!/bin/bash
# ZeRO 3 --offload optimizer,params at batch 4, widths 384 and 512 (GPT 4 layers, V 8192, T 256, one rank, one
# thread, 8M tiles): this build's exact and --overlap-update steps against main's overlapped step (before off8) and,
# optionally, a second base binary (session 17: main without the pieces, since removed), all alternating in every round of
# one job (bench/offload_bound_bench.py --base/--base2). Prints per kind and round step / max(compute, I/O) (the
# issue's figure; compute = the in-memory step of the same round) with the load, the forward's waits for the
# update (overlap_update.waited_s, of it the first group's) and writes the JSON beside the text.
# Usage: bash bench/offload_off8_ab.sh THIS_BINARY MAIN_BINARY [NO_PIECES_BINARY] [out-prefix]   (~3 min idle)
set -e
MT=$(realpath "$1")
BASE=$(realpath "$2")
NP=${3:+$(realpath "$3")}
OUT=${4:-bench/results/offload/off8_ab}
cd "$(dirname "$0")/.."
echo "host: $(uname -r), load $(cut -d' ' -f1 /proc/loadavg), $(date -u +%FT%TZ); this $MT; base (main) $BASE;" \
     "base2 (no pieces) ${NP:-none}"
/usr/bin/python3 bench/offload_bound_bench.py --meshtrain "$MT" --base "$BASE" ${NP:+--base2 "$NP"} --widths 384,512 \
  --batch 4 --steps 8 --rounds 3 --kinds "opt+params,opt+params overlapped" --out "${OUT}.json"
