#!/usr/bin/env bash
# Runs an MPI program on this host only, over loopback: run_mpi.sh NP PROGRAM [ARGS...]
set -euo pipefail
np=$1
shift
flags=(--oversubscribe --mca btl self,vader -x CFX_SOCKET_IFNAME=lo)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
export OMPI_MCA_btl_vader_single_copy_mechanism=none
exec timeout 240 mpirun -np "$np" "${flags[@]}" "$@"
