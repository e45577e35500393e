#!/bin/bash
# Host ranks of one host over shm, processes: Conflux's defaults (the FIFO
# between processes, 1 MiB point-to-point FIFOs), Conflux as it was before
# (single copy through process_vm_readv: point to point from 256 KiB,
# allgather from 1 MiB per rank; 4 MiB point-to-point FIFOs:
# CFX_P2P_SINGLE_COPY_MIN_BYTES=256K CFX_SINGLE_COPY_MIN_BYTES=1M
# CFX_P2P_LOCAL_BUFFSIZE=0), and Open MPI's vader (alltoall and allgather),
# interleaved per repeat; prints medians [min-max] of the time per call in
# µs (docs/performance.md, "All-to-all against MPI_Alltoall").
#
# usage: bench/shm_fifo_ab.sh [coll] [ranks] [repeats] [build dir]
#   coll: alltoall (default) or allgather (Open MPI runs these too),
#   sendrecv, gather, scatter (Conflux only). SIZES overrides the sweep
#   ("-b 128K -e 32M -f 4").
set -euo pipefail
coll=${1:-alltoall}
np=${2:-2}
reps=${3:-5}
build=${4:-build}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export CFX_CONF_FILE=/nonexistent CFX_SOCKET_IFNAME=lo
read -r -a sizes <<<"${SIZES:--b 128K -e 32M -f 4}"
for _ in $(seq "$reps"); do
  "$build/tools/conflux-perf" "$coll" --np "$np" "${sizes[@]}" -n 50 -c 0 -w 3 2>&1 |
    awk '/^ +[0-9]/{print $1, $6}' >>"$out/now"
  CFX_P2P_SINGLE_COPY_MIN_BYTES=256K CFX_SINGLE_COPY_MIN_BYTES=1M CFX_P2P_LOCAL_BUFFSIZE=0 \
    "$build/tools/conflux-perf" "$coll" --np "$np" "${sizes[@]}" -n 50 -c 0 -w 3 2>&1 |
    awk '/^ +[0-9]/{print $1, $6}' >>"$out/before"
  if [ "$coll" = alltoall ] || [ "$coll" = allgather ]; then
    mpirun --allow-run-as-root --oversubscribe -np "$np" --mca btl self,vader \
      "$build/bench/mpi_coll_bench" -C "$coll" "${sizes[@]}" -n 50 2>&1 |
      awk '/^ +[0-9]/{print $1, $3}' >>"$out/ompi"
  fi
done
/usr/bin/python3 "$(dirname "$0")/ab_report.py" "$out" now before ompi
