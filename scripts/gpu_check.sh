#!/usr/bin/env bash
# The GPU check: one prepared command for a machine with one NVIDIA GPU
# (docs/performance.md, "GPU"). It
#   1. builds Conflux for this GPU's architecture only, on every core (or,
#      where the machine cannot build it, unpacks the bundle that
#      scripts/gpu_bundle.sh made on a build machine: .gpu-bundle/);
#   2. runs every GPU test on the real driver (CFX_TEST_GPU=1): tests/test_cuda
#      (streams, groups, host buffers on streams, failures, graph capture) and
#      the conformance suite's device-buffer cases (tests/test_coll);
#   3. sweeps conflux-perf on device buffers, 2 and 4 ranks on the one GPU,
#      8 B to 1 GiB, allreduce, allgather, broadcast and reduce-scatter, and,
#      where PyTorch's NCCL is importable, the same allreduce sweep through NCCL
#      (ranks sharing the GPU: NCCL_MULTI_RANK_GPU_ENABLE=1, when its version
#      takes it);
#   4. writes a short report (gpu_report.md) and the logs to $OUT (or ./gpu-out).
# It must finish in under 8 minutes: each step has its own time limit.
#
#   scripts/gpu_check.sh            everything
#   GPU_CHECK_STEPS="build tests" scripts/gpu_check.sh
#   GPU_CHECK_FAKE=build/tests/fakecuda/libcuda.so.1 scripts/gpu_check.sh
#       a rehearsal on a machine without a GPU, over tests/fakecuda (its
#       figures are not GPU figures; it checks the script's plumbing)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
steps=${GPU_CHECK_STEPS:-build tests perf nccl}
report=$out/gpu_report.md
jobs=$(nproc)
build=${GPU_CHECK_BUILD_DIR:-$root/build-gpu}
start_all=$(date +%s)
: > "$report"
say() { echo "$*" | tee -a "$report"; }
want() { case " $steps " in *" $1 "*) return 0 ;; esac; return 1; }

say "# Conflux GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
say ""
say '```'
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee -a "$report"
(command -v nvcc > /dev/null && nvcc --version | tail -2) 2>&1 | tee -a "$report"
say '```'

# ---------------------------------------------------------------- build
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2> /dev/null | head -1 | tr -d '. ')
arch=${arch:-90}
libdirs=""
if want build; then
  say ""
  say "## Build (sm_$arch)"
  t0=$(date +%s)
  if timeout 300 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
       -DCFX_WITH_TORCH=OFF > "$out/build.log" 2>&1 &&
     timeout 300 cmake --build "$build" -j"$jobs" --target test_cuda test_coll conflux-perf \
       >> "$out/build.log" 2>&1; then
    say "built here in $(( $(date +%s) - t0 )) s"
  elif [ -f .gpu-bundle/bundle.tar.xz ]; then
    say "cannot build here (build.log: $(grep -m1 -iE 'error|not found' "$out/build.log" || echo '?'));"
    say "using .gpu-bundle (made by scripts/gpu_bundle.sh on $(cat .gpu-bundle/made-on 2>/dev/null || echo '?'))"
    rm -rf "$build" && mkdir -p "$build" && tar -xJf .gpu-bundle/bundle.tar.xz -C "$build"
    libdirs=$build/deps
  else
    say "cannot build here and no .gpu-bundle: see build.log"
    tail -20 "$out/build.log" >> "$report"
    exit 1
  fi
fi
export LD_LIBRARY_PATH=${libdirs:+$libdirs:}$build:${LD_LIBRARY_PATH:-}
perf_max=${GPU_CHECK_MAX:-1G}
export CFX_SOCKET_IFNAME=lo CFX_CONF_FILE=/nonexistent
if [ -n "${GPU_CHECK_FAKE:-}" ]; then
  fake=$(realpath "$GPU_CHECK_FAKE")
  export CFX_TEST_FAKECUDA=$fake CFX_CUDA_DRIVER_LIB=$fake
  perf_max=${GPU_CHECK_MAX:-4M} # The fake is a CPU: 1 GiB sweeps take minutes.
  say ""
  say "**Rehearsal over fake-cuda ($fake): no figure below is a GPU figure.**"
else
  export CFX_TEST_GPU=1
  unset CFX_CUDA_DRIVER_LIB
fi

# ---------------------------------------------------------------- tests
if want tests; then
  say ""
  say "## GPU tests (the real driver, CFX_TEST_GPU=1)"
  for t in test_cuda test_coll; do
    filter=()
    [ $t = test_coll ] && filter=(--filter 'conformance/*')
    t0=$(date +%s)
    # The conformance suite's device cases only (its host cases are CI's).
    CFX_TEST_DEVICE_ONLY=1 timeout 180 "$build/tests/$t" --jobs "$([ $t = test_coll ] && echo 2 || echo 1)" \
      --short-filename "${filter[@]}" > "$out/$t.log" 2>&1
    rc=$?
    synth=$(grep -a 'Synthesis' "$out/$t.log" | tail -1)
    say "- $t: exit $rc in $(( $(date +%s) - t0 )) s: ${synth:-no summary (see $t.log)}"
    grep -a -E '^\[FAIL\]|Assertion Failed' -A3 "$out/$t.log" | head -40 >> "$out/failures.log"
  done
  [ -s "$out/failures.log" ] && { say ""; say "First failures:"; say '```'; head -40 "$out/failures.log" | tee -a "$report" > /dev/null; say '```'; }
fi

# ---------------------------------------------------------------- perf
perf=$build/tools/conflux-perf
if want perf; then
  say ""
  say "## conflux-perf on device buffers (ranks share the one GPU)"
  for np in 2 4; do
    for coll in allreduce allgather broadcast reducescatter; do
      log=$out/perf_${coll}_${np}.txt
      timeout 90 "$perf" "$coll" --np "$np" --mem device -b 8 -e "$perf_max" -f 4 -n 5 -w 2 -c 1 \
        > "$log" 2>&1
      rc=$?
      say ""
      say "### $coll, $np ranks (exit $rc)"
      say '```'
      grep -a -E '^#  Rank|^ +[0-9]+ |Avg bus|memcpy|Out of bounds|wrong' "$log" | tee -a "$report" > /dev/null
      say '```'
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
    for np in 2 4; do
      NCCL_MULTI_RANK_GPU_ENABLE=1 timeout 120 "$py" "$root/bench/nccl_allreduce_sweep.py" --np "$np" \
        -b 8 -e "$perf_max" -f 4 -n 5 -w 2 > "$out/nccl_allreduce_$np.txt" 2>&1
      rc=$?
      say ""
      say "### NCCL allreduce, $np ranks (exit $rc)"
      say '```'
      tail -25 "$out/nccl_allreduce_$np.txt" | tee -a "$report" > /dev/null
      say '```'
    done
  else
    say "PyTorch with CUDA and NCCL is not importable here: skipped"
  fi
fi

say ""
say "Total: $(( $(date +%s) - start_all )) s"
