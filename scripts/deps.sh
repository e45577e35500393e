#!/usr/bin/env bash
# Installs the Debian packages Conflux builds and tests with. Idempotent.
# CUDA is optional: the build finds nvcc when the CUDA toolkit is installed.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
packages=(
  build-essential cmake pkg-config      # toolchain
  libcriterion-dev                      # tests
  libhwloc-dev libibverbs-dev librdmacm-dev libxml2-dev  # topology, verbs
  iproute2                              # network namespaces in tests
  openmpi-bin libopenmpi-dev            # examples/allreduce_mpi and its test
  clang libclang-rt-14-dev              # fuzz/ (libFuzzer, sanitizer runtimes for clang)
  clang-format                          # scripts/format.sh --check (CI stage format)
  # bindings/pytorch and its tests (CFX_WITH_TORCH), for /usr/bin/python3:
  # torch 1.13 and what building an extension against it needs. About a
  # minute on a fresh Debian 12 (many packages, one apt-get run).
  python3-torch pybind11-dev python3-dev g++
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
