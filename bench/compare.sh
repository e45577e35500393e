#!/usr/bin/env bash
# Conflux side by side with Open MPI and Gloo: 2 ranks, float32 sum allreduce,
# nccl-tests' bus bandwidth, in the settings below, then a ratio table per
# setting (bench/compare_report.py). --colls adds broadcast, allgather and
# alltoall (conflux-perf broadcast|allgather|alltoall against
# MPI_Bcast|MPI_Allgather|MPI_Alltoall, the same
# sizes and busbw formulas; Gloo times allreduce only): a table per setting
# and collective.
#
#   bench/compare.sh [--quick] [options]          (run it from anywhere, as root)
#
#   shm      one host, shared memory: conflux-perf --np 2 against Open MPI's
#            vader BTL; Gloo has no shared-memory transport, so its column is
#            Gloo over loopback TCP (the same runs as in tcp).
#   tcp      one host, loopback TCP: Conflux with CFX_SHM_DISABLE=1 against
#            Open MPI's tcp BTL on lo and Gloo's TCP transport on lo.
#   veth     two network namespaces joined by a veth pair, one rank in each
#            (distinct CFX_HOSTID, CFX_SOCKET_IFNAME==<veth>); iperf3 between
#            the namespaces gives the link's ceiling: one stream one way (the
#            Cfx/iperf3 column), and --bidir, one stream each way at once, as a
#            2-rank allreduce loads the link (a line above the table).
#   veth10g  the same link shaped on both ends with tc tbf (--shape).
#   oversub  8 ranks on this host against 2, conflux-perf at --oversub-bytes
#            (default 128M): does it complete, and at what bus bandwidth
#            (allreduce only, whatever --colls says).
#
# Each comparison is interleaved: for each repeat and collective, Conflux,
# then Open MPI, then Gloo (and iperf3 first on the veth link), so background
# load falls on all of them alike; the tables show the median over repeats of
# each size's time and busbw (--stat best: the best repeat). Every program
# runs under `timeout`. Logs of every run stay in --out.
#
# Open MPI across namespaces: mpirun runs in the first namespace with its
# PMIx server listening on that namespace's veth address
# (PMIX_MCA_ptl_tcp_remote_connections=1, PMIX_MCA_ptl_tcp_if_include), and
# starts rank 1 through `ip netns exec` into the second; the tcp BTL is
# restricted to the veth subnet. --no-mpi-veth leaves Open MPI out there.
#
# Network: traffic goes only over loopback and over the veth pair this script
# creates inside its own namespaces (10.213.8.0/24, removed on exit).
# Conflux always runs with CFX_SOCKET_IFNAME set; Open MPI with its BTL and
# OOB restricted to lo or the veth subnet; Gloo with a device on lo or the
# veth.
#
# Installs what it needs from Debian when missing (scripts/deps.sh, then
# g++, libgloo-dev, iperf3, python3) unless --no-install, and builds
# conflux-perf, mpi_coll_bench and gloo_allreduce_bench in --build.
# The namespace settings need root; without it they are skipped (said so).
set -u

root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
command_line="$0 $*"

# ------------------------------------------------------------------ options
max_bytes=128M
min_bytes=8
factor=2
iters=20
warmup=5
check=1
repeat=3
settings=shm,tcp,veth,veth10g,oversub
colls=allreduce
build_dir=$root_dir/build
jobs=$(nproc 2>/dev/null || echo 2)
out_dir=""
run_timeout=900
shape="rate 10gbit burst 1mb latency 5ms"
iperf_seconds=5
oversub_bytes=128M
oversub_iters=10
oversub_ranks=8
install=1
build=1
mpi_veth=1
mpi_bind=none
note=""
calm=""
calm_timeout=300
stat=median
report_dir=""

