#!/bin/bash
# ZeRO 3 offload, exact step against --overlap-update (the exact update on its own thread, each group's next
# forward waiting for its own shard's update), A/B in one job: bench/offload_bound_bench.py alternates the
# in-memory run, the exact offloaded runs and the overlapped ones in every round (same binary), at widths 384 and
# 512, batch 4 and 16, and prints step / max(compute, I/O) and step / in memory for each.
# Usage: bash bench/offload_overlap_ab.sh [build/meshtrain] [out-prefix]   (about 15 min on an idle 2-core host)
set -e
MT=${1:-build/meshtrain}
OUT=${2:-bench/results/offload/overlap_ab}
cd "$(dirname "$0")/.."
echo "host: $(uname -r), load $(cut -d' ' -f1 /proc/loadavg), $(date -u +%FT%TZ)"
KINDS="opt+params,opt+params overlapped,opt+params+grads,opt+params+grads overlapped"
/usr/bin/python3 bench/offload_bound_bench.py --meshtrain "$MT" --widths 384,512 --batch 4 --steps 8 --rounds 3 \
  --kinds "$KINDS" --out "${OUT}_batch4.json"
/usr/bin/python3 bench/offload_bound_bench.py --meshtrain "$MT" --widths 384,512 --batch 16 --steps 6 --rounds 2 \
  --kinds "$KINDS" --out "${OUT}_batch16.json"
