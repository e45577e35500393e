#!/usr/bin/env bash
# The drop-in's NCCL_* -> CFX_* mapping (bindings/nccl/env.c): every twin
# is set from its NCCL variable, values whose syntax differs are
# translated, a CFX_* variable already set wins, and Conflux itself acts on
# the mapped values (NCCL_SOCKET_IFNAME picks the interface, NCCL_DEBUG
# turns its log on).
#
#   env_test.sh ENV_PROBE      (tests/nccl/env_probe.c)
set -uo pipefail
probe=$1
fail=0
failed() { echo "FAIL: $*"; fail=1; }
# Nothing from the caller's CFX_* or NCCL_* leaks in (the rest stays:
# LD_LIBRARY_PATH, sanitizer options).
unset_args=()
for name in $(compgen -e | grep -E '^(CFX|NCCL)_'); do
  unset_args+=(-u "$name")
done
run() { env "${unset_args[@]}" CFX_CONF_FILE=/nonexistent "$@"; }

# 1. Every twin, and the two translated values.
twins=(DEBUG:ABORT:WARN DEBUG_SUBSYS:INIT,NET DEBUG_FILE:/tmp/x.%h.%p COMM_ID:127.0.0.1:29999
       SOCKET_IFNAME:=eth9 SOCKET_FAMILY:AF_INET6:6 SOCKET_NTHREADS:3 NSOCKS_PERTHREAD:5
       ALGO:^tree PROTO:Simple BUFFSIZE:1048576 MAX_NCHANNELS:7 SHM_DISABLE:1
       TOPO_FILE:/tmp/topo.xml TOPO_DUMP_FILE:/tmp/dump.xml HOSTID:host-a
       MULTI_RANK_GPU_ENABLE:1 IB_HCA:=mlx5_0:1 IB_DISABLE:1 NET:Socket MIN_NCHANNELS:2
       DMABUF_ENABLE:0 NET_PLUGIN:aws-ofi "NET_FORCE_MERGE:mlx5_0,mlx5_1;mlx5_2")
settings=() names=()
for twin in "${twins[@]}"; do
  name=${twin%%:*} rest=${twin#*:}
  value=$rest
  # name:value:mapped where the syntax differs (COMM_ID's value has a colon: no mapping).
  case $name in DEBUG|SOCKET_FAMILY) value=${rest%%:*} ;; esac
  settings+=("NCCL_$name=$value") names+=("CFX_$name")
done
out=$(run "${settings[@]}" "$probe" getenv "${names[@]}")
for twin in "${twins[@]}"; do
  name=${twin%%:*} rest=${twin#*:}
  want=$rest
  case $name in DEBUG|SOCKET_FAMILY) want=${rest#*:} ;; esac
  grep -qxF "CFX_$name=$want" <<< "$out" || failed "NCCL_$name did not give CFX_$name=$want: $(grep "^CFX_$name[= ]" <<< "$out")"
done
echo "1. ${#twins[@]} NCCL_* variables set their CFX_* twins"

# 2. Nothing set, nothing mapped; CFX_* set wins over NCCL_*.
out=$(run "$probe" getenv CFX_SOCKET_IFNAME CFX_DEBUG)
grep -qx "CFX_SOCKET_IFNAME unset" <<< "$out" && grep -qx "CFX_DEBUG unset" <<< "$out" ||
  failed "without NCCL_* variables: $out"
out=$(run NCCL_SOCKET_IFNAME=eth9 CFX_SOCKET_IFNAME=lo NCCL_DEBUG=INFO CFX_DEBUG=WARN \
      "$probe" getenv CFX_SOCKET_IFNAME CFX_DEBUG 2> /dev/null)
grep -qx "CFX_SOCKET_IFNAME=lo" <<< "$out" && grep -qx "CFX_DEBUG=WARN" <<< "$out" ||
  failed "CFX_* did not win over NCCL_*: $out"
echo "2. CFX_* set by the user wins"

# 2b. NCCL_NET_PLUGIN=none loads no plugin (CFX_NET_PLUGIN empty); a mapped
# variable is never called ignored at INFO.
out=$(run NCCL_NET_PLUGIN=none "$probe" getenv CFX_NET_PLUGIN)
grep -qx "CFX_NET_PLUGIN=" <<< "$out" || failed "NCCL_NET_PLUGIN=none gave: $out"
out=$(run NCCL_MIN_NCHANNELS=2 NCCL_DEBUG=INFO "$probe" getenv CFX_MIN_NCHANNELS 2>&1)
grep -q "CFX_MIN_NCHANNELS=2" <<< "$out" || failed "NCCL_MIN_NCHANNELS=2 gave: $out"
! grep -q "NCCL_MIN_NCHANNELS has no Conflux twin" <<< "$out" ||
  failed "NCCL_MIN_NCHANNELS is mapped but said to be ignored: $out"
echo "2b. NCCL_NET_PLUGIN=none is no plugin; a mapped variable is not called ignored"

# 3. Conflux picks its interface from NCCL_SOCKET_IFNAME, unless CFX_SOCKET_IFNAME says otherwise.
out=$(run NCCL_SOCKET_IFNAME=nosuchif0 "$probe" uniqueid 2>&1)
[ $? -eq 3 ] && grep -q nosuchif0 <<< "$out" ||
  failed "NCCL_SOCKET_IFNAME=nosuchif0 did not make ncclGetUniqueId fail naming it: $out"
out=$(run NCCL_SOCKET_IFNAME=nosuchif0 CFX_SOCKET_IFNAME=lo "$probe" uniqueid 2>&1)
[ $? -eq 0 ] || failed "CFX_SOCKET_IFNAME=lo did not win over NCCL_SOCKET_IFNAME=nosuchif0: $out"
out=$(run NCCL_SOCKET_IFNAME=lo "$probe" uniqueid 2>&1)
[ $? -eq 0 ] || failed "NCCL_SOCKET_IFNAME=lo: $out"
echo "3. NCCL_SOCKET_IFNAME reaches Conflux's bootstrap; CFX_SOCKET_IFNAME wins"

# 4. NCCL_DEBUG=INFO turns Conflux's log on; CFX_DEBUG=NONE keeps it off.
out=$(run NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=INFO "$probe" comm 2>&1)
grep -q "CFX INFO INIT" <<< "$out" || failed "NCCL_DEBUG=INFO: no Conflux INFO line: $out"
out=$(run NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=INFO CFX_DEBUG=NONE "$probe" comm 2>&1)
grep -q "CFX INFO" <<< "$out" && failed "CFX_DEBUG=NONE did not win over NCCL_DEBUG=INFO: $out"
grep -qx "ok 7" <<< "$out" || failed "one-rank all-reduce: $out"
echo "4. NCCL_DEBUG reaches Conflux's log; CFX_DEBUG wins"

if [ $fail -ne 0 ]; then
  exit 1
fi
echo "env test: all passed"