usage() {
  cat <<EOF
usage: $0 [--quick] [options]

  --quick             about two minutes: -e 32M -f 4 -n 5 -w 2, one repeat,
                      2 s of iperf3, oversub with -n 3
  -b, --min SIZE      smallest size (default $min_bytes)
  -e, --max SIZE      largest size (default $max_bytes; K, M, G as conflux-perf)
  -f, --factor N      size step factor (default $factor)
  -n, --iters N       timed calls per size (default $iters)
  -w, --warmup N      warmup calls (default $warmup)
  -c, --check N       checked calls per size (default $check)
  --repeat N          interleaved repeats of each comparison (default $repeat)
  --settings LIST     comma-separated, from shm,tcp,veth,veth10g,oversub
                      (default $settings)
  --colls LIST        comma-separated, from allreduce,broadcast,allgather,alltoall
                      (default $colls); Gloo and oversub: allreduce only
  --shape TBF         tc tbf parameters of veth10g (default "$shape")
  --iperf-seconds N   length of each iperf3 run (default $iperf_seconds)
  --oversub-bytes S   allreduce size of the oversub setting (default $oversub_bytes)
  --oversub-iters N   timed calls there (default $oversub_iters)
  --mpi-bind POLICY   mpirun --bind-to (default $mpi_bind, as conflux-perf,
                      which binds nothing; 'core' is Open MPI's own default)
  --no-mpi-veth       do not run Open MPI across the namespaces
  --build DIR         build directory (default $build_dir)
  --jobs N            build jobs (default: nproc)
  --no-build          use the binaries already in --build
  --no-install        do not install missing Debian packages
  --out DIR           where logs and the summary go (default: a new /tmp dir)
  --note TEXT         a line for the summary (e.g. which Conflux commit)
  --calm N            before each run, wait until at most N other tasks are
                      runnable (mean over 1 s of /proc/loadavg's count; for a
                      machine shared with other work), at most --calm-timeout
                      seconds (default $calm_timeout); the count is logged
  --calm-timeout S    see --calm
  --stat median|best  what the tables show per size over the repeats: the
                      median (default) or the best repeat (least disturbed)
  --report DIR        only print the tables of an earlier run's --out DIR
  --timeout S         limit of each program run, seconds (default $run_timeout)
EOF
  exit "${1:-2}"
}

need() { [ "$2" -ge 2 ] || { echo "$0: $1 needs a value" >&2; usage; }; }
while [ $# -gt 0 ]; do
  case $1 in
    --quick)
      max_bytes=32M factor=4 iters=5 warmup=2 repeat=1 iperf_seconds=2 oversub_iters=3
      shift ;;
    -b | --min) need "$1" $#; min_bytes=$2; shift 2 ;;
    -e | --max) need "$1" $#; max_bytes=$2; shift 2 ;;
    -f | --factor) need "$1" $#; factor=$2; shift 2 ;;
    -n | --iters) need "$1" $#; iters=$2; shift 2 ;;
    -w | --warmup) need "$1" $#; warmup=$2; shift 2 ;;
    -c | --check) need "$1" $#; check=$2; shift 2 ;;
    --repeat) need "$1" $#; repeat=$2; shift 2 ;;
    --settings) need "$1" $#; settings=$2; shift 2 ;;
    --colls) need "$1" $#; colls=$2; shift 2 ;;
    --shape) need "$1" $#; shape=$2; shift 2 ;;
    --iperf-seconds) need "$1" $#; iperf_seconds=$2; shift 2 ;;
    --oversub-bytes) need "$1" $#; oversub_bytes=$2; shift 2 ;;
    --oversub-iters) need "$1" $#; oversub_iters=$2; shift 2 ;;
    --mpi-bind) need "$1" $#; mpi_bind=$2; shift 2 ;;
    --no-mpi-veth) mpi_veth=0; shift ;;
    --build) need "$1" $#; build_dir=$2; shift 2 ;;
    --jobs) need "$1" $#; jobs=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --no-install) install=0; shift ;;
    --out) need "$1" $#; out_dir=$2; shift 2 ;;
    --note) need "$1" $#; note=$2; shift 2 ;;
    --calm) need "$1" $#; calm=$2; shift 2 ;;
    --calm-timeout) need "$1" $#; calm_timeout=$2; shift 2 ;;
    --stat) need "$1" $#; stat=$2; shift 2 ;;
    --report) need "$1" $#; report_dir=$2; shift 2 ;;
    --timeout) need "$1" $#; run_timeout=$2; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "$0: unknown option '$1'" >&2; usage ;;
  esac
done
for n in "$factor" "$iters" "$repeat" "$iperf_seconds" "$oversub_iters" "$jobs" "$run_timeout"; do
  case $n in '' | *[!0-9]* | 0) echo "$0: '$n' is not a whole number >= 1" >&2; usage ;; esac
