#!/usr/bin/env bash
# Formats the tree's C, CUDA and header files with the checked-in
# .clang-format (Debian's clang-format), or checks that they are formatted.
#
#   scripts/format.sh            rewrite every tracked source file in place
#   scripts/format.sh --check    list the files that differ; exit 1 if any
set -euo pipefail
cd "$(dirname "$0")/.."
fmt=${CLANG_FORMAT:-clang-format}
command -v "$fmt" > /dev/null || { echo "format: $fmt not found (apt-get install clang-format)"; exit 2; }
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do
    "$fmt" --dry-run --Werror "$f" > /dev/null 2>&1 || bad+=("$f")
  done
  if [ ${#bad[@]} -gt 0 ]; then
    echo "format: ${#bad[@]} of ${#files[@]} files differ from .clang-format ($("$fmt" --version)):"
    printf '  %s\n' "${bad[@]}"
    echo "format: run scripts/format.sh and commit the result"
    exit 1
  fi
  echo "format: ${#files[@]} files match .clang-format"
  exit 0
fi
"$fmt" -i "${files[@]}"
echo "format: ${#files[@]} files formatted"
