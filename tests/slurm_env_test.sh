#!/usr/bin/env bash
# srun -n N starts conflux-perf and examples/allreduce_env without a wrapper:
# rank and size from SLURM_PROCID and SLURM_NTASKS, the root from
# CFX_COMM_ID, else SLURM_LAUNCH_NODE_IPADDR and a port derived from
# SLURM_JOB_ID/SLURM_STEP_ID. Slurm is not needed: this script sets the
# variables srun sets and starts the N processes itself, each under a
# deadline. A batch script's environment (no SLURM_STEP_ID) stays one rank.
#
#   tests/slurm_env_test.sh path/to/allreduce_env path/to/conflux-perf
set -u
if [ $# -ne 2 ] || [ ! -x "$1" ] || [ ! -x "$2" ]; then
  echo "usage: $0 path/to/allreduce_env path/to/conflux-perf" >&2
  exit 2
fi
example=$1
perf=$2
export CFX_SOCKET_IFNAME=lo
unset RANK WORLD_SIZE MASTER_ADDR MASTER_PORT CFX_COMM_ID OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK \
  PMI_SIZE PMI_RANK SLURM_STEP_NUM_TASKS
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# srun_like NAME NTASKS COMMAND...: NTASKS processes with srun's variables
# (a random job id: a port of its own); 0 when every task exits 0.
srun_like() {
  local name=$1 ntasks=$2
  shift 2
  local job=$((RANDOM * 8 + RANDOM % 8)) pids="" rank failed=0
  for ((rank = 0; rank < ntasks; rank++)); do
    SLURM_JOB_ID=$job SLURM_STEP_ID=0 SLURM_PROCID=$rank SLURM_NTASKS=$ntasks \
      SLURM_LAUNCH_NODE_IPADDR=127.0.0.1 timeout 60 "$@" >"$work/$name.$rank.out" 2>&1 &
    pids="$pids $!"
  done
  for pid in $pids; do
    wait "$pid" || failed=$((failed + 1))
  done
  if [ $failed -ne 0 ]; then
    fail "$name: $failed of $ntasks tasks failed: $*"
    tail -n 5 "$work/$name".*.out | sed 's/^/  | /'
    return 1
  fi
  return 0
}

# expect NAME RANK TEXT: task RANK's output of NAME holds TEXT.
expect() {
  grep -qF -- "$3" "$work/$1.$2.out" || {
    fail "$1: task $2 printed no \"$3\":"
    sed 's/^/  | /' "$work/$1.$2.out" | head -n 20
  }
}

# The example: every task holds the exact sum of 3 ranks.
f0=$failures
if srun_like example 3 "$example" 4096; then
  for rank in 0 1 2; do expect example $rank "rank $rank of 3: allreduce of 4096 floats OK"; done
  [ $failures -eq $f0 ] && echo "ok: allreduce_env, 3 tasks, root at the srun host"
fi

# conflux-perf: 3 ranks, checked data, the launch line names srun.
f0=$failures
if srun_like perf 3 "$perf" allreduce -b 1K -e 1K -n 2 -w 1; then
  expect perf 0 "3 ranks, srun (SLURM_PROCID/SLURM_NTASKS), CFX_COMM_ID=127.0.0.1:"
  expect perf 0 "# Out of bounds values : 0 OK"
  [ $failures -eq $f0 ] && echo "ok: conflux-perf, 3 tasks, root at the srun host"
fi

# CFX_COMM_ID, when set, names the root.
# Below the ephemeral range (32768-60999 here), where outgoing connections take theirs.
port=$((20000 + RANDOM % 10000))
f0=$failures
if CFX_COMM_ID=127.0.0.1:$port srun_like perf_comm_id 2 "$perf" allreduce -b 1K -e 1K -n 2 -w 1; then
  expect perf_comm_id 0 "2 ranks, srun (SLURM_PROCID/SLURM_NTASKS), CFX_COMM_ID=127.0.0.1:$port"
  [ $failures -eq $f0 ] && echo "ok: conflux-perf, 2 tasks, root at CFX_COMM_ID"
fi

# A batch script (SLURM_PROCID=0, SLURM_NTASKS=3, no step) is one rank, not a hang.
if SLURM_JOB_ID=1 SLURM_PROCID=0 SLURM_NTASKS=3 timeout 60 "$perf" allreduce -b 1K -e 1K -n 2 -w 1 \
  >"$work/batch.0.out" 2>&1; then
  f0=$failures
  expect batch 0 "1 rank, one process"
  [ $failures -eq $f0 ] && echo "ok: conflux-perf in a batch script without srun is one rank"
else
  fail "conflux-perf in a batch script's environment failed"
  sed 's/^/  | /' "$work/batch.0.out" | tail -n 5
fi

if [ $failures -eq 0 ]; then
  echo "slurm env test: all passed"
else
  echo "slurm env test: $failures failed"
  exit 1
fi