done
case $warmup$check$calm_timeout in *[!0-9]*) echo "$0: -w, -c and --calm-timeout take whole numbers" >&2; usage ;; esac
case $calm in *[!0-9.]*) echo "$0: --calm takes a number" >&2; usage ;; esac
case $stat in median | best) ;; *) echo "$0: --stat is median or best" >&2; usage ;; esac
IFS=, read -r -a setting_list <<<"$settings"
for s in "${setting_list[@]}"; do
  case $s in shm | tcp | veth | veth10g | oversub) ;; *) echo "$0: unknown setting '$s'" >&2; usage ;; esac
done
IFS=, read -r -a coll_list <<<"$colls"
[ ${#coll_list[@]} -gt 0 ] || { echo "$0: --colls is empty" >&2; usage; }
for c in "${coll_list[@]}"; do
  case $c in
    allreduce | broadcast | allgather | alltoall) ;;
    *) echo "$0: unknown collective '$c'" >&2; usage ;;
  esac
done
want() { [[ ",$settings," == *",$1,"* ]]; }
wants_allreduce() { [[ ",$colls," == *",allreduce,"* ]]; }
# log_name LIB COLL: a run's log file name before .<repeat>: allreduce keeps
# the plain LIB (conflux, ompi, gloo), the others are LIB.COLL.
log_name() { if [ "$2" = allreduce ]; then echo "$1"; else echo "$1.$2"; fi; }

is_root=0
[ "$(id -u)" -eq 0 ] && is_root=1
log() { echo "== $*" >&2; }
warn() { echo "compare.sh: $*" >&2; }

