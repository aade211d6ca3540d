#!/usr/bin/env bash
# Hierarchical collectives across 2 namespace hosts x 2 ranks (scripts/hosts.sh), each link limited to RATE each
# way (tc tbf): the MPI backend with MESHTRAIN_MPI_HIER=1 (hierarchical all-reduce and all-gather,
# src/comm/mpi/hier_allreduce.h, hier_allgather.h) against MESHTRAIN_MPI_HIER=0 (OpenMPI's own algorithms over all
# 4 ranks), back to back, ROUNDS times alternating, at 1 MB .. 8 MB, for each op in OPS. Then the bytes between the
# hosts per call, from the interface counters: at 4 MB each side runs exactly 8 calls (2 warm-up, 1 timing probe,
# 5 batches of 1: bench comm's minimum with a 1 ms budget and calls slower than 2 ms), minus a run at 4 KB (start-up
# traffic), divided by 8. Prints the kernel and ISA first. Flat / hierarchical > 1: hierarchical is faster.
#
#   bench/hier_allreduce_hosts.sh [RATE=200mbit] [ROUNDS=2] [OPS=all_reduce,all_gather]
# Environment: PER_HOST=k ranks on each of the 2 hosts (default 2; 4 is the 3-D mesh test's 2 x 4); SIDES (default
# "hier flat"; "auto" leaves MESHTRAIN_MPI_HIER unset: the backend's default), where "ring" is flat with OpenMPI's ring all-reduce forced (the MPI backend calls MPI_Iallreduce, so
# libnbc's algorithm 1: 2(n-1)/n S per rank to its neighbour, so 2(n-1)/n S each way between the hosts: 1.5 S on
# 2 x 2, 1.75 S on 2 x 4).
# Needs root (network namespaces). Removes its hosts at the end, also on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${MESHTRAIN_BIN:-build/meshtrain}
RATE=${1:-200mbit}
ROUNDS=${2:-2}
OPS=${3:-all_reduce,all_gather}
P=hb$$
trap 'bash scripts/hosts.sh --prefix $P down' EXIT
echo "host: $(uname -r), $(grep -m1 -o -w -E 'avx512f|avx2' /proc/cpuinfo | tail -1 || echo 'no avx2'), $(nproc) cores," \
     "load $(cut -d' ' -f1-3 /proc/loadavg); links $RATE each way; 2 hosts x ${PER_HOST:-2} ranks; $(date -u +%FT%TZ)"
bash scripts/hosts.sh --prefix "$P" up 2 --rate "$RATE"
wire() { bash scripts/hosts.sh --prefix "$P" bytes | awk '{s += ($1 == "launcher") ? -$3 : $2} END {printf "%.0f\n", s}'; }
PER_HOST=${PER_HOST:-2}
SIDES=${SIDES:-hier flat}
side_env() {
  case "$1" in
    flat) echo "-x MESHTRAIN_MPI_HIER=0" ;;
    ring) echo "-x MESHTRAIN_MPI_HIER=0 --mca coll_libnbc_iallreduce_algorithm 1" ;;
    auto) echo "" ;;
    *) echo "-x MESHTRAIN_MPI_HIER=1" ;;
  esac
}
bench() {  # bench SIDE OPS MIN MAX SECONDS
  # shellcheck disable=SC2046
  bash scripts/hosts.sh --prefix "$P" mpirun "$PER_HOST" $(side_env "$1") "$BIN" bench comm --nproc $((2 * PER_HOST)) --ops "$2" --no-mpi-peer \
    --min-bytes "$3" --max-bytes "$4" --seconds-per-size "$5" --comm-timeout 120 2>/dev/null
}
for round in $(seq 1 "$ROUNDS"); do
  for side in $SIDES; do
    bench "$side" "$OPS" 1M 8M 1 | grep -v -E '^# (meshtrain|S =|busbw|time|ratio|stores|note)' | sed "s/^/$side r$round | /"
  done
done
IFS=, read -r -a ops <<< "$OPS"
for op in "${ops[@]}"; do
  for side in $SIDES; do
    b0=$(wire); bench "$side" "$op" 4K 4K 0.001 > /dev/null; b1=$(wire)
    bench "$side" "$op" 4M 4M 0.001 > /dev/null; b2=$(wire)
    base=$((b1 - b0)); run=$((b2 - b1))
    echo "bytes | $op $side 4 MB: $(( (run - base) / 8 )) bytes between hosts per call" \
         "= $(awk -v b=$(( (run - base) / 8 )) 'BEGIN {printf "%.2f", b / 4194304}') S (run $run, start-up $base)"
  done
done
