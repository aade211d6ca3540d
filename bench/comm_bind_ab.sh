#!/bin/bash
# A/B of the shm defaults in one job: "bound" = the defaults (ranks bound when ranks x threads fit the allowed CPUs,
# single copy from 32 KB, spinning single-copy waits) against "unbound" = MESHTRAIN_SHM_BIND=0 (the defaults before
# session 16: no binding, single copy from 16 MB, yielding single-copy waits), PAIRS pairs alternating in order.
# Usage: bash bench/comm_bind_ab.sh MESHTRAIN OUT [PAIRS=3] [MIN=32K] [MAX=256M]
# Summary: /usr/bin/python3 bench/comm_repeat.py --summarize OUT --by-label
set -u
MT=$1 OUT=$2 PAIRS=${3:-3} MIN=${4:-32K} MAX=${5:-256M}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
{
  echo "# $MT bench comm --nproc 2 --ops all_gather,all_to_all,all_to_all_v --min-bytes $MIN --max-bytes $MAX --bound --rounds 1"
  echo "# host: kernel $(uname -r), $(grep -qw avx512f /proc/cpuinfo && echo avx512f || echo no-avx512f), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) cores"
  for i in $(seq 1 "$PAIRS"); do
    if [ $((i % 2)) = 1 ]; then order="bound unbound"; else order="unbound bound"; fi
    for v in $order; do
      echo "# ===== $v $i"
      echo "# start $(date -u +%H:%M:%S) UTC load $(cut -d' ' -f1-3 /proc/loadavg)"
      if [ $v = unbound ]; then bind=0; else bind=; fi
      env ${bind:+MESHTRAIN_SHM_BIND=$bind} "$MT" bench comm --nproc 2 --ops all_gather,all_to_all,all_to_all_v \
        --min-bytes "$MIN" --max-bytes "$MAX" --bound --rounds 1 2>&1
      echo "# exit $? end load $(cut -d' ' -f1-3 /proc/loadavg)"
    done
  done
} > "$OUT"
