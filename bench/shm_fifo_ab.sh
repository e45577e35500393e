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
/usr/bin/python3 - "$out" <<'PY'
import collections, os, statistics, sys
out = sys.argv[1]
runs = {}
for name in ("now", "before", "ompi"):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        continue
    times = collections.defaultdict(list)
    for line in open(path):
        size, us = line.split()
        times[int(size)].append(float(us))
    runs[name] = times
cols = [c for c in ("now", "before", "ompi") if c in runs]
print("| size | " + " | ".join(cols) + " | " + " | ".join(f"{c}/now" for c in cols[1:]) + " |")
print("|---" * (1 + 2 * len(cols) - 1) + "|")
for size in sorted(runs["now"]):
    cells, med = [], {}
    for c in cols:
        t = runs[c].get(size, [])
        if not t:
            cells.append("-")
            continue
        med[c] = statistics.median(t)
        cells.append(f"{med[c]:.0f} [{min(t):.0f}-{max(t):.0f}]")
    ratios = [f"{med[c] / med['now']:.2f}" if c in med else "-" for c in cols[1:]]
    print(f"| {size >> 10} KiB | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
PY
