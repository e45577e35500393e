#!/usr/bin/env bash
# examples/allreduce_mpi under mpirun: four ranks on this machine, everything
# on loopback. Passes when mpirun exits 0 and every rank reports the exact sum.
#
#   tests/mpi_example_test.sh path/to/allreduce_mpi [mpirun]
set -u
prog=${1:?usage: $0 path/to/allreduce_mpi [mpirun]}
mpirun=${2:-mpirun}
nranks=4

flags=(-np "$nranks" --oversubscribe)
# Open MPI refuses to run as root unless told it is deliberate.
if [ "$(id -u)" -eq 0 ]; then flags+=(--allow-run-as-root); fi
# Keep Open MPI's own traffic on this machine: shared memory between ranks,
# loopback for its out-of-band channel. Containers often forbid CMA.
flags+=(--mca btl 'self,vader' --mca oob_tcp_if_include lo)
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}

out=$(timeout 120 "$mpirun" "${flags[@]}" -x CFX_SOCKET_IFNAME=lo -x CFX_CONF_FILE=/nonexistent \
  "$prog" 2>&1)
rc=$?
echo "$out"
fail() { echo "FAIL: $*" >&2; exit 1; }
[ "$rc" -eq 0 ] || fail "mpirun exited $rc (124: timed out after 120 s)"
for ((r = 0; r < nranks; r++)); do
  grep -q "^rank $r of $nranks: allreduce of [0-9]* floats OK$" <<<"$out" ||
    fail "rank $r did not report a correct allreduce"
done
grep -q "^OK: $nranks ranks, 0 failed$" <<<"$out" || fail "no summary line from rank 0"
echo "PASS: $nranks MPI ranks allreduced correctly"
