#!/bin/bash
# A collective over loopback TCP with and without the socket transport's
# path straight from and into user buffers (CFX_ZERO_COPY_MIN_BYTES=1G
# turns it off), against Open MPI's tcp BTL, interleaved per repeat; prints
# medians [min-max] of the time per call in µs (docs/performance.md, "TCP
# straight from user buffers").
#
# usage: bench/tcp_zero_copy_ab.sh [coll] [ranks] [repeats] [build dir]
#   coll: alltoall (default), allreduce, broadcast, allgather (Open MPI runs
#   these too), or sendrecv (Conflux only)
set -euo pipefail
coll=${1:-alltoall}
np=${2:-2}
reps=${3:-5}
build=${4:-build}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export CFX_CONF_FILE=/nonexistent CFX_SOCKET_IFNAME=lo CFX_SHM_DISABLE=1
sizes=(-b 128K -e 32M -f 4)
for _ in $(seq "$reps"); do
  "$build/tools/conflux-perf" "$coll" --np "$np" "${sizes[@]}" -n 20 -c 0 -w 3 2>&1 |
    awk '/^ +[0-9]/{print $1, $6}' >>"$out/zero_copy"
  CFX_ZERO_COPY_MIN_BYTES=1G "$build/tools/conflux-perf" "$coll" --np "$np" "${sizes[@]}" -n 20 -c 0 -w 3 2>&1 |
    awk '/^ +[0-9]/{print $1, $6}' >>"$out/fifo"
  if [ "$coll" != sendrecv ]; then
    mpirun --allow-run-as-root --oversubscribe -np "$np" --mca btl self,tcp --mca btl_tcp_if_include lo \
      "$build/bench/mpi_coll_bench" -C "$coll" "${sizes[@]}" -n 20 2>&1 |
      awk '/^ +[0-9]/{print $1, $3}' >>"$out/ompi"
  fi
done
/usr/bin/python3 "$(dirname "$0")/ab_report.py" "$out" zero_copy fifo ompi
