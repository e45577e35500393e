#!/usr/bin/env bash
# Installs the built Conflux into a scratch prefix and builds an outside
# program against it twice: through pkg-config and through find_package.
# Usage: install_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1
build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" > "$work/install.log"
libdir=$(ls -d "$prefix"/lib*/ | head -n 1)
libdir=${libdir%/}
for f in include/conflux.h; do
  [ -f "$prefix/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done
ls "$libdir"/libconflux.so.* "$libdir"/libconflux.a > /dev/null
soname=$(objdump -p "$libdir/libconflux.so" | awk '/SONAME/ {print $2}')
[ "$soname" = "libconflux.so.0" ] || { echo "FAIL: SONAME is '$soname'"; exit 1; }
# Only the public API is exported.
leaked=$(nm -D --defined-only "$libdir/libconflux.so" | awk '{print $3}' | grep -v '^cfx[A-Z]' | grep -v '^CONFLUX_' || true)
[ -z "$leaked" ] || { echo "FAIL: non-API symbols exported: $leaked"; exit 1; }
# Every function conflux.h declares is exported (cfxAlltoAll, cfxMemAlloc, ...).
declared=$(grep -o '^CFX_API [^(]*(' "$prefix/include/conflux.h" | sed -E 's/.*[ *]([A-Za-z0-9_]+)\($/\1/' | sort -u)
exported=$(nm -D --defined-only "$libdir/libconflux.so" | awk '{print $3}' | sed 's/@.*//' | sort -u)
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
[ -z "$missing" ] || { echo "FAIL: declared in conflux.h but not exported: $missing"; exit 1; }
[ "$(echo "$declared" | wc -l)" -ge 30 ] || { echo "FAIL: found only these declarations: $declared"; exit 1; }
# CUDA and verbs are loaded at run time: one build runs on hosts without them.
needed=$(objdump -p "$libdir/libconflux.so" | awk '/NEEDED/ {print $2}')
if echo "$needed" | grep -E '^lib(cudart|cuda|ibverbs|rdmacm|nvidia-ml)\.' ; then
  echo "FAIL: libconflux.so links the libraries above directly (load them at run time)"
  exit 1
fi

export CFX_SOCKET_IFNAME=lo
# 1. pkg-config
export PKG_CONFIG_PATH=$libdir/pkgconfig
cc -std=c11 "$src/tests/consumer/consumer.c" -o "$work/consumer_pc" $(pkg-config --cflags --libs conflux)
LD_LIBRARY_PATH=$libdir "$work/consumer_pc"
# 2. find_package(Conflux)
cmake -S "$src/tests/consumer" -B "$work/consumer_build" -DCMAKE_PREFIX_PATH="$prefix" > "$work/cmake.log"
cmake --build "$work/consumer_build" > "$work/build.log"
LD_LIBRARY_PATH=$libdir "$work/consumer_build/consumer"
echo "install test: pkg-config and find_package(Conflux) consumers built and ran"
# 3. torch_conflux (when built): the installed package imports from the
# prefix alone and loads the installed libconflux, not the build tree's.
if [ -d "$build/python/torch_conflux" ]; then
  pkg=$(ls -d "$libdir"/python3*/dist-packages 2>/dev/null | head -n 1)
  [ -n "$pkg" ] && [ -f "$pkg/torch_conflux/__init__.py" ] || {
    echo "FAIL: torch_conflux not installed under $libdir/python3*/dist-packages"; exit 1; }
  loaded=$(cd "$work" && PYTHONPATH=$pkg /usr/bin/python3 -c '
import torch_conflux, torch.distributed as dist
assert "CONFLUX" in dist.Backend._plugins
print(next(l.split()[-1] for l in open("/proc/self/maps") if "libconflux" in l))')
  case "$loaded" in
    "$prefix"/*) echo "install test: torch_conflux imports from the prefix ($loaded)" ;;
    *) echo "FAIL: installed torch_conflux loaded libconflux from '$loaded'"; exit 1 ;;
  esac
fi
