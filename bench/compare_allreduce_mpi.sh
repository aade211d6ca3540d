#!/usr/bin/env bash
# Times meshtrain's shared-memory all-reduce and OpenMPI's MPI_Allreduce at the same sizes (4 KB .. 256 MB)
# and rank count, in one run, and prints the nccl-tests style table with the bus-bandwidth ratio
# (ours / OpenMPI) and the single-thread memcpy bandwidth. `meshtrain bench comm` starts the OpenMPI side
# itself (mpirun --oversubscribe -np N meshtrain bench comm --mpi-native).
#
#   bench/compare_allreduce_mpi.sh [NPROC] [extra `bench comm` flags, e.g. --ops all_reduce,all_gather]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${MESHTRAIN_BIN:-build/meshtrain}
NP=${1:-2}
shift || true
# OpenMPI refuses to run as root without these.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec "$BIN" bench comm --nproc "$NP" --ops all_reduce --min-bytes 4K --max-bytes 256M "$@"
