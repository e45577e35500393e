#!/usr/bin/env bash
# The GPU check: one prepared command for a machine with one NVIDIA GPU
# (docs/performance.md, "GPU"). It
#   1. builds Conflux for this GPU's architecture only, on every core, or
#      unpacks the bundle that scripts/gpu_bundle.sh made on a build machine
#      (.gpu-bundle/; GPU_CHECK_BUNDLE=1 uses it without trying to build);
#   2. smoke: one 2-rank allreduce on device buffers with CFX_DEBUG=INFO,
#      and the probe of which CUDA calls wait for a running kernel
#      (tests/gpu/blocking_probe.cu);
#   3. every GPU test on the real driver (CFX_TEST_GPU=1): tests/test_cuda
#      (streams, groups, host buffers on streams, failures, graph capture)
#      at CFX_DEBUG=WARN, and the tests of GPU_CHECK_DIAG (Criterion
#      filters) again alone at CFX_DEBUG=INFO, GPU_CHECK_DIAG_REPEAT times
#      as they are and as many with GPU_CHECK_DIAG_VARIANT (VAR=value ...,
#      default CFX_ALGO=ring) set; then, side by side, the conformance suite's device-buffer cases
#      (tests/test_coll), the connector and step-loop kernel tests
#      (tests/gpu) and the NCCL drop-in's every-collective program on device
#      buffers; with the step teams, test_cuda again with every chain on a
#      team of 4 blocks from 1 KiB steps up (CFX_CUDA_BLOCKS=4
#      CFX_CUDA_BLOCK_BYTES=1024);
#   bw. how fast one big step's data moves (tests/gpu/step_bandwidth.cu:
#      the executor's cfx_steploop_data on 1 to 264 blocks against a device
#      to device copy, GPU_CHECK_BW_MIB per operand);
#   4. sweeps conflux-perf on device buffers, 2 and 4 ranks on the one GPU
#      (allreduce; GPU_CHECK_COLLS for more), as threads of one process
#      (-t: one context, kernels at once) and as processes (--np: the GPU
#      time-slices between them; GPU_CHECK_LAUNCH), and, with the step nccl, the
#      same allreduce sweep through PyTorch's NCCL (not by default: NCCL
#      2.28.9 refuses two ranks on one GPU, "Duplicate GPU detected", even
#      with NCCL_MULTI_RANK_GPU_ENABLE=1; seen on an H200 on 2026-12-04);
#      each sweep once per setting of GPU_CHECK_PERF_ENV ("|"-separated
#      sets of VAR=value; "-" for none; default "- | CFX_MAX_NCHANNELS=1": the
#      rings of docs/tuning.md against one ring);
#   5. writes a short report (gpu_report.md), the first failures
#      (failures.log) and every log (logs.tar.gz) to $OUT (or ./gpu-out).
# It stops starting steps once GPU_CHECK_BUDGET seconds (default 380) have
# passed, and every step's time limit is cut to what is left, so the report
# is always written.
#
#   scripts/gpu_check.sh            everything
#   GPU_CHECK_STEPS="bundle tests" scripts/gpu_check.sh
#   GPU_CHECK_FAKE=build/tests/fakecuda/libcuda.so.1 GPU_CHECK_BUILD_DIR=build scripts/gpu_check.sh
#       a rehearsal on a machine without a GPU, over tests/fakecuda (its
#       figures are not GPU figures; it checks the script's plumbing)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
logs=$(mktemp -d)
steps=${GPU_CHECK_STEPS:-build smoke tests teams diag side bw perf}
diag=${GPU_CHECK_DIAG:-}
diag_repeat=${GPU_CHECK_DIAG_REPEAT:-1}
diag_variant=${GPU_CHECK_DIAG_VARIANT:-CFX_ALGO=ring}
report=$out/gpu_report.md
jobs=$(nproc)
build=${GPU_CHECK_BUILD_DIR:-$root/build-gpu}
budget=${GPU_CHECK_BUDGET:-380}
colls=${GPU_CHECK_COLLS:-allreduce}
launches=${GPU_CHECK_LAUNCH:-threads procs}
nps=${GPU_CHECK_NPS:-2 4}
perf_envs=${GPU_CHECK_PERF_ENV:-- | CFX_MAX_NCHANNELS=1}
bw_mib=${GPU_CHECK_BW_MIB:-256}
start_all=$(date +%s)
: > "$report"
: > "$logs/failures.log"
say() { echo "$*" | tee -a "$report"; }
want() { case " $steps " in *" $1 "*) return 0 ;; esac; return 1; }
elapsed() { echo $(($(date +%s) - start_all)); }
# limit N: N seconds, or what is left of the budget (0: skip the step).
limit() {
  local left=$((budget - $(elapsed)))
  [ "$left" -lt 10 ] && { echo 0; return; }
  [ "$1" -lt "$left" ] && echo "$1" || echo "$left"
}
finish() {
  say ""
  say "Total: $(elapsed) s"
  cp "$logs/failures.log" "$out/failures.log"
  tar -czf "$out/logs.tar.gz" -C "$logs" . 2> /dev/null
  rm -rf "$logs"
  exit "${1:-0}"
}

