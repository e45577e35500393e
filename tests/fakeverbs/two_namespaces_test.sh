#!/usr/bin/env bash
# fake-verbs between two "hosts": two network namespaces joined by a veth
# pair, one fakeverbs_pingpong in each, first with the InfiniBand link layer
# (distinct LIDs), then RoCE (GRH with the IPv4-mapped GID). Passes when both
# sides print "fakeverbs pingpong: OK" each time.
#
#   tests/fakeverbs/two_namespaces_test.sh path/to/fakeverbs_pingpong
#
# Needs root (namespaces); otherwise exits 77, which ctest shows as skipped.
# The addresses (10.213.9.0/24) exist only inside the namespaces it creates.
set -u
prog=${1:?usage: $0 path/to/fakeverbs_pingpong}
side_timeout=60

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || skip "creating network namespaces needs root (running as uid $(id -u))"
command -v ip >/dev/null || skip "ip (iproute2) is not installed"
[ -x "$prog" ] || fail "$prog is not an executable"

ns_a=cfxfv_a_$$
ns_b=cfxfv_b_$$
veth_a=fva$$
veth_b=fvb$$
addr_a=10.213.9.1
addr_b=10.213.9.2
workdir=$(mktemp -d)
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null
  rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

ip netns add "$ns_a" || skip "cannot create a network namespace here (no CAP_SYS_ADMIN?)"
ip netns add "$ns_b" || fail "cannot create the second network namespace"
ip link add "$veth_a" netns "$ns_a" type veth peer name "$veth_b" netns "$ns_b" ||
  fail "cannot create the veth pair"
if ! { ip -n "$ns_a" link set lo up &&
  ip -n "$ns_b" link set lo up &&
  ip -n "$ns_a" addr add "$addr_a/24" dev "$veth_a" &&
  ip -n "$ns_b" addr add "$addr_b/24" dev "$veth_b" &&
  ip -n "$ns_a" link set "$veth_a" up &&
  ip -n "$ns_b" link set "$veth_b" up; }; then
  fail "cannot configure the namespaces"
fi

# run_pair LINK_LAYER PORT
run_pair() {
  local link=$1 port=$2
  local env_common=(env FAKEVERBS_LOG=${FAKEVERBS_LOG:-0} FAKEVERBS_LINK_LAYER="$link" FAKEVERBS_DIR="$workdir/registry")
  ip netns exec "$ns_a" "${env_common[@]}" timeout "$side_timeout" "$prog" server "$addr_a" "$port" \
    >"$workdir/a.out" 2>&1 &
  pids=($!)
  ip netns exec "$ns_b" "${env_common[@]}" timeout "$side_timeout" "$prog" client "$addr_a" "$port" \
    >"$workdir/b.out" 2>&1 &
  pids+=($!)
  local failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  pids=()
  cat "$workdir/a.out" "$workdir/b.out"
  [ "$failed" -eq 0 ] || fail "$link: a side failed"
  [ "$(grep -c 'fakeverbs pingpong: OK' "$workdir/a.out" "$workdir/b.out" | awk -F: '{s+=$2} END {print s}')" -eq 2 ] ||
    fail "$link: both sides must report OK"
}

run_pair ib 18515
run_pair roce 18516
echo "fakeverbs two namespaces: all passed"
