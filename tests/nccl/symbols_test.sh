#!/usr/bin/env bash
# The drop-in exports NCCL's API as NVIDIA's libnccl.so.2 does: the same
# nccl*/pnccl* names with the same binding (ncclX weak, pncclX strong) and
# symbol version, SONAME libnccl.so.2, nothing else. A name NVIDIA's
# library has and the drop-in lacks fails the test unless ABSENT_LIST
# gives the reason; a reason for a name that is exported (or that NVIDIA's
# library lacks) fails it too, so the list stays true.
#
#   symbols_test.sh DROPIN NVIDIA_LIBNCCL ABSENT_LIST
# Exit 77 (a ctest skip) when NVIDIA_LIBNCCL is absent.
set -euo pipefail
dropin=$1 nvidia=$2 absent_list=$3
if [ ! -e "$nvidia" ]; then
  echo "SKIP: $nvidia not found: nothing to compare the drop-in's exports with"
  exit 77
fi
command -v nm > /dev/null && command -v objdump > /dev/null || { echo "FAIL: nm/objdump (binutils) not found"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
failed() { echo "FAIL: $*"; fail=1; }

# "name binding" of every defined dynamic symbol, sorted by name.
exports() { nm -D --defined-only "$1" | awk '{print $3, $2}' | sort; }
exports "$nvidia" | grep -E '^p?nccl' > "$tmp/nvidia" || true
exports "$dropin" > "$tmp/dropin_all"
grep -E '^p?nccl' "$tmp/dropin_all" > "$tmp/dropin" || true
grep -vE '^#|^[[:space:]]*$' "$absent_list" | awk '{print $1}' | sort > "$tmp/absent"
awk '{print $1}' "$tmp/nvidia" > "$tmp/nvidia_names"
awk '{print $1}' "$tmp/dropin" > "$tmp/dropin_names"

# Missing without a reason.
while read -r name; do
  failed "$name is exported by $nvidia but not by the drop-in, and $absent_list gives no reason"
done < <(comm -23 "$tmp/nvidia_names" "$tmp/dropin_names" | comm -23 - "$tmp/absent")
# Reasons that are no longer true.
while read -r name; do
  failed "$absent_list lists $name, which the drop-in exports: remove the line"
done < <(comm -12 "$tmp/absent" "$tmp/dropin_names")
while read -r name; do
  failed "$absent_list lists $name, which $nvidia does not export"
done < <(comm -23 "$tmp/absent" "$tmp/nvidia_names")
# Names NVIDIA's library lacks, and anything that is not NCCL's.
while read -r name; do
  failed "the drop-in exports $name, which $nvidia does not"
done < <(comm -13 "$tmp/nvidia_names" "$tmp/dropin_names")
while read -r name binding; do
  failed "the drop-in exports $name ($binding), not an NCCL name"
done < <(grep -vE '^p?nccl' "$tmp/dropin_all" | grep -vE '^(_init|_fini) ' || true)
# Same binding: W (weak) for ncclX, T for pncclX, as NVIDIA's.
while read -r name theirs ours; do
  [ "$theirs" = "$ours" ] || failed "$name is '$ours' in the drop-in, '$theirs' in $nvidia (nm binding)"
done < <(join "$tmp/nvidia" "$tmp/dropin")
# Same symbol version (NVIDIA's are unversioned: Base).
version_of() { objdump -T "$1" | awk '$NF ~ /^p?nccl/ && $2 != "*UND*" {print $NF, $(NF-1)}' | sort; }
version_of "$nvidia" > "$tmp/nvidia_versions"
version_of "$dropin" > "$tmp/dropin_versions"
while read -r name theirs ours; do
  [ "$theirs" = "$ours" ] || failed "$name has version '$ours' in the drop-in, '$theirs' in $nvidia"
done < <(join "$tmp/nvidia_versions" "$tmp/dropin_versions")
soname=$(objdump -p "$dropin" | awk '$1 == "SONAME" {print $2}')
[ "$soname" = "libnccl.so.2" ] || failed "the drop-in's SONAME is '$soname', not libnccl.so.2"

common=$(comm -12 "$tmp/nvidia_names" "$tmp/dropin_names" | wc -l)
echo "symbols: $common exported as $nvidia does; $(wc -l < "$tmp/absent") absent with a reason ($absent_list)"
if [ $fail -ne 0 ]; then
  exit 1
fi
echo "symbols test: all passed"
