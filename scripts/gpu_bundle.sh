#!/usr/bin/env bash
# Makes .gpu-bundle/bundle.tar.xz for scripts/gpu_check.sh, for a GPU machine
# that cannot build Conflux itself (no libxml2 headers, no Criterion): the
# GPU tests, conflux-perf and libconflux built here for one architecture
# (default sm_90), with the shared libraries they need that such a machine
# may lack (glibc and the C++ runtime excepted: the GPU machine's own, newer,
# serve). Then carry .gpu-bundle (git ignores it) in the device tool's run.
#
#   scripts/gpu_bundle.sh [ARCH]
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${1:-90}
build=build-gpu-bundle
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DCFX_WITH_TORCH=OFF > /dev/null
cmake --build "$build" -j"$(nproc)" --target test_cuda test_coll conflux-perf conflux
stage=$(mktemp -d)
mkdir -p "$stage/tests" "$stage/tools" "$stage/deps"
cp "$build/tests/test_cuda" "$build/tests/test_coll" "$stage/tests/"
cp "$build/tools/conflux-perf" "$stage/tools/"
cp -P "$build"/libconflux.so* "$stage/"
strip "$stage/tests/"* "$stage/tools/"* 2> /dev/null || true
for bin in "$stage/tests/"* "$stage/tools/"*; do
  ldd "$bin" | awk '/=> \// {print $3}'
done | sort -u | grep -vE '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/deps/"; done
mkdir -p .gpu-bundle
tar -cJf .gpu-bundle/bundle.tar.xz -C "$stage" .
echo "$(uname -n), $(date -u +%Y-%m-%d), $(git rev-parse --short HEAD), sm_$arch" > .gpu-bundle/made-on
rm -rf "$stage"
grep -qxF '/.gpu-bundle/' .git/info/exclude 2> /dev/null || echo '/.gpu-bundle/' >> .git/info/exclude
ls -la .gpu-bundle/
