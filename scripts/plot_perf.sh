#!/usr/bin/env bash
# Plots bus bandwidth against size from conflux-perf --json files, one line
# per run (per collective/type/op/root when a file holds several), x in log
# scale. Needs python3 (standard library only) and gnuplot (Debian:
# gnuplot-nox).
#
#   scripts/plot_perf.sh A.json [B.json ...] -o out.svg|out.png [--inplace] [--title TEXT]
#
# --inplace plots the in-place results (default: out-of-place).
set -euo pipefail

usage() {
  echo "usage: $0 A.json [B.json ...] -o OUT.svg|OUT.png [--inplace] [--title TEXT]" >&2
  exit 2
}

inputs=()
out=""
placement="out-of-place"
title="conflux-perf: bus bandwidth"
while [ $# -gt 0 ]; do
  case $1 in
    -o | --output) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
    --inplace) placement="in-place"; shift ;;
    --title) [ $# -ge 2 ] || usage; title=$2; shift 2 ;;
    -h | --help) usage ;;
    -*) echo "$0: unknown option '$1'" >&2; usage ;;
    *) inputs+=("$1"); shift ;;
  esac
done
[ ${#inputs[@]} -gt 0 ] && [ -n "$out" ] || usage
case $out in
  *.svg) format=svg ;;
  *.png) format=png ;;
  *) echo "$0: the output must end in .svg or .png, got '$out'" >&2; exit 2 ;;
esac
for f in "${inputs[@]}"; do
  [ -r "$f" ] || { echo "$0: cannot read '$f'" >&2; exit 2; }
done
if ! command -v python3 > /dev/null; then
  echo "$0: python3 not found; install python3" >&2
  exit 3
fi
if ! command -v gnuplot > /dev/null; then
  echo "$0: gnuplot not found; install it (Debian: apt-get install gnuplot-nox) and rerun" >&2
  exit 3
fi
terminal="svg size 960,600 dynamic noenhanced font 'sans,11' background '#ffffff'"
if [ "$format" = png ]; then
  if gnuplot -e 'set terminal' 2>&1 | grep -qw pngcairo; then
    terminal="pngcairo size 960,600 noenhanced font 'sans,10'"
  else
    terminal="png size 960,600 noenhanced"
  fi
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# JSON -> one .dat file per line and the gnuplot script.
python3 - "$work" "$out" "$terminal" "$placement" "$title" "${inputs[@]}" <<'PY'
import json, os, sys

work, out, terminal, placement, title = sys.argv[1:6]
files = sys.argv[6:]
want_inplace = placement == "in-place"

def quote(text):  # a gnuplot single-quoted string
    return "'" + str(text).replace("'", "''") + "'"

def size_label(b):
    for unit, name in ((1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")):
        if b >= unit and b % unit == 0:
            return "%d%s" % (b // unit, name)
    return str(b)

lines, sizes = [], set()
for path in files:
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit("plot_perf.sh: %s is not conflux-perf JSON: %s" % (path, e))
    results = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(results, list):
        sys.exit("plot_perf.sh: %s has no \"results\" list" % path)
    groups = {}
    for r in results:
        if bool(r.get("inplace")) != want_inplace or r.get("busbw") is None:
            continue
        if r.get("bytes", 0) <= 0:
            continue  # log scale
        key = (r.get("collective"), r.get("type"), r.get("op"), r.get("root"), r.get("nranks"))
        groups.setdefault(key, []).append((int(r["bytes"]), float(r["busbw"])))
    name = os.path.basename(path)
    for key, points in groups.items():
        coll, dtype, op, root, nranks = key
        what = "%s %s%s%s, %s ranks" % (coll, dtype, "" if op in (None, "none") else " " + op,
                                         "" if root is None or root < 0 else " root %d" % root,
                                         nranks)
        dat = os.path.join(work, "line%d.dat" % len(lines))
        with open(dat, "w") as f:
            for b, bw in sorted(points):
                f.write("%d %.6g\n" % (b, bw))
                sizes.add(b)
        lines.append((dat, "%s (%s)" % (name, what)))
if not lines:
    sys.exit("plot_perf.sh: no %s results with a size > 0 in %s" % (placement, " ".join(files)))

lo, hi = min(sizes), max(sizes)
tics, t = [], 1
while t <= hi * 4:
    if lo / 4 <= t <= hi * 4:
        tics.append("%s %d" % (quote(size_label(t)), t))
    t *= 4
with open(os.path.join(work, "plot.gp"), "w") as g:
    g.write("set terminal %s\n" % terminal)
    g.write("set output %s\n" % quote(out))
    g.write("set title %s\n" % quote("%s (%s)" % (title, placement)))
    g.write("set xlabel 'size (bytes)'\nset ylabel 'busbw (GB/s)'\n")
    g.write("set logscale x 2\nset xrange [%g:%g]\nset yrange [0:*]\n" % (lo / 1.5, hi * 1.5))
    g.write("set xtics (%s)\n" % ", ".join(tics))
    g.write("set grid\nset key top left\n")
    g.write("plot " + ", \\\n     ".join("%s using 1:2 with linespoints title %s" % (quote(d), quote(t))
                                         for d, t in lines) + "\n")
PY
gnuplot "$work/plot.gp"
echo "wrote $out"