say "# Conflux GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
say ""
say '```'
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,compute_cap --format=csv 2>&1 | tee -a "$report"
(command -v nvcc > /dev/null && nvcc --version | tail -2) 2>&1 | tee -a "$report"
say "$(nproc) cores; $(uname -r)"
say '```'

# ---------------------------------------------------------------- build
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2> /dev/null | head -1 | tr -d '. ')
arch=${arch:-90}
libdirs=""
use_bundle() {
  say "using .gpu-bundle (made by scripts/gpu_bundle.sh: $(cat .gpu-bundle/made-on 2>/dev/null || echo '?'))"
  build=$root/build-gpu-bundle-x
  rm -rf "$build" && mkdir -p "$build" && tar -xJf .gpu-bundle/bundle.tar.xz -C "$build" || finish 1
  libdirs=$build/deps
}
if [ "${GPU_CHECK_BUNDLE:-0}" = 1 ]; then
  say ""
  say "## Bundle"
  use_bundle
elif want build; then
  say ""
  say "## Build (sm_$arch)"
  t0=$(date +%s)
  if timeout 300 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
       -DCFX_WITH_TORCH=OFF > "$logs/build.log" 2>&1 &&
     timeout 300 cmake --build "$build" -j"$jobs" --target test_cuda test_coll conflux-perf \
       conn_kernel_test steploop_kernel_test step_bandwidth >> "$logs/build.log" 2>&1; then
    say "built here in $(( $(date +%s) - t0 )) s"
  elif [ -f .gpu-bundle/bundle.tar.xz ]; then
    say "cannot build here (build.log: $(grep -m1 -iE 'error|not found' "$logs/build.log" || echo '?'));"
    use_bundle
  else
    say "cannot build here and no .gpu-bundle: see build.log"
    tail -20 "$logs/build.log" >> "$report"
    finish 1
  fi
fi
# Our programs see the bundle's libraries; nothing else does (PyTorch keeps its own).
ours() { LD_LIBRARY_PATH=${libdirs:+$libdirs:}$build:$build/lib/nccl:${LD_LIBRARY_PATH:-} "$@"; }
perf_max=${GPU_CHECK_MAX:-64M}
export CFX_SOCKET_IFNAME=lo CFX_CONF_FILE=/nonexistent
# A stuck call fails within this, naming the rank it waits for (tests set their own).
export CFX_TIMEOUT=${CFX_TIMEOUT:-30}
if [ -n "${GPU_CHECK_FAKE:-}" ]; then
  fake=$(realpath "$GPU_CHECK_FAKE")
  export CFX_TEST_FAKECUDA=$fake CFX_CUDA_DRIVER_LIB=$fake
  perf_max=${GPU_CHECK_MAX:-4M} # The fake is a CPU: large sweeps take minutes.
  say ""
  say "**Rehearsal over fake-cuda ($fake): no figure below is a GPU figure.**"
else
  export CFX_TEST_GPU=1
  unset CFX_CUDA_DRIVER_LIB
fi
perf=$build/tools/conflux-perf

# first_failures LOG: its failing tests' lines into failures.log.
first_failures() {
  { echo "== $(basename "$1")"; grep -a -E '^\[FAIL\]|Assertion Failed|FAIL|hung|timed out|Timeout' -A4 "$1" | head -60; } \
    >> "$logs/failures.log"
}

