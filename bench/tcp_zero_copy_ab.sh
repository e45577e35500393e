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
/usr/bin/python3 - "$out" <<'PY'
import collections, os, statistics, sys
out = sys.argv[1]
runs = {}
for name in ("zero_copy", "fifo", "ompi"):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        continue
    times = collections.defaultdict(list)
    for line in open(path):
        size, us = line.split()
        times[int(size)].append(float(us))
    runs[name] = times
cols = [c for c in ("zero_copy", "fifo", "ompi") if c in runs]
print("| size | " + " | ".join(cols) + " | " + " | ".join(f"{c}/zero_copy" for c in cols[1:]) + " |")
for size in sorted(runs["zero_copy"]):
    cells, med = [], {}
    for c in cols:
        t = runs[c].get(size, [])
        if not t:
            cells.append("-")
            continue
        med[c] = statistics.median(t)
        cells.append(f"{med[c]:.0f} [{min(t):.0f}-{max(t):.0f}]")
    ratios = [f"{med[c] / med['zero_copy']:.2f}" if c in med else "-" for c in cols[1:]]
    print(f"| {size >> 10} KiB | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
PY
