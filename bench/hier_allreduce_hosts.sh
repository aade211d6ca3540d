#!/usr/bin/env bash
# All-reduce across 2 namespace hosts x 2 ranks (scripts/hosts.sh) with each link limited to RATE each way (tc tbf):
# the MPI backend's hierarchical all-reduce (src/comm/mpi/hier_allreduce.h, MESHTRAIN_MPI_HIER=1) against the
# same backend with MESHTRAIN_MPI_HIER=0 (OpenMPI's MPI_Iallreduce over all 4 ranks, its own algorithm choice),
# back to back, ROUNDS times alternating, at 1 MB .. 8 MB. For each side it prints `meshtrain bench comm`'s
# table and the bytes that crossed between the hosts during that side's run (interface counters). The time
# ratio per size is flat / hierarchical (> 1: hierarchical is faster). Prints the kernel and ISA first.
#
#   bench/hier_allreduce_hosts.sh [RATE=200mbit] [ROUNDS=2]
# Needs root (network namespaces). Removes its hosts at the end, also on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${MESHTRAIN_BIN:-build/meshtrain}
RATE=${1:-200mbit}
ROUNDS=${2:-2}
P=hb$$
trap 'bash scripts/hosts.sh --prefix $P down' EXIT
echo "host: $(uname -r), $(grep -m1 -o -w -E 'avx512f|avx2' /proc/cpuinfo | tail -1 || echo 'no avx2'), $(nproc) cores;" \
     "links $RATE each way; $(date -u +%FT%TZ)"
bash scripts/hosts.sh --prefix "$P" up 2 --rate "$RATE"
wire() { bash scripts/hosts.sh --prefix "$P" bytes | awk '{s += ($1 == "launcher") ? -$3 : $2} END {print s}'; }
for round in $(seq 1 "$ROUNDS"); do
  for side in hier flat; do
    env=(-x MESHTRAIN_MPI_HIER=1); [ "$side" = flat ] && env=(-x MESHTRAIN_MPI_HIER=0)
    b0=$(wire)
    bash scripts/hosts.sh --prefix "$P" mpirun 2 "${env[@]}" "$BIN" bench comm --nproc 4 --ops all_reduce --no-mpi-peer \
      --min-bytes 1M --max-bytes 8M --seconds-per-size 1 --comm-timeout 120 2>/dev/null | sed "s/^/$side r$round | /"
    echo "$side r$round | bytes between hosts during the run: $(( $(wire) - b0 ))"
  done
done
