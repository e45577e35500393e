#!/bin/sh
# launch_local.sh: start N ranks of a launcher-free program on this machine,
# the way torchrun would: each gets RANK, WORLD_SIZE, MASTER_ADDR and
# MASTER_PORT. Exits 0 only when every rank exits 0.
#
#   examples/launch_local.sh 4 build/examples/allreduce_env [args...]
#
# MASTER_ADDR defaults to 127.0.0.1, MASTER_PORT to 29500, and
# CFX_SOCKET_IFNAME to lo; set them to override. Each rank runs under
# `timeout` (CFX_LAUNCH_TIMEOUT seconds, default 120).
set -u
if [ $# -lt 2 ]; then
  echo "usage: $0 nranks program [args...]" >&2
  exit 2
fi
nranks=$1
shift
case $nranks in
  '' | *[!0-9]*) echo "$0: nranks must be a number, got '$nranks'" >&2; exit 2 ;;
esac
export WORLD_SIZE="$nranks"
export MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
export MASTER_PORT="${MASTER_PORT:-29500}"
export CFX_SOCKET_IFNAME="${CFX_SOCKET_IFNAME:-lo}"
limit="${CFX_LAUNCH_TIMEOUT:-120}"

pids=""
rank=0
while [ "$rank" -lt "$nranks" ]; do
  RANK=$rank timeout "$limit" "$@" &
  pids="$pids $!"
  rank=$((rank + 1))
done
failed=0
for pid in $pids; do
  wait "$pid" || failed=$((failed + 1))
done
if [ "$failed" -eq 0 ]; then
  echo "OK: $nranks ranks, 0 failed"
else
  echo "FAILED: $nranks ranks, $failed failed"
  exit 1
fi
