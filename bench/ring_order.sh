#!/bin/sh
# ring_order.sh: the ring in the plan's order against the ring in rank
# order, for ranks dealt to hosts round robin (CFX_HOSTID = h<rank % HOSTS>,
# as `mpirun --map-by node` places them: in rank order every hop of the
# ring crosses between hosts; in the plan's order one hop per host does).
# Runs conflux-perf ROUNDS times for each order, interleaved, CFX_ALGO=ring,
# and prints each size's out-of-place time per run and the medians.
#
#   bench/ring_order.sh [coll] [nranks] [hosts] [rounds]
#     defaults: allreduce 4 2 5; sizes with SIZES="-b 64K -e 64M -f 4"
#
# The "hosts" here are one machine: their links are TCP over loopback
# (CFX_SOCKET_IFNAME=lo) and shared memory inside a "host".
set -eu
coll=${1:-allreduce}
nranks=${2:-4}
hosts=${3:-2}
rounds=${4:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
perf=${CFX_PERF:-$here/build/tools/conflux-perf}
sizes=${SIZES:--b 64K -e 64M -f 4}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
port=29700
for round in $(seq 1 "$rounds"); do
  for order in plan rank; do
    port=$((port + 1))
    # shellcheck disable=SC2086 # $sizes is a list of flags
    CFX_RING_ORDER=$order CFX_ALGO=ring MASTER_PORT=$port HOSTS=$hosts \
      "$here/examples/launch_local.sh" "$nranks" sh -c \
      'CFX_HOSTID=h$((RANK % HOSTS)) exec "$0" "$@"' "$perf" "$coll" $sizes -n 10 -w 3 \
      > "$out/$order.$round" 2>&1 || { cat "$out/$order.$round"; exit 1; }
  done
done
# Rows of numbers: size and the out-of-place time (column 6).
for order in plan rank; do
  for round in $(seq 1 "$rounds"); do
    awk -v o="$order" -v r="$round" '$1 ~ /^[0-9]+$/ && NF >= 9 { print o, $1, $6 }' "$out/$order.$round"
  done
done | awk '
  { t[$1 " " $2] = t[$1 " " $2] " " $3; sizes[$2] = 1 }
  function median(list,   n, v, i, j, x) {
    n = split(list, v, " ")
    for (i = 2; i <= n; i++) { x = v[i]; for (j = i - 1; j >= 1 && v[j] + 0 > x + 0; j--) v[j + 1] = v[j]; v[j + 1] = x }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  END {
    printf "%12s %12s %12s %8s   runs (us): plan | rank\n", "size (B)", "plan (us)", "rank (us)", "rank/plan"
    n = 0; for (s in sizes) list[++n] = s + 0
    for (i = 2; i <= n; i++) { x = list[i]; for (j = i - 1; j >= 1 && list[j] > x; j--) list[j + 1] = list[j]; list[j + 1] = x }
    for (i = 1; i <= n; i++) {
      s = list[i]; p = median(t["plan " s]); r = median(t["rank " s])
      printf "%12d %12.1f %12.1f %8.2f  %s |%s\n", s, p, r, r / p, t["plan " s], t["rank " s]
    }
  }'
