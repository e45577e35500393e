#!/usr/bin/env bash
# Two "hosts" on one machine: two network namespaces joined by a veth pair,
# each with its own CFX_HOSTID, two ranks of examples/allreduce_env in each.
# Ranks on the same "host" may use shared memory; ranks on different ones
# must use the socket transport across the veth link. Passes when all four
# ranks report the exact sum, the INIT log shows a cross-host connection
# "via socket", and the veth counters show the data went across.
#
#   tests/two_hosts_test.sh path/to/allreduce_env [count [path/to/fake/libibverbs.so.1]]
#
# With a fake libibverbs (tests/fakeverbs): CFX_NET=IB, so the connections
# between the hosts must be verbs ones; the fake NIC of each namespace moves
# its bytes over TCP on the namespace's own address, i.e. across the veth.
#
# Needs root (namespaces); otherwise exits 77, which ctest shows as skipped.
# All traffic stays inside the namespaces this script creates; the addresses
# (10.213.7.0/24) exist only there. Everything is removed on exit.
set -u
prog=${1:?usage: $0 path/to/allreduce_env [count]}
count=${2:-1048576}
fakeverbs=${3:-}
via=socket
net_env=()
if [ -n "$fakeverbs" ]; then
  [ -r "$fakeverbs" ] || { echo "FAIL: no fake libibverbs at $fakeverbs" >&2; exit 1; }
  via=ib
  net_env=(CFX_NET=IB CFX_IB_VERBS_LIB="$fakeverbs" FAKEVERBS_DIR="/tmp/cfx-fakeverbs-2h-$$")
fi
nranks=4
rank_timeout=60

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || skip "creating network namespaces needs root (running as uid $(id -u))"
command -v ip >/dev/null || skip "ip (iproute2) is not installed; scripts/deps.sh installs it"
[ -x "$prog" ] || fail "$prog is not an executable"

ns_a=cfx2h_a_$$
ns_b=cfx2h_b_$$
veth_a=cfxa$$ # interface names: 15 characters at most
veth_b=cfxb$$
addr_a=10.213.7.1
addr_b=10.213.7.2
workdir=$(mktemp -d)
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  ip netns del "$ns_a" 2>/dev/null # takes its end of the veth pair, and so both
  ip netns del "$ns_b" 2>/dev/null
  rm -rf "$workdir"
  [ -z "$fakeverbs" ] || rm -rf "/tmp/cfx-fakeverbs-2h-$$"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP # ctest's timeout: still clean up

ip netns add "$ns_a" || skip "cannot create a network namespace here (no CAP_SYS_ADMIN?)"
ip netns add "$ns_b" || fail "cannot create the second network namespace"
# The pair is born inside the namespaces: the machine's own network never sees it.
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

rx_bytes() { # namespace interface
  ip netns exec "$1" cat "/sys/class/net/$2/statistics/rx_bytes"
}

# run_ranks PORT [VAR=value...]: start the four ranks, wait, check each one.
run_ranks() {
  local port=$1
  shift
  local r ns veth hostid failed=0
  pids=()
  for ((r = 0; r < nranks; r++)); do
    if ((r < nranks / 2)); then
      ns=$ns_a veth=$veth_a hostid=cfx-two-hosts-a-$$
    else
      ns=$ns_b veth=$veth_b hostid=cfx-two-hosts-b-$$
    fi
    ip netns exec "$ns" env RANK=$r WORLD_SIZE=$nranks MASTER_ADDR=$addr_a MASTER_PORT="$port" \
      CFX_SOCKET_IFNAME="=$veth" CFX_HOSTID="$hostid" CFX_CONF_FILE=/nonexistent \
      ${net_env[@]+"${net_env[@]}"} "$@" \
      timeout "$rank_timeout" "$prog" "$count" >"$workdir/rank$r.out" 2>"$workdir/rank$r.err" &
    pids+=($!)
  done
  for ((r = 0; r < nranks; r++)); do
    local rc=0
    wait "${pids[r]}" || rc=$?
    cat "$workdir/rank$r.out"
    if [ "$rc" -ne 0 ] || ! grep -q "^rank $r of $nranks: allreduce of $count floats OK" \
      "$workdir/rank$r.out"; then
      echo "rank $r exited $rc (124: timed out after $rank_timeout s); its stderr:" >&2
      tail -n 20 "$workdir/rank$r.err" >&2
      failed=$((failed + 1))
    fi
  done
  pids=()
  [ "$failed" -eq 0 ] || fail "$failed of $nranks ranks failed"
}

echo "== 4 ranks, 2 per namespace, between the namespaces via $via ($ns_a: $addr_a on $veth_a, $ns_b: $addr_b on $veth_b)"
rx_a0=$(rx_bytes "$ns_a" "$veth_a")
rx_b0=$(rx_bytes "$ns_b" "$veth_b")
run_ranks 29500
rx_a=$(($(rx_bytes "$ns_a" "$veth_a") - rx_a0))
rx_b=$(($(rx_bytes "$ns_b" "$veth_b") - rx_b0))
echo "veth received: $rx_a bytes in $ns_a, $rx_b bytes in $ns_b"
# Each side's result depends on all of the other side's floats.
payload=$((count * 4))
((rx_a >= payload && rx_b >= payload)) ||
  fail "less than $payload bytes crossed the veth link each way: the data did not go between hosts"

echo "== again with CFX_DEBUG=INFO CFX_DEBUG_SUBSYS=INIT"
run_ranks 29501 CFX_DEBUG=INFO CFX_DEBUG_SUBSYS=INIT
cat "$workdir"/rank*.err | grep "connection .* via " | sed 's/^.*CFX INFO INIT //' | sort -u
# A connection between a rank of the first half and one of the second.
crossing=$(cat "$workdir"/rank*.err |
  grep -o "connection [a-z0-9]* rank [0-9]* [<>-]* rank [0-9]* via $via" |
  awk -v half=$((nranks / 2)) '{ if (($4 < half) != ($7 < half)) n++ } END { print n + 0 }')
((crossing > 0)) || fail "the INIT log shows no connection via $via between the namespaces"
echo "== again with CFX_DEBUG=INFO CFX_DEBUG_SUBSYS=TUNING"
# A namespace sees only its veth: the topology takes it as the host's network
# port, so the planner plans across the hosts (no "no plan"), alike on all ranks.
run_ranks 29502 CFX_DEBUG=INFO CFX_DEBUG_SUBSYS=TUNING
for ((r = 0; r < nranks; r++)); do
  grep -q "TUNING model: host ranks, $nranks ranks on 2 hosts" "$workdir/rank$r.err" ||
    fail "rank $r did not plan across the two hosts: $(grep -m2 TUNING "$workdir/rank$r.err")"
done
if [ -n "$fakeverbs" ]; then
  echo "== again with two fake NICs per host and two queue pairs per connection, one on each"
  run_ranks 29503 FAKEVERBS_DEVICES=2 CFX_IB_QPS_PER_CONNECTION=2 CFX_DEBUG=INFO CFX_DEBUG_SUBSYS=NET
  striped=$(cat "$workdir"/rank*.err | grep -c "fake_1:1 qpn [0-9]* [<>-]* fake_1:1 qpn .*on 2 port(s))")
  cat "$workdir"/rank*.err | grep "connected (" | sed 's/^.*CFX INFO NET //' | head -n 4
  ((striped > 0)) || fail "no connection striped over both fake NICs"
fi
echo "PASS: 4 ranks on two hosts allreduced correctly; $crossing cross-host connection ends via $via$([ -n "$fakeverbs" ] && echo ' (fake-verbs: no RDMA hardware)'); every rank planned across the hosts"

