#!/usr/bin/env bash
# conflux-perf works end to end, briefly: every collective on 2 forked ranks
# over shm, allreduce and sendrecv again over sockets (CFX_SHM_DISABLE=1),
# every type and op on 3 ranks, registered buffers (-R 1), nccl-tests'
# table and footer, JSON that parses, and a bad flag that is a usage error
# (exit 2).
#
#   tests/perf_smoke_test.sh path/to/conflux-perf
set -u
if [ $# -ne 1 ] || [ ! -x "$1" ]; then
  echo "usage: $0 path/to/conflux-perf" >&2
  exit 2
fi
perf=$1
export CFX_SOCKET_IFNAME=lo
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# expect_run NAME ARGS...: exit 0, a table of 13-column rows, no wrong
# elements, the memcpy line and nccl-tests' footer.
expect_run() {
  local name=$1
  shift
  local out=$work/$name.out err=$work/$name.err
  timeout 120 "$perf" "$@" > "$out" 2> "$err"
  local rc=$?
  if [ $rc -ne 0 ]; then
    fail "$name: exit $rc: $perf $*"
    sed 's/^/  | /' "$out" "$err" | tail -n 20
    return
  fi
  local rows bad_rows
  rows=$(grep -c '^ *[0-9]' "$out")
  bad_rows=$(awk '/^ *[0-9]/ && NF != 13' "$out" | wc -l)
  [ "$rows" -gt 0 ] || fail "$name: no result rows"
  [ "$bad_rows" -eq 0 ] || fail "$name: $bad_rows rows without 13 columns"
  grep -q '^# Out of bounds values : 0 OK$' "$out" || fail "$name: no '# Out of bounds values : 0 OK'"
  grep -q '^# Avg bus bandwidth    : [0-9.e+-]* $' "$out" || fail "$name: no avg bus bandwidth line"
  grep -q '^# memcpy bandwidth: [0-9.]* GB/s$' "$out" || fail "$name: no memcpy bandwidth line"
  echo "ok: $name ($rows sizes)"
}

# expect_usage_error NAME ARGS...: exit 2 and the usage text on stderr.
expect_usage_error() {
  local name=$1
  shift
  timeout 60 "$perf" "$@" > "$work/$name.out" 2> "$work/$name.err"
  local rc=$?
  if [ $rc -ne 2 ]; then
    fail "$name: exit $rc, expected 2: $perf $*"
  elif ! grep -q '^usage: ' "$work/$name.err"; then
    fail "$name: no usage text on stderr"
  else
    echo "ok: $name ($(head -n 1 "$work/$name.err"))"
  fi
}

# The command of the issue, with JSON.
expect_run allreduce_shm_2_ranks allreduce --np 2 -b 8 -e 1M -f 4 -n 5 -w 2 -c 1 \
  --json "$work/allreduce.json"
if python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$work/allreduce.json"; then
  echo "ok: allreduce JSON parses"
else
  fail "allreduce JSON does not parse"
fi
python3 - "$work/allreduce.json" "$work/allreduce_shm_2_ranks.out" <<'PY' || fail "JSON content"
import json, sys
doc = json.load(open(sys.argv[1]))
rows = [l for l in open(sys.argv[2]) if l.strip() and not l.startswith("#")]
keys = {"collective", "type", "op", "nranks", "bytes", "count", "time_us", "algbw", "busbw",
        "wrong", "inplace"}
res = doc["results"]
assert len(res) == 2 * len(rows), (len(res), len(rows))
for r in res:
    assert keys <= set(r), sorted(keys - set(r))
    assert r["collective"] == "allreduce" and r["nranks"] == 2 and r["wrong"] == 0, r
print("ok: allreduce JSON has %d results with every field" % len(res))
PY

# Every other collective, briefly, over shm.
for coll in broadcast reduce allgather reducescatter sendrecv alltoall gather scatter; do
  expect_run "${coll}_shm_2_ranks" "$coll" --np 2 -b 8 -e 256K -f 8 -n 3 -w 1 -c 1
done

# Sockets only.
for coll in allreduce sendrecv alltoall; do
  CFX_SHM_DISABLE=1 expect_run "${coll}_socket_2_ranks" "$coll" --np 2 -b 8 -e 256K -f 8 -n 3 \
    -w 1 -c 1
done

# Registered buffers (-R 1): registration works on every transport, and checked
# calls stay exact (shm and sockets keep their own paths).
expect_run allreduce_registered_2_ranks allreduce --np 2 -b 8 -e 1M -f 16 -n 2 -w 1 -c 1 -R 1
CFX_SHM_DISABLE=1 expect_run sendrecv_registered_socket_2_ranks sendrecv --np 2 -b 8 -e 1M \
  -f 16 -n 2 -w 1 -c 1 -R 1

# Odd rank count, every type and op: in-place offsets and the exact-value check.
expect_run reducescatter_all_types_ops_3_ranks reducescatter --np 3 -b 8 -e 4K -f 8 -n 1 -w 1 \
  -c 1 -d all -o all

# Three ranks as threads of one process (-t), every type and op.
name=reducescatter_all_types_ops_3_threads
if expect_run $name reducescatter -t 3 -b 8 -e 4K -f 8 -n 1 -w 1 -c 1 -d all -o all; then
  grep -Eq '^# conflux-perf reducescatter: .* 3 ranks, threads \(-t 3, one process\)$' \
    "$work/$name.out" || fail "$name: the header does not say threads"
fi

# Usage errors.
expect_usage_error threads_and_processes allreduce -t 2 --np 2
expect_usage_error bad_thread_count allreduce -t 0
expect_usage_error bad_flag allreduce --np 2 --no-such-flag
expect_usage_error bad_type allreduce --np 2 -d float13
expect_usage_error bad_collective alltoallw --np 2
expect_usage_error symmetric_registration allreduce --np 2 -R 2

if [ $failures -ne 0 ]; then
  echo "conflux-perf smoke test: $failures failed"
  exit 1
fi
echo "conflux-perf smoke test: all passed"