# ---------------------------------------------------------------- smoke
if want smoke && [ "$(limit 40)" -gt 0 ]; then
  say ""
  say "## Smoke: allreduce of 1 MiB, 2 ranks, device buffers, CFX_DEBUG=INFO"
  t0=$(date +%s)
  CFX_DEBUG=INFO ours timeout "$(limit 40)" "$perf" allreduce --np 2 --mem device -b 1M -e 1M -n 3 -w 1 -c 1 \
    > "$logs/smoke.log" 2>&1
  rc=$?
  say "exit $rc in $(( $(date +%s) - t0 )) s"
  say '```'
  grep -a -E '^ +[0-9]+ |wrong|WARN|rror' "$logs/smoke.log" | head -12 | tee -a "$report" > /dev/null
  say '```'
  [ $rc -ne 0 ] && first_failures "$logs/smoke.log"
  if [ -x "$build/tests/cuda_blocking_probe" ] && [ "$(limit 60)" -gt 0 ]; then
    say ""
    say "## Which CUDA calls wait for a running kernel of their context"
    say '```'
    ours timeout "$(limit 60)" "$build/tests/cuda_blocking_probe" 2>&1 | tee "$logs/probe.log" | tee -a "$report" > /dev/null
    say '```'
  fi
fi

# run_suite NAME LIMIT ARGS...: a Criterion program of the bundle, its summary line.
run_suite() {
  local name=$1 lim
  lim=$(limit "$2")
  shift 2
  [ "$lim" -gt 0 ] || { say "- $name: skipped (out of time)"; return; }
  local t0 rc synth
  t0=$(date +%s)
  ours timeout "$lim" "$@" > "$logs/$name.log" 2>&1
  rc=$?
  synth=$(grep -a 'Synthesis' "$logs/$name.log" | tail -1)
  [ -z "$synth" ] && synth=$(tail -1 "$logs/$name.log")
  say "- $name: exit $rc in $(( $(date +%s) - t0 )) s: ${synth:-no output}"
  [ $rc -ne 0 ] && first_failures "$logs/$name.log"
}

# ---------------------------------------------------------------- tests
if want tests; then
  say ""
  say "## GPU tests (CFX_TEST_GPU=1, or the fake)"
  # Alone: some of its tests time what the GPU does (abort within a second).
  CFX_DEBUG=WARN run_suite test_cuda 150 "$build/tests/test_cuda" --jobs 1 --timeout 60 --short-filename
fi
if want teams; then
  ( export CFX_CUDA_BLOCKS=4 CFX_CUDA_BLOCK_BYTES=1024
    CFX_DEBUG=WARN run_suite test_cuda_teams 150 "$build/tests/test_cuda" --jobs 1 --timeout 60 \
      --short-filename )
fi
if want diag && [ -n "$diag" ]; then
  say ""
  say "## Diagnosis: $diag alone at CFX_DEBUG=INFO, $diag_repeat times, then as often with $diag_variant"
  for f in $diag; do
    tag=$(echo "$f" | tr -c 'A-Za-z0-9_' '_' | cut -c1-40)
    for i in $(seq "$diag_repeat"); do
      CFX_DEBUG=INFO CFX_DEBUG_SUBSYS=INIT,COLL,TUNING,P2P CFX_TIMEOUT=5 \
        run_suite "diag_${tag}_$i" 30 "$build/tests/test_cuda" --jobs 1 --timeout 25 --short-filename --filter "$f"
    done
    for i in $(seq "$diag_repeat"); do
      # shellcheck disable=SC2086 # VAR=value words
      ( export $diag_variant
        CFX_DEBUG=INFO CFX_DEBUG_SUBSYS=INIT,COLL,TUNING,P2P CFX_TIMEOUT=5 \
          run_suite "diag_variant_${tag}_$i" 30 "$build/tests/test_cuda" --jobs 1 --timeout 25 \
          --short-filename --filter "$f" )
    done
  done
fi
if want side; then
  say ""
  say "## Side by side: the conformance suite's device cases, the kernel tests, the NCCL drop-in"
  lim=$(limit 150)
  if [ "$lim" -gt 0 ]; then
    ( export CFX_TEST_DEVICE_ONLY=1
      run_suite test_coll "$lim" "$build/tests/test_coll" --jobs 4 --timeout 90 \
        --short-filename --filter 'conformance/*' ) &
    ( run_suite conn_kernel 40 "$build/tests/conn_kernel_test"
      run_suite steploop_kernel 40 "$build/tests/steploop_kernel_test" ) &
    if [ -x "$build/tests/nccl/nccl_dropin_test" ]; then
      CFX_DROPIN_PATH=$build/lib/nccl/libnccl.so.2 NCCL_MULTI_RANK_GPU_ENABLE=1 \
        run_suite nccl_dropin_device 60 "$build/tests/nccl/nccl_dropin_test" --device-buffers &
    fi
    wait
  fi
