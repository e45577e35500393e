#!/usr/bin/env bash
# Configuring without an optional dependency builds without it (AUTO), and
# without a required one stops with a sentence naming the Debian package and
# scripts/deps.sh. The dependencies are hidden from pkg-config (an almost
# empty PKG_CONFIG_LIBDIR), never uninstalled.
#   configure_without_deps_test.sh SOURCE_DIR
set -u
src=${1:?usage: $0 SOURCE_DIR}
work=$(mktemp -d /tmp/cfx-nodeps.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail=0

configure() { # configure NAME PKG_CONFIG_LIBDIR [cmake args...]
  local name=$1 pcdir=$2
  shift 2
  PKG_CONFIG_LIBDIR=$pcdir PKG_CONFIG_PATH= cmake -S "$src" -B "$work/$name" \
    -DCFX_WITH_CUDA=OFF -DCFX_BUILD_TESTS=OFF -DCFX_BUILD_EXAMPLES=OFF "$@" >"$work/$name.log" 2>&1
}

expect() { # expect NAME TEXT: the log of NAME holds TEXT (CMake wraps lines)
  if ! tr -s ' \n' '  ' <"$work/$1.log" | grep -qF -- "$2"; then
    echo "FAIL: $1: no \"$2\" in:"
    cat "$work/$1.log"
    fail=1
  fi
}

# pkg-config sees only libxml2: hwloc is missing.
xml_pc=$(pkg-config --variable=pcfiledir libxml-2.0)/libxml-2.0.pc
mkdir -p "$work/pc-xml" "$work/pc-none"
ln -s "$xml_pc" "$work/pc-xml/"

if configure no-hwloc "$work/pc-xml"; then
  expect no-hwloc "hwloc not found, building without it"
  expect no-hwloc "libhwloc-dev"
else
  echo "FAIL: configuring without hwloc (CFX_WITH_HWLOC=AUTO) failed:"
  cat "$work/no-hwloc.log"
  fail=1
fi

if configure hwloc-on "$work/pc-xml" -DCFX_WITH_HWLOC=ON; then
  echo "FAIL: CFX_WITH_HWLOC=ON without hwloc configured"
  fail=1
else
  expect hwloc-on "CFX_WITH_HWLOC=ON but hwloc was not found; install libhwloc-dev"
  expect hwloc-on "scripts/deps.sh"
fi

# Nothing at all: libxml2, which is required, is missing.
if configure no-xml "$work/pc-none"; then
  echo "FAIL: configuring without libxml2 succeeded"
  fail=1
else
  expect no-xml "install libxml2-dev (scripts/deps.sh installs every dependency)"
fi

[ $fail -eq 0 ] && echo "OK: configure names the missing packages"
exit $fail
