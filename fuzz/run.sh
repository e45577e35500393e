#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang, -fsanitize=fuzzer,address,undefined)
# and runs each for SECONDS on a scratch copy of its seed corpus
# (fuzz/corpus/<name>/ is read, never written). Exits non-zero when a harness
# finds a crash, a leak, undefined behaviour or a broken invariant; the
# input that did it is saved as build-fuzz/artifacts/<name>-crash-*.
#
#   fuzz/run.sh [SECONDS] [NAME...]      default: 30 s each, every fuzz_*.c
#
# Environment: CFX_FUZZ_BUILD (default build-fuzz), CFX_FUZZ_JOBS (2),
# CFX_FUZZ_KEEP=DIR keeps the grown corpora in DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
shift || true
build=${CFX_FUZZ_BUILD:-build-fuzz}
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for src in fuzz/fuzz_*.c; do names+=("$(basename "$src" .c)"); done
fi

mkdir -p "$build"
cmake -S . -B "$build" -DCMAKE_C_COMPILER=clang -DCFX_FUZZ=ON -DCFX_WITH_CUDA=OFF \
  -DCFX_BUILD_TESTS=OFF -DCFX_BUILD_EXAMPLES=OFF -DCFX_WERROR=ON >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j"${CFX_FUZZ_JOBS:-2}" --target "${names[@]}" >"$build/build.log" 2>&1 ||
  { tail -50 "$build/build.log"; exit 1; }

work=${CFX_FUZZ_KEEP:-$(mktemp -d)}
mkdir -p "$build/artifacts"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
failed=0
summary=()
for name in "${names[@]}"; do
  mkdir -p "$work/$name"
  args=(-max_total_time="$seconds" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048
        -artifact_prefix="$build/artifacts/$name-")
  dict=fuzz/dict_${name#fuzz_}.txt
  [ -f "$dict" ] && args+=(-dict="$dict")
  case $name in fuzz_topo_xml) args+=(-max_len=16384) ;; fuzz_conf) args+=(-max_len=4096) ;; esac
  log="$build/$name.log"
  rc=0
  "$build/fuzz/$name" "${args[@]}" "$work/$name" "fuzz/corpus/$name" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
  corpus=$(find "$work/$name" -type f | wc -l)
  if [ "$rc" -eq 0 ]; then verdict=ok; else verdict="FAILED (exit $rc)"; failed=1; fi
  summary+=("$(printf '%-18s %4ss %10s execs %6s units %5s MB  %s' "$name" "$seconds" \
    "${execs:-?}" "$corpus" "${rss:-?}" "$verdict")")
  if [ "$rc" -ne 0 ]; then
    echo "== $name failed; the end of its log ($log):"
    tail -40 "$log"
  fi
done
[ -z "${CFX_FUZZ_KEEP:-}" ] && rm -rf "$work"
echo "== fuzzing summary (new units are those added to a scratch copy of the seeds)"
printf '%s\n' "${summary[@]}"
exit $failed