fi

# ---------------------------------------------------------------- bw
if want bw && [ -x "$build/tests/step_bandwidth" ] && [ -z "${GPU_CHECK_FAKE:-}" ]; then
  lim=$(limit 60)
  if [ "$lim" -gt 0 ]; then
    say ""
    say "## One step's data: cfx_steploop_data on N blocks against a D2D copy ($bw_mib MiB)"
    say '```'
    ours timeout "$lim" "$build/tests/step_bandwidth" "$bw_mib" > "$logs/step_bandwidth.log" 2>&1
    rc=$?
    tee -a "$report" < "$logs/step_bandwidth.log" > /dev/null
    say '```'
    say "exit $rc"
    [ $rc -ne 0 ] && first_failures "$logs/step_bandwidth.log"
  fi
fi

# ---------------------------------------------------------------- perf
if want perf; then
  say ""
  say "## conflux-perf on device buffers (ranks share the one GPU)"
  IFS='|' read -r -a perf_env_list <<< "$perf_envs"
  for np in $nps; do
    for coll in $colls; do
     for how in $launches; do
      for penv in "${perf_env_list[@]}"; do
      penv=$(echo "$penv" | xargs)
      [ "$penv" = "-" ] && penv=""
      lim=$(limit 60)
      [ "$lim" -gt 0 ] || { say "- $coll $np ranks ($how${penv:+, $penv}): skipped (out of time)"; continue; }
      tag=$(printf %s "$penv" | tr -c 'A-Za-z0-9_' '_')
      log=$logs/perf_${coll}_${np}_${how}${tag:+_$tag}.txt
      ranks_flag=--np
      [ "$how" = threads ] && ranks_flag=-t
      # shellcheck disable=SC2086 # VAR=value words
      ( [ -n "$penv" ] && export $penv
        ours timeout "$lim" "$perf" "$coll" "$ranks_flag" "$np" --mem device -b 8 -e "$perf_max" -f 4 \
          -n 5 -w 2 -c 1 > "$log" 2>&1 )
      rc=$?
      say ""
      say "### $coll, $np ranks as $how${penv:+, $penv} (exit $rc)"
      say '```'
      grep -a -E '^#  Rank|^ +[0-9]+ |Avg bus|memcpy|copy|enqueue|Out of bounds|wrong' "$log" | tee -a "$report" > /dev/null
      say '```'
      [ $rc -ne 0 ] && first_failures "$log"
      done
     done
    done
  done
fi

# ---------------------------------------------------------------- nccl
if want nccl; then
  say ""
  say "## NCCL (PyTorch's) on the same GPU, allreduce float32"
  py=$(command -v python3)
  if "$py" -c 'import torch, torch.distributed as d; assert torch.cuda.is_available() and d.is_nccl_available()' 2> /dev/null; then
    ver=$("$py" -c 'import torch; print(".".join(map(str, torch.cuda.nccl.version())))')
    say "torch $("$py" -c 'import torch; print(torch.__version__)'), NCCL $ver"
    for np in $nps; do
      lim=$(limit 60)
      [ "$lim" -gt 0 ] || { say "- NCCL $np ranks: skipped (out of time)"; continue; }
      NCCL_MULTI_RANK_GPU_ENABLE=1 timeout "$lim" "$py" "$root/bench/nccl_allreduce_sweep.py" --np "$np" \
        -b 8 -e "$perf_max" -f 4 -n 5 -w 2 > "$logs/nccl_allreduce_$np.txt" 2>&1
      rc=$?
      say ""
      say "### NCCL allreduce, $np ranks (exit $rc)"
      say '```'
      tail -25 "$logs/nccl_allreduce_$np.txt" | tee -a "$report" > /dev/null
      say '```'
    done
  else
    say "PyTorch with CUDA and NCCL is not importable here: skipped"
  fi
fi

finish 0
