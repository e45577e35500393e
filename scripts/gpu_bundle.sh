#!/usr/bin/env bash
# Makes .gpu-bundle/bundle.tar.xz for scripts/gpu_check.sh, for a GPU machine
# that cannot build Conflux itself (no libxml2 headers, no Criterion): the
# GPU tests, the kernel tests, the NCCL drop-in and its test program,
# conflux-perf and libconflux, with the shared libraries they need that such
# a machine may lack (glibc and the C++ runtime excepted: the GPU machine's
# own, newer, serve). Then carry .gpu-bundle (git ignores it) in the device
# tool's run.
#
#   scripts/gpu_bundle.sh [ARCH]        its own build (build-gpu-bundle), sm_ARCH (default 90)
#   GPU_BUNDLE_BUILD_DIR=build scripts/gpu_bundle.sh
#                                       from an existing build (its architectures: 80;90 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${1:-90}
build=${GPU_BUNDLE_BUILD_DIR:-build-gpu-bundle}
targets=(test_cuda test_coll conflux-perf conflux conn_kernel_test steploop_kernel_test
  cuda_blocking_probe step_bandwidth)
if [ -z "${GPU_BUNDLE_BUILD_DIR:-}" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    -DCFX_WITH_TORCH=OFF > /dev/null
else
  arch=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt" | tr ';' ,)
  arch=${arch:-80,90} # cmake/ConfluxOptions.cmake's default
fi
# The drop-in's test program exists where NVIDIA's nccl.h was found.
grep -q '^nccl_dropin_test:' <(cmake --build "$build" --target help | sed 's/^\.\.\. //') &&
  targets+=(nccl_dropin_test conflux_nccl)
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
stage=$(mktemp -d)
mkdir -p "$stage/tests/nccl" "$stage/tools" "$stage/deps" "$stage/lib/nccl"
cp "$build/tests/test_cuda" "$build/tests/test_coll" "$build/tests/conn_kernel_test" \
  "$build/tests/steploop_kernel_test" "$build/tests/cuda_blocking_probe" \
  "$build/tests/step_bandwidth" "$stage/tests/"
[ -x "$build/tests/nccl/nccl_dropin_test" ] && cp "$build/tests/nccl/nccl_dropin_test" "$stage/tests/nccl/"
[ -d "$build/lib/nccl" ] && cp -P "$build"/lib/nccl/libnccl.so* "$stage/lib/nccl/"
cp "$build/tools/conflux-perf" "$stage/tools/"
cp -P "$build"/libconflux.so* "$stage/"
strip "$stage/tests/"* "$stage/tests/nccl/"* "$stage/tools/"* 2> /dev/null || true
for bin in "$stage/tests/"* "$stage/tests/nccl/"* "$stage/tools/"*; do
  [ -f "$bin" ] && ldd "$bin"
done | awk '/=> \// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|libresolv|libnsl|libutil|libanl|libgcc_s|libstdc\+\+|ld-linux[^/]*|libconflux|libnccl)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/deps/"; done
mkdir -p .gpu-bundle
tar -cJf .gpu-bundle/bundle.tar.xz -C "$stage" .
echo "$(uname -n), $(date -u +%Y-%m-%d), $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes'), sm_$arch" \
  > .gpu-bundle/made-on
rm -rf "$stage"
grep -qxF '/.gpu-bundle/' .git/info/exclude 2> /dev/null || echo '/.gpu-bundle/' >> .git/info/exclude
ls -la .gpu-bundle/
