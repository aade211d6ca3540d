#!/usr/bin/env bash
# Times meshtrain's shared-memory collectives (all-reduce, reduce-scatter, all-gather, broadcast, all-to-all,
# all-to-all-v) and OpenMPI's own (MPI_Allreduce, MPI_Reduce_scatter, MPI_Allgatherv, MPI_Bcast, MPI_Alltoall,
# MPI_Alltoallv) at the same sizes (4 KB .. 256 MB) and rank count, in one run, and prints the nccl-tests
# style tables with the bus-bandwidth ratio (ours / OpenMPI) and the single-thread memcpy bandwidth.
# `meshtrain bench comm` starts the OpenMPI side itself (mpirun --oversubscribe -np N meshtrain bench comm
# --mpi-native). The name is historical (it began with all-reduce only).
#
#   bench/compare_allreduce_mpi.sh [NPROC] [extra `bench comm` flags, e.g. --ops all_reduce,all_gather --rounds 3]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${MESHTRAIN_BIN:-build/meshtrain}
NP=${1:-2}
shift || true
# OpenMPI refuses to run as root without these.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec "$BIN" bench comm --nproc "$NP" --min-bytes 4K --max-bytes 256M "$@"
