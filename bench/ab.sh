#!/usr/bin/env bash
# Two builds of Conflux side by side: conflux-perf of build A and of build B,
# repeat after repeat, A first in odd repeats and B first in even ones (so
# background load and the cost of running second fall on both alike; over
# loopback TCP the second of two back-to-back runs is measurably slower at
# small sizes), over shared
# memory and over loopback TCP (CFX_SHM_DISABLE=1), 2 ranks. Prints, per
# setting and size, the median time of each build over the repeats, the
# spread (min-max), and B/A as time ratios of the medians and of the minima
# (below 1: B is faster; the minima's ratio is the code path's, the least
# moved by other load).
#
#   bench/ab.sh A_BUILD_DIR B_BUILD_DIR [options]
#     --colls LIST     collectives (default allreduce,broadcast,allgather)
#     --settings LIST  shm,tcp (default both)
#     --repeat N       interleaved repeats (default 5)
#     -b/-e/-f/-n      conflux-perf's min bytes, max bytes, factor, iterations
#                      (default 8, 64M, 8, 20)
#     --out DIR        keep the JSON of every run (default a temporary folder)
#     --mpi            also Open MPI (mpi_coll_bench of B's build, vader or
#                      tcp BTL, --bind-to none as conflux-perf) after A and B
#                      in every repeat: a third column and B/MPI of medians
#
# Typical use: a redesign's before/after, e.g.
#   git worktree add /tmp/before <rev>; cmake -S /tmp/before -B /tmp/before/build \
#     -DCFX_BUILD_TESTS=OFF && cmake --build /tmp/before/build --target conflux-perf
#   bench/ab.sh /tmp/before/build build --repeat 5
set -euo pipefail

usage() {
  sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

[ $# -ge 2 ] || usage
a_dir=$1
b_dir=$2
shift 2
colls=allreduce,broadcast,allgather
settings=shm,tcp
repeat=5
min=8
max=64M
factor=8
iters=20
out=""
mpi=0
while [ $# -gt 0 ]; do
  case $1 in
    --colls) colls=$2; shift 2 ;;
    --settings) settings=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    -b) min=$2; shift 2 ;;
    -e) max=$2; shift 2 ;;
    -f) factor=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --mpi) mpi=1; shift ;;
    -h | --help) usage 0 ;;
    *) echo "ab.sh: unknown option $1" >&2; usage ;;
  esac
done
for d in "$a_dir" "$b_dir"; do
  [ -x "$d/tools/conflux-perf" ] || { echo "ab.sh: no $d/tools/conflux-perf (build it first)" >&2; exit 2; }
done
if [ "$mpi" = 1 ]; then
  [ -x "$b_dir/bench/mpi_coll_bench" ] && command -v mpirun >/dev/null ||
    { echo "ab.sh: --mpi needs mpirun and $b_dir/bench/mpi_coll_bench" >&2; exit 2; }
fi
[ -n "$out" ] || out=$(mktemp -d /tmp/cfx_ab.XXXXXX)
mkdir -p "$out"

export CFX_SOCKET_IFNAME=lo CFX_CONF_FILE=/nonexistent
for r in $(seq 1 "$repeat"); do
  for setting in ${settings//,/ }; do
    for coll in ${colls//,/ }; do
      order="a b"
      [ $((r % 2)) -eq 0 ] && order="b a"
      for side in $order; do
        dir=$a_dir
        [ "$side" = b ] && dir=$b_dir
        env_extra=()
        [ "$setting" = tcp ] && env_extra=(CFX_SHM_DISABLE=1)
        json="$out/${setting}_${coll}_${side}_$r.json"
        env "${env_extra[@]}" timeout 600 "$dir/tools/conflux-perf" "$coll" --np 2 \
          -b "$min" -e "$max" -f "$factor" -n "$iters" -w 5 -c 1 --json "$json" > "$json.log" 2>&1 ||
          { echo "ab.sh: $side $setting $coll failed; see $json.log" >&2; exit 1; }
      done
      if [ "$mpi" = 1 ]; then
        btl=(--mca btl self,vader)
        [ "$setting" = tcp ] && btl=(--mca btl self,tcp --mca btl_tcp_if_include lo)
        log="$out/${setting}_${coll}_mpi_$r.txt"
        timeout 600 mpirun --allow-run-as-root --bind-to none --mca pml ob1 --mca osc ^ucx \
          --mca oob_tcp_if_include lo "${btl[@]}" -np 2 "$b_dir/bench/mpi_coll_bench" -C "$coll" \
          -b "$min" -e "$max" -f "$factor" -n "$iters" -w 5 -c 1 > "$log" 2>&1 ||
          { echo "ab.sh: Open MPI $setting $coll failed; see $log" >&2; exit 1; }
      fi
    done
  done
  echo "ab.sh: repeat $r of $repeat done" >&2
done

/usr/bin/python3 - "$out" "$a_dir" "$b_dir" "$settings" "$colls" <<'EOF'
import json, statistics, sys, glob, os
out, a_dir, b_dir, settings, colls = sys.argv[1:6]
print(f"# A = {a_dir}, B = {b_dir}; time in us, median over repeats [min-max]; "
      "B/A of medians and of minima (< 1: B faster)")
for setting in settings.split(","):
    for coll in colls.split(","):
        times = {"a": {}, "b": {}, "mpi": {}}
        for side in "ab":
            for f in glob.glob(os.path.join(out, f"{setting}_{coll}_{side}_*.json")):
                for row in json.load(open(f))["results"]:
                    if not row.get("inplace"):
                        times[side].setdefault(row["bytes"], []).append(row["time_us"])
        for f in glob.glob(os.path.join(out, f"{setting}_{coll}_mpi_*.txt")):
            for line in open(f):  # size count time algbw busbw
                cols = line.split()
                if len(cols) == 5 and cols[0].isdigit():
                    times["mpi"].setdefault(int(cols[0]), []).append(float(cols[2]))
        have_mpi = bool(times["mpi"])
        print(f"\n## {setting} {coll}, 2 ranks")
        print(f"{'bytes':>10} {'A us':>10} {'A spread':>19} {'B us':>10} {'B spread':>19} "
              f"{'B/A':>6} {'min':>6}" + (f" {'MPI us':>10} {'MPI spread':>19} {'B/MPI':>6}"
                                            if have_mpi else ""))
        for size in sorted(times["a"]):
            a, b = times["a"][size], times["b"].get(size, [])
            if not b:
                continue
            ma, mb = statistics.median(a), statistics.median(b)
            print(f"{size:>10} {ma:>10.2f} {f'[{min(a):.2f}-{max(a):.2f}]':>19} {mb:>10.2f} "
                  f"{f'[{min(b):.2f}-{max(b):.2f}]':>19} {mb / ma:>6.2f} {min(b) / min(a):>6.2f}",
                  end="")
            m = times["mpi"].get(size, [])
            if m:
                mm = statistics.median(m)
                print(f" {mm:>10.2f} {f'[{min(m):.2f}-{max(m):.2f}]':>19} {mb / mm:>6.2f}", end="")
            print()
EOF