# ------------------------------------------------------------------ tables
# report: the tables of every setting found in $out_dir, from its logs.
report() {
  local found=() s suffix=""
  [ "$stat" = median ] || suffix=-$stat
  for s in shm tcp veth veth10g oversub; do [ -d "$out_dir/$s" ] && found+=("$s"); done
  [ ${#found[@]} -gt 0 ] || { warn "no results in $out_dir"; return 1; }
  python3 "$root_dir/bench/compare_report.py" "$out_dir" "$(IFS=,; echo "${found[*]}")" \
    "$oversub_ranks" "$stat" | tee "$out_dir/summary$suffix.txt"
}

if [ -n "$report_dir" ]; then
  out_dir=$report_dir
  [ -f "$out_dir/run-info.txt" ] || { warn "$out_dir has no run-info.txt"; exit 2; }
  report
  exit
fi

# ------------------------------------------------------------------ install
if [ "$install" -eq 1 ]; then
  "$root_dir/scripts/deps.sh" || { warn "scripts/deps.sh failed"; exit 1; }
  sudo=""
  [ "$is_root" -eq 1 ] || sudo=sudo
  missing=()
  for p in g++ libgloo-dev iperf3 python3; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    if ! { $sudo apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null; }; then
      warn "apt-get install ${missing[*]} failed"
      exit 1
    fi
  fi
fi
command -v python3 >/dev/null || { warn "needs python3 for the tables"; exit 1; }

# ------------------------------------------------------------------ build
perf=$build_dir/tools/conflux-perf
mpi_bench=$build_dir/bench/mpi_coll_bench
gloo_bench=$build_dir/bench/gloo_allreduce_bench
if [ "$build" -eq 1 ]; then
  log "building in $build_dir"
  if [ -f "$build_dir/CMakeCache.txt" ]; then
    cmake -S "$root_dir" -B "$build_dir" >/dev/null # finds a Gloo installed since
  else
    cmake -S "$root_dir" -B "$build_dir" -DCFX_BUILD_TESTS=OFF -DCFX_BUILD_EXAMPLES=OFF >/dev/null
  fi || { warn "cmake configure failed"; exit 1; }
  cmake --build "$build_dir" -j"$jobs" --target conflux-perf >/dev/null ||
    { warn "building conflux-perf failed"; exit 1; }
  for t in mpi_coll_bench gloo_allreduce_bench; do
    cmake --build "$build_dir" -j"$jobs" --target "$t" >/dev/null 2>&1 ||
      warn "$t not built (its library was not found); its column stays empty"
  done
fi
[ -x "$perf" ] || { warn "no $perf; build it or drop --no-build"; exit 1; }
have_mpi=0 have_gloo=0
[ -x "$mpi_bench" ] && command -v mpirun >/dev/null && have_mpi=1
[ -x "$gloo_bench" ] && have_gloo=1

# ------------------------------------------------------------------ state, cleanup
[ -n "$out_dir" ] || out_dir=$(mktemp -d /tmp/cfx-compare.XXXXXX)
mkdir -p "$out_dir" || exit 1
ns_a=cfxcmp_a_$$
ns_b=cfxcmp_b_$$
veth_a=cfxca$$ # interface names: 15 characters at most
veth_b=cfxcb$$
addr_a=10.213.8.1
addr_b=10.213.8.2
subnet=10.213.8.0/24
ns_made=0
pids=()
port=29700 # Conflux rendezvous ports, one per run (no TIME_WAIT clashes)

cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  if [ "$ns_made" -eq 1 ]; then
    ip netns del "$ns_a" 2>/dev/null # takes its veth end, and so the pair
    ip netns del "$ns_b" 2>/dev/null
  fi
  rm -rf "$out_dir"/store.*
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

common=(-b "$min_bytes" -e "$max_bytes" -f "$factor" -n "$iters" -w "$warmup" -c "$check")
mpirun_base=(mpirun --bind-to "$mpi_bind" --mca pml ob1 --mca osc ^ucx
  --mca oob_tcp_if_include lo)
[ "$is_root" -eq 1 ] && mpirun_base+=(--allow-run-as-root)
cfx_env=(CFX_CONF_FILE=/nonexistent) # the figures do not depend on /etc/conflux.conf
tmo=(timeout -k 10 "$run_timeout")

# run_logged FILE CMD...: run, stdout to FILE, stderr to FILE.err; note failures.
run_logged() {
  local file=$1 rc=0
  shift
  "$@" >"$file" 2>"$file.err" || rc=$?
  if [ "$rc" -ne 0 ]; then
    warn "$(basename "$(dirname "$file")")/$(basename "$file"): exit $rc (124: timed out); see $file.err"
    echo "# compare.sh: exit $rc" >>"$file"
  fi
  return 0
}

gloo_rank() { # NAMESPACE|- STORE IFNAME RANK: one Gloo rank of 2
  local netns=()
  [ "$1" = - ] || netns=(ip netns exec "$1")
  "${netns[@]}" env RANK="$4" WORLD_SIZE=2 GLOO_STORE_DIR="$2" GLOO_SOCKET_IFNAME="$3" \
    "${tmo[@]}" "$gloo_bench" "${common[@]}"
}

gloo_pair() { # FILE NAMESPACE0|- IFNAME0 NAMESPACE1|- IFNAME1: two Gloo ranks
  local store pid
  calm_wait "$1"
  store=$(mktemp -d "$out_dir/store.XXXXXX")
  gloo_rank "$4" "$store" "$5" 1 >/dev/null 2>"$1.rank1.err" &
  pid=$!
  pids+=("$pid")
  run_logged "$1" gloo_rank "$2" "$store" "$3" 0
  wait "$pid" || warn "gloo rank 1 exited $?; see $1.rank1.err"
  rm -rf "$store"
}

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# Mean number of runnable tasks besides this shell over one second.
runnable_others() {
  local total=0 running
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    read -r _ _ _ running _ </proc/loadavg
    total=$((total + ${running%/*} - 1))
    sleep 0.1
  done
  awk -v t="$total" 'BEGIN { printf "%.1f", t / 10 }'
}

# calm_wait FILE: with --calm, wait for a quiet machine; log the count in FILE.calm.
calm_wait() {
  [ -n "$calm" ] || return 0
  local start=$SECONDS busy
  while :; do
    busy=$(runnable_others)
    awk -v b="$busy" -v c="$calm" 'BEGIN { exit !(b <= c) }' && break
    if ((SECONDS - start >= calm_timeout)); then
      warn "$(basename "$1"): still $busy other runnable tasks after $calm_timeout s; running anyway"
      break
    fi
    sleep 1
  done
  echo "$busy $((SECONDS - start))" >"$1.calm"
}

# ------------------------------------------------------------------ settings
{
  echo "command: $command_line"
  echo "date: $(date -u +%FT%TZ)  host: $(uname -srm)  cpus: $(nproc)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "conflux: $(git -C "$root_dir" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "sweep: ${common[*]}  repeat: $repeat  mpirun --bind-to $mpi_bind"
  [ "$colls" = allreduce ] || echo "collectives: $colls"
  [ -z "$note" ] || echo "note: $note"
} >"$out_dir/run-info.txt"

setting_shm_tcp() { # shm|tcp
  local s=$1 dir=$out_dir/$1 r
  mkdir -p "$dir"
  loadavg >"$dir/load-start"
  local cfx_shm=() btl=(--mca btl "self,vader") c cf om
  if [ "$s" = tcp ]; then
    cfx_shm=(CFX_SHM_DISABLE=1)
    btl=(--mca btl "self,tcp" --mca btl_tcp_if_include lo)
  fi
  for ((r = 1; r <= repeat; r++)); do
    log "$s: repeat $r of $repeat"
    for c in "${coll_list[@]}"; do
      cf=$dir/$(log_name conflux "$c").$r
      calm_wait "$cf"
      run_logged "$cf" env "${cfx_env[@]}" CFX_SOCKET_IFNAME=lo "${cfx_shm[@]}" \
        "${tmo[@]}" "$perf" "$c" --np 2 "${common[@]}"
      if [ "$have_mpi" -eq 1 ]; then
        om=$dir/$(log_name ompi "$c").$r
        calm_wait "$om"
        run_logged "$om" "${tmo[@]}" "${mpirun_base[@]}" -np 2 "${btl[@]}" \
          "$mpi_bench" -C "$c" "${common[@]}"
      fi
    done
    # Gloo has no shared memory: one set of loopback runs serves both tables.
    if [ "$have_gloo" -eq 1 ] && wants_allreduce; then
      local other=tcp
      [ "$s" = tcp ] && other=shm
      if [ -f "$out_dir/$other/gloo.$r" ] && want "$other"; then
        cp "$out_dir/$other/gloo.$r" "$dir/gloo.$r"
      else
        gloo_pair "$dir/gloo.$r" - lo - lo
      fi
    fi
  done
  loadavg >"$dir/load-end"
}

make_namespaces() {
  [ "$ns_made" -eq 1 ] && return 0
  ip netns add "$ns_a" || return 1
  ns_made=1
  ip netns add "$ns_b" &&
    ip link add "$veth_a" netns "$ns_a" type veth peer name "$veth_b" netns "$ns_b" &&
    ip -n "$ns_a" link set lo up && ip -n "$ns_b" link set lo up &&
    ip -n "$ns_a" addr add "$addr_a/24" dev "$veth_a" &&
    ip -n "$ns_b" addr add "$addr_b/24" dev "$veth_b" &&
    ip -n "$ns_a" link set "$veth_a" up && ip -n "$ns_b" link set "$veth_b" up
}

# iperf_run FILE [--bidir]: one TCP stream from the second namespace to the
# first (with --bidir, one each way at once, as a 2-rank allreduce drives the
# link), iperf3's JSON in FILE.
iperf_run() {
  calm_wait "$1"
  ip netns exec "$ns_a" timeout $((iperf_seconds + 30)) iperf3 -s -1 -B "$addr_a" \
    >/dev/null 2>&1 &
  local pid=$!
  pids+=("$pid")
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    sleep 0.3
    ip netns exec "$ns_b" timeout $((iperf_seconds + 20)) iperf3 -c "$addr_a" \
      -t "$iperf_seconds" "${@:2}" -J >"$1" 2>"$1.err" && break
  done
  wait "$pid" 2>/dev/null
}

cfx_veth_rank() { # RANK COLL: one Conflux rank in its namespace, rank 0 listening on its veth
  local ns=$ns_a veth=$veth_a
  [ "$1" -eq 1 ] && ns=$ns_b veth=$veth_b
  ip netns exec "$ns" env "${cfx_env[@]}" RANK="$1" WORLD_SIZE=2 MASTER_ADDR=$addr_a \
    MASTER_PORT=$port CFX_SOCKET_IFNAME="=$veth" CFX_HOSTID="cfx-compare-$1-$$" \
    "${tmo[@]}" "$perf" "$2" "${common[@]}"
}

veth_conflux() { # FILE COLL
  local pid
  calm_wait "$1"
  port=$((port + 1))
  cfx_veth_rank 1 "$2" >/dev/null 2>"$1.rank1.err" &
  pid=$!
  pids+=("$pid")
  run_logged "$1" cfx_veth_rank 0 "$2"
  wait "$pid" || warn "conflux rank 1 exited $?; see $1.rank1.err"
}

veth_ompi() { # FILE COLL: mpirun in the first namespace, rank 1 entered into the second
  calm_wait "$1"
  run_logged "$1" ip netns exec "$ns_a" env PMIX_MCA_ptl_tcp_remote_connections=1 \
    PMIX_MCA_ptl_tcp_if_include="$veth_a" "${tmo[@]}" \
    "${mpirun_base[@]}" --mca btl self,tcp --mca btl_tcp_if_include "$subnet" \
    -np 1 "$mpi_bench" -C "$2" "${common[@]}" : \
    -np 1 ip netns exec "$ns_b" "$mpi_bench" -C "$2" "${common[@]}"
}

setting_veth() { # veth|veth10g
  local s=$1 dir=$out_dir/$1 r c
  if [ "$is_root" -ne 1 ]; then
    warn "SKIP $s: network namespaces need root"
    return
  fi
  command -v iperf3 >/dev/null || warn "no iperf3: $s has no ceiling line"
  make_namespaces || { warn "SKIP $s: cannot create the namespaces"; return; }
  tc -n "$ns_a" qdisc del dev "$veth_a" root 2>/dev/null
  tc -n "$ns_b" qdisc del dev "$veth_b" root 2>/dev/null
  if [ "$s" = veth10g ]; then
    # shellcheck disable=SC2086 # $shape is a list of tc words
    if ! { tc -n "$ns_a" qdisc add dev "$veth_a" root tbf $shape &&
      tc -n "$ns_b" qdisc add dev "$veth_b" root tbf $shape; }; then
      warn "SKIP $s: tc qdisc add ... tbf $shape failed"
      return
    fi
  fi
  mkdir -p "$dir"
  tc -n "$ns_a" qdisc show dev "$veth_a" >"$dir/qdisc"
  loadavg >"$dir/load-start"
  for ((r = 1; r <= repeat; r++)); do
    log "$s: repeat $r of $repeat"
    if command -v iperf3 >/dev/null; then
      iperf_run "$dir/iperf.$r"
      iperf_run "$dir/iperfbidir.$r" --bidir
    fi
    for c in "${coll_list[@]}"; do
      veth_conflux "$dir/$(log_name conflux "$c").$r" "$c"
      [ "$have_mpi" -eq 1 ] && [ "$mpi_veth" -eq 1 ] &&
        veth_ompi "$dir/$(log_name ompi "$c").$r" "$c"
    done
    [ "$have_gloo" -eq 1 ] && wants_allreduce &&
      gloo_pair "$dir/gloo.$r" "$ns_a" "$veth_a" "$ns_b" "$veth_b"
  done
  loadavg >"$dir/load-end"
}

setting_oversub() {
  local dir=$out_dir/oversub r n
  mkdir -p "$dir"
  loadavg >"$dir/load-start"
  for ((r = 1; r <= repeat; r++)); do
    log "oversub: repeat $r of $repeat"
    for n in "$oversub_ranks" 2; do
      calm_wait "$dir/np$n.$r"
      run_logged "$dir/np$n.$r" env "${cfx_env[@]}" CFX_SOCKET_IFNAME=lo "${tmo[@]}" "$perf" \
        allreduce --np "$n" -b "$oversub_bytes" -e "$oversub_bytes" -n "$oversub_iters" \
        -w 1 -c "$check"
    done
  done
  loadavg >"$dir/load-end"
}

start_s=$SECONDS
for s in "${setting_list[@]}"; do
  case $s in
    shm | tcp) setting_shm_tcp "$s" ;;
    veth | veth10g) setting_veth "$s" ;;
    oversub) setting_oversub ;;
  esac
done
echo "elapsed: $((SECONDS - start_s)) s" >>"$out_dir/run-info.txt"

report
