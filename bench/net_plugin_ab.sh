#!/bin/sh
# net_plugin_ab.sh: two conflux-perf builds (A and B) over the project's
# test net plugin (tests/netplugin, TCP on 127.0.0.1), 2 processes each its
# own "host" (CFX_HOSTID), run by run interleaved, each with the plugin
# eager (CFXTEST_RENDEZVOUS=0: a send goes as soon as it is posted) and in
# rendezvous (CFXTEST_RENDEZVOUS=1: a message leaves only once its receive
# is posted at the other end, as an RDMA plugin's). Prints each size's
# out-of-place time per run and the medians.
#
#   bench/net_plugin_ab.sh PERF_A PERF_B [coll] [rounds]
#     defaults: sendrecv 5; sizes with SIZES="-b 8 -e 16M -f 4"; flags for
#     one side only with ARGS_A / ARGS_B (one build, two settings:
#     bench/net_plugin_ab.sh perf perf sendrecv 5 with ARGS_B="-R 1"); environment
#     for one side only with ENV_A / ENV_B ("CFX_NET_PLUGIN=" runs that side
#     on the socket transport, "CFX_NET_PLUGIN=builtin:socket" on Conflux's
#     own socket net); RDV_MODES="0" runs the eager mode only
#
# These are loopback TCP figures of a test plugin on one machine, never an
# RDMA NIC's: they show how a protocol waits on a rendezvous, not a
# network's speed.
set -eu
if [ $# -lt 2 ]; then
  echo "usage: $0 PERF_A PERF_B [coll] [rounds]" >&2
  exit 2
fi
perf_a=$1
perf_b=$2
coll=${3:-sendrecv}
rounds=${4:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
plugin=${CFX_NET_PLUGIN:-$here/build/tests/netplugin/libnccl-net-cfxtest.so}
sizes=${SIZES:--b 8 -e 16M -f 4}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
port=29900
rdv_modes=${RDV_MODES:-0 1}
for round in $(seq 1 "$rounds"); do
  for rdv in $rdv_modes; do
    for build in A B; do
      port=$((port + 1))
      perf=$perf_a
      args=${ARGS_A:-}
      envs=${ENV_A:-}
      if [ "$build" = B ]; then
        perf=$perf_b
        args=${ARGS_B:-}
        envs=${ENV_B:-}
      fi
      # shellcheck disable=SC2086,SC2016 # $sizes, $args, $envs: lists; $RANK is the rank's
      env CFXTEST_RENDEZVOUS=$rdv CFX_NET_PLUGIN=$plugin $envs MASTER_PORT=$port \
        "$here/examples/launch_local.sh" 2 sh -c 'CFX_HOSTID=h$RANK exec "$0" "$@"' \
        "$perf" "$coll" $sizes $args -n 20 -w 3 > "$out/$build$rdv.$round" 2>&1 ||
        { cat "$out/$build$rdv.$round"; exit 1; }
    done
  done
done
# Rows of numbers: size and the out-of-place time (column 6).
for rdv in $rdv_modes; do
  for build in A B; do
    for round in $(seq 1 "$rounds"); do
      awk -v k="$rdv $build" '$1 ~ /^[0-9]+$/ && NF >= 9 { print k, $1, $6 }' "$out/$build$rdv.$round"
    done
  done
done | awk '
  { t[$1 " " $2 " " $3] = t[$1 " " $2 " " $3] " " $4; sizes[$3] = 1 }
  function median(list,   n, v, i, j, x) {
    n = split(list, v, " ")
    for (i = 2; i <= n; i++) { x = v[i]; for (j = i - 1; j >= 1 && v[j] + 0 > x + 0; j--) v[j + 1] = v[j]; v[j + 1] = x }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  END {
    n = 0; for (s in sizes) list[++n] = s + 0
    for (i = 2; i <= n; i++) { x = list[i]; for (j = i - 1; j >= 1 && list[j] > x; j--) list[j + 1] = list[j]; list[j + 1] = x }
    for (rdv = 0; rdv <= 1; rdv++) {
      if (!((rdv " A " list[1]) in t)) continue
      printf "\n# %s\n", rdv ? "rendezvous (CFXTEST_RENDEZVOUS=1)" : "eager (CFXTEST_RENDEZVOUS=0)"
      printf "%10s %10s %10s %6s   runs (us): A | B\n", "size (B)", "A (us)", "B (us)", "A/B"
      for (i = 1; i <= n; i++) {
        s = list[i]; a = median(t[rdv " A " s]); b = median(t[rdv " B " s])
        printf "%10d %10.1f %10.1f %6.2f  %s |%s\n", s, a, b, a / b, t[rdv " A " s], t[rdv " B " s]
      }
    }
  }'
