#!/usr/bin/env bash
# conflux-perf on device buffers (--mem device|auto) over the fake CUDA
# driver (tests/fakecuda), whose "GPU" runs Conflux's kernel on CPU threads:
# data-checked sweeps on forked ranks sharing one GPU and on one GPU each,
# the header's device lines and the device-to-device copy line, JSON that
# records the memory; --mem device without a driver or a GPU fails with the
# reason; --mem auto falls back to host buffers and says why; --mem host
# prints what conflux-perf printed before --mem existed. No figure here is
# a GPU figure.
#
#   tests/perf_device_test.sh path/to/conflux-perf path/to/fake/libcuda.so.1
set -u
if [ $# -ne 2 ] || [ ! -x "$1" ]; then
  echo "usage: $0 path/to/conflux-perf path/to/fake/libcuda.so.1" >&2
  exit 2
fi
perf=$1
fake=$2
if [ ! -f "$fake" ]; then
  echo "SKIP: no fake CUDA driver at $fake (build the cfx_fakecuda target)"
  exit 77
fi
export CFX_SOCKET_IFNAME=lo
export CFX_CUDA_DRIVER_LIB=$fake
unset CFX_MULTI_RANK_GPU_ENABLE FAKECUDA_DEVICES FAKECUDA_NO_DEVICE LOCAL_RANK
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# expect_line NAME FILE REGEX: FILE has a line matching REGEX (grep -E).
expect_line() {
  grep -Eq -- "$3" "$2" || fail "$1: no line matching '$3'"
}

# expect_no_line NAME FILE REGEX
expect_no_line() {
  if grep -Eq -- "$3" "$2"; then fail "$1: a line matches '$3'"; fi
}

# expect_run NAME ARGS...: exit 0, a table of 13-column rows, every check
# passed (0 wrong everywhere), the copy line and nccl-tests' footer.
expect_run() {
  local name=$1
  shift
  local out=$work/$name.out err=$work/$name.err
  timeout 150 "$perf" "$@" > "$out" 2> "$err"
  local rc=$?
  if [ $rc -ne 0 ]; then
    fail "$name: exit $rc: $perf $*"
    sed 's/^/  | /' "$out" "$err" | tail -n 20
    return 1
  fi
  local rows bad_rows
  rows=$(grep -c '^ *[0-9]' "$out")
  bad_rows=$(awk '/^ *[0-9]/ && (NF != 13 || $9 != "0" || ($13 != "0" && $13 != "N/A"))' "$out" | wc -l)
  [ "$rows" -gt 0 ] || fail "$name: no result rows"
  [ "$bad_rows" -eq 0 ] || fail "$name: $bad_rows rows not 13 columns with 0 wrong (in place: or N/A)"
  expect_line "$name" "$out" '^# Out of bounds values : 0 OK$'
  expect_line "$name" "$out" '^# Avg bus bandwidth    : [0-9.e+-]* $'
  expect_line "$name" "$out" '^# memcpy bandwidth: [0-9.]* GB/s$'
  echo "ok: $name ($rows sizes)"
}

# expect_fail NAME CODE SENTENCE ARGS...: exit CODE, SENTENCE on stderr once.
expect_fail() {
  local name=$1 code=$2 sentence=$3
  shift 3
  timeout 60 "$perf" "$@" > "$work/$name.out" 2> "$work/$name.err"
  local rc=$?
  local times
  times=$(grep -cF -- "$sentence" "$work/$name.err")
  if [ $rc -ne "$code" ]; then
    fail "$name: exit $rc, expected $code: $perf $*"
    sed 's/^/  | /' "$work/$name.err" | tail -n 10
  elif [ "$times" -ne 1 ]; then
    fail "$name: '$sentence' on stderr $times times, expected once"
    sed 's/^/  | /' "$work/$name.err" | tail -n 10
  else
    echo "ok: $name ($(grep -F -- "$sentence" "$work/$name.err"))"
  fi
}

device_line='^#  Rank +[0-9]+ Group  0 Pid +[0-9]+ on +[^ ]+ device +[0-9]+ \[[0-9a-f:.]+\] Fake H200'
copy_line='^# memcpy: [0-9]+ bytes device to device on rank 0.s GPU \(cuMemcpyAsync'

# Two ranks on the one fake GPU: conflux-perf sets CFX_MULTI_RANK_GPU_ENABLE.
name=allreduce_device_2_ranks_1_gpu
if expect_run $name allreduce --np 2 --mem device -b 8 -e 1M -f 8 -n 3 -w 1 -c 1 \
  --json "$work/$name.json"; then
  out=$work/$name.out
  [ "$(grep -Ec "$device_line" "$out")" -eq 2 ] || fail "$name: not 2 'device N [bus] name' lines"
  expect_line $name "$out" '^# CFX_MULTI_RANK_GPU_ENABLE=1 set by conflux-perf: 2 ranks share 1 GPU$'
  expect_line $name "$out" '^# Device buffers \(cuMemAlloc\), a non-blocking stream per rank'
  expect_line $name "$out" "$copy_line"
  expect_line $name "$out" 'counts bytes read \+ written'
  expect_line $name "$out" '^# enqueue: [0-9.]+ us per call from call to return on rank 0 \([0-9]+ timed calls; [0-9.]+ us at 8 bytes\)$'
  expect_no_line $name "$out" 'host memory$|Host buffers'
  python3 - "$work/$name.json" <<'PY' || fail "$name: JSON content"
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["memory"] == "device" and doc["config"]["mem"] == "device", doc
assert doc["enqueue_us"] > 0, doc["enqueue_us"]
assert doc["memcpy_kind"] == "device_to_device_read_plus_written", doc["memcpy_kind"]
assert doc["results"] and all(r["wrong"] == 0 for r in doc["results"]), doc["results"]
print("ok: allreduce device JSON says memory device, %d results" % len(doc["results"]))
PY
fi

# Four ranks as threads of one process on the one fake GPU (-t): one pid,
# one context, conflux-perf sets CFX_MULTI_RANK_GPU_ENABLE before the threads.
name=allreduce_device_4_threads_1_gpu
if expect_run $name allreduce -t 4 --mem device -b 8 -e 256K -f 8 -n 3 -w 1 -c 1; then
  out=$work/$name.out
  [ "$(grep -Ec "$device_line" "$out")" -eq 4 ] || fail "$name: not 4 'device N [bus] name' lines"
  [ "$(grep -E "$device_line" "$out" | awk '{print $7}' | sort -u | wc -l)" -eq 1 ] ||
    fail "$name: the ranks are not one process"
  expect_line $name "$out" '^# conflux-perf allreduce: .* 4 ranks, threads \(-t 4, one process\)$'
  expect_line $name "$out" '^# nThread 4 '
  expect_line $name "$out" '^# CFX_MULTI_RANK_GPU_ENABLE=1 set by conflux-perf: 4 ranks share 1 GPU$'
fi

# A data-movement collective, one fake GPU per rank: devices 0 and 1, no
# multi-rank setting.
name=allgather_device_2_ranks_2_gpus
if FAKECUDA_DEVICES=2 expect_run $name allgather --np 2 --mem device -b 8 -e 1M -f 8 -n 3 -w 1 \
  -c 1; then
  out=$work/$name.out
  expect_line $name "$out" '^#  Rank  0 .* device  0 \['
  expect_line $name "$out" '^#  Rank  1 .* device  1 \['
  expect_no_line $name "$out" 'MULTI_RANK'
fi

# Every type and op on 3 ranks: the device reductions against the exact values.
expect_run reducescatter_device_all_types_ops_3_ranks reducescatter --np 3 --mem device -b 8 \
  -e 4K -f 8 -n 1 -w 1 -c 1 -d all -o all

# auto: the driver loads and has a GPU, so device buffers.
name=auto_chooses_device_when_a_gpu_is_usable
if expect_run $name sendrecv --np 2 -b 8 -e 64K -f 8 -n 2 -w 1 -c 1; then
  expect_line $name "$work/$name.out" '^# Device buffers'
  [ "$(grep -Ec "$device_line" "$work/$name.out")" -eq 2 ] || fail "$name: no device lines"
fi

# Without a driver or a GPU: auto is host buffers and says why; device fails.
missing=$work/no-such-dir/libcuda.so.1
name=auto_falls_back_to_host_without_a_driver
if CFX_CUDA_DRIVER_LIB=$missing expect_run $name allreduce --np 2 -b 8 -e 64K -f 8 -n 2 -w 1 \
  -c 1; then
  expect_line $name "$work/$name.out" '^# --mem auto: host buffers, no GPU is usable: no CUDA driver'
  expect_line $name "$work/$name.out" '^# Host buffers, stream NULL\. Time:'
fi
CFX_CUDA_DRIVER_LIB=$missing expect_fail device_without_a_driver_fails 1 \
  "--mem device, but no GPU is usable: no CUDA driver ($missing" \
  allreduce --np 2 --mem device -b 8 -e 64K -f 8 -n 2
FAKECUDA_NO_DEVICE=1 expect_fail device_without_a_gpu_fails 1 \
  "--mem device, but no GPU is usable: the CUDA driver found no GPU" \
  allreduce --np 2 --mem device -b 8 -e 64K -f 8 -n 2

# host: the output of conflux-perf before --mem, even with a driver and a GPU.
name=host_keeps_the_host_output
if expect_run $name allreduce --np 2 --mem host -b 8 -e 64K -f 8 -n 2 -w 1 -c 1 \
  --json "$work/$name.json"; then
  out=$work/$name.out
  [ "$(grep -Ec '^#  Rank +[0-9]+ Group  0 Pid +[0-9]+ on +[^ ]+ device -1 \[cpu\] host memory$' \
    "$out")" -eq 2 ] || fail "$name: not 2 'device -1 [cpu] host memory' lines"
  expect_line $name "$out" \
    '^# Host buffers, stream NULL\. Time: the mean of the ranks. mean per call, no barrier between calls\.$'
  expect_line $name "$out" '^# memcpy: [0-9]+ bytes between two touched buffers, one thread, rank 0$'
  expect_no_line $name "$out" 'Device buffers|device to device|--mem auto|MULTI_RANK|Fake H200|^# enqueue'
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["memory"] == "host" and d["memcpy_kind"] == "host_memcpy_bytes_copied", d' \
    "$work/$name.json" || fail "$name: JSON memory is not host"
fi

# A bad value is a usage error.
timeout 60 "$perf" allreduce --mem gpu > "$work/bad_mem.out" 2> "$work/bad_mem.err"
rc=$?
if [ $rc -eq 2 ] && grep -q "bad --mem 'gpu'" "$work/bad_mem.err"; then
  echo "ok: bad_mem_value ($(head -n 1 "$work/bad_mem.err"))"
else
  fail "bad_mem_value: exit $rc, expected 2 and \"bad --mem 'gpu'\""
fi

if [ $failures -ne 0 ]; then
  echo "conflux-perf device test: $failures failed"
  exit 1
fi
echo "conflux-perf device test: all passed"
