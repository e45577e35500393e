#!/usr/bin/env python3
"""The tables of bench/compare.sh: per setting and collective, each size's busbw
for Conflux, Open MPI and Gloo (allreduce only), their ratios, the 8-byte
latency, the iperf3 and memcpy reference lines, the oversubscription figure,
and issue 5's targets.

    bench/compare_report.py OUT_DIR SETTINGS OVERSUB_RANKS median|best

OUT_DIR holds one folder per setting with the logs compare.sh wrote: LIB.N is
the stdout of repeat N of LIB (conflux, ompi, gloo, iperf, iperfbidir, npK)
for allreduce, LIB.COLL.N that of another collective (conflux.broadcast.1,
ompi.allgather.2), LIB.N.calm the --calm count before it. A table is printed
for each collective that has logs. Standard library only.
"""
import json
import os
import statistics
import sys

if len(sys.argv) != 5 or sys.argv[4] not in ("median", "best"):
    sys.exit(__doc__)
out, settings, oversub_ranks, stat = (sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]),
                                      sys.argv[4])
# --stat: the median over repeats, or the best (least disturbed) repeat.
pick_low = statistics.median if stat == "median" else min    # times
pick_high = statistics.median if stat == "median" else max   # bandwidths
GB = 1e9
COLLS = ("allreduce", "broadcast", "allgather", "alltoall")  # table order
# busbw / algbw at 2 ranks, nccl-tests' factors: 2(n-1)/n, 1, (n-1)/n, (n-1)/n.
BUS_FACTOR = {"allreduce": 1.0, "broadcast": 1.0, "allgather": 0.5, "alltoall": 0.5}
problems = []  # runs left out, for the summary
targets = []   # issue 5's targets: "met" or "MISSED" lines


def log_name(lib, coll):
    """The log name of `lib`'s runs of `coll`, before .<repeat> (compare.sh's log_name)."""
    return lib if coll == "allreduce" else f"{lib}.{coll}"


def run_files(setting, lib):
    """The stdout logs of `lib`'s runs in `setting`: LIB.<repeat>."""
    d = f"{out}/{setting}"
    if not os.path.isdir(d):
        return []
    return sorted(f"{d}/{n}" for n in os.listdir(d)
                  if n.startswith(lib + ".") and n[len(lib) + 1:].isdigit())


def rows(path):
    """{size: (time_us, busbw)} of one run: conflux-perf's out-of-place columns or the
    5-column table of the bench programs. None when the run failed or checked wrong."""
    result, failed = {}, None
    for line in open(path).read().splitlines():
        f = line.split()
        if line.startswith("# compare.sh: exit"):
            failed = line[2:]
        elif line.startswith("# Out of bounds values") and "FAILED" in line:
            failed = "wrong results"
        if not f or line.startswith("#"):
            continue
        try:
            if len(f) >= 13:   # conflux-perf: size count type redop root time algbw busbw ...
                result[int(f[0])] = (float(f[5]), float(f[7]))
            elif len(f) == 5:  # mpi_coll_bench, gloo_allreduce_bench: size count time algbw busbw
                result[int(f[0])] = (float(f[2]), float(f[4]))
        except ValueError:
            pass
    if failed or not result:
        problems.append(f"{os.path.relpath(path, out)}: {failed or 'no results'}; left out")
        return None
    return result


def runs(setting, lib):
    """The tables of `lib`'s runs in `setting` that completed and checked right."""
    return [r for r in map(rows, run_files(setting, lib)) if r]


def size_table(rs, coll="allreduce"):
    """{size: (time_us over the runs, busbw from it, runs)}. Two ranks, so busbw = algbw =
    size / time times BUS_FACTOR[coll]; computed from the time, which the tables print with
    more digits."""
    sizes = sorted({s for r in rs for s in r})
    table = {}
    for sz in sizes:
        t = pick_low([r[sz][0] for r in rs if sz in r])
        table[sz] = (t, sz / (t * 1e3) * BUS_FACTOR[coll] if t > 0 else None,
                     sum(1 for r in rs if sz in r))
    return table


def memcpy_gbps(setting, coll="allreduce"):
    vals = []
    for p in run_files(setting, log_name("conflux", coll)):
        for line in open(p):
            if line.startswith("# memcpy bandwidth:"):
                vals.append(float(line.split(":")[1].split()[0]))
    return pick_high(vals) if vals else None


def iperf_gbytes(setting, name="iperf", key="sum_received"):
    """iperf3's received GB/s (of the `key` direction) over the repeats, and their count."""
    vals = []
    for p in run_files(setting, name):
        try:
            vals.append(json.load(open(p))["end"][key]["bits_per_second"] / 8 / GB)
        except (OSError, ValueError, KeyError):
            pass
    return (pick_high(vals), len(vals)) if vals else (None, 0)


def calm_line(setting):
    """The --calm counts logged before each run of a setting, as a comment line."""
    d, vals = f"{out}/{setting}", []
    for n in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if n.endswith(".calm"):
            vals.append(float(open(f"{d}/{n}").read().split()[0]))
    if not vals:
        return None
    return (f"# other runnable tasks when each run started (--calm): median "
            f"{statistics.median(vals):.1f}, max {max(vals):.1f}, over {len(vals)} runs")


def human(n):
    """Bytes as compare.sh's sizes read: 8, 2K, 128M."""
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def fmt(x, spec="7.2f"):
    """x formatted, or a '-' as wide, for a missing figure."""
    width = spec.split(".")[0]
    return format(x, spec) if x is not None else "-".rjust(int(width) if width else 1)


def ratio(a, b):
    return a / b if a is not None and b else None

MPI_CALL = {"allreduce": "MPI_Allreduce", "broadcast": "MPI_Bcast (root 0)",
            "allgather": "MPI_Allgather", "alltoall": "MPI_Alltoall"}
BUS_FORMULA = {"allreduce": "algbw * 2(n-1)/n", "broadcast": "algbw",
               "allgather": "algbw * (n-1)/n, size = the total output",
               "alltoall": "algbw * (n-1)/n, size = each buffer"}

titles = {
    "shm": "one host, shared memory (Open MPI vader; Gloo: TCP on lo, it has no shm)",
    "tcp": "one host, loopback TCP (Conflux CFX_SHM_DISABLE=1; Open MPI tcp on lo; Gloo tcp on lo)",
    "veth": "two namespaces, veth, unshaped",
    "veth10g": "two namespaces, veth shaped with tc tbf on both ends",
}

def has_runs(s, coll):
    """Whether setting `s` holds logs of `coll`."""
    return any(run_files(s, log_name(lib, coll)) for lib in ("conflux", "ompi", "gloo"))


def lowest_from(busbw, sizes, threshold):
    """(size, busbw) of the lowest busbw at sizes >= threshold, or None."""
    big = [(sz, busbw[sz]) for sz in sizes if sz >= threshold and sz in busbw]
    return min(big, key=lambda x: x[1]) if big else None


def setting_table(s, coll="allreduce"):
    """The table of one 2-rank setting and collective, and its targets. Gloo's columns are
    there for allreduce only (gloo_allreduce_bench times nothing else)."""
    libs = ("conflux", "ompi", "gloo") if coll == "allreduce" else ("conflux", "ompi")
    t = {lib: size_table(runs(s, log_name(lib, coll)), coll) for lib in libs}
    t.setdefault("gloo", {})
    n_runs = {lib: len(run_files(s, log_name(lib, coll))) for lib in libs}
    load = [open(f"{out}/{s}/load-{w}").read().strip() for w in ("start", "end")]
    gloo = "gloo" in libs
    name = s if coll == "allreduce" else f"{s} {coll}"  # allreduce: the headings as before
    print(f"\n## {name}: {titles[s]}")
    if gloo:
        print(f"# runs: Conflux {n_runs['conflux']}, Open MPI {n_runs['ompi']}, "
              f"Gloo {n_runs['gloo']}; load average {load[0]} at the start, {load[1]} at the end")
    else:
        print(f"# {coll}: conflux-perf {coll} against {MPI_CALL[coll]}; busbw = "
              f"{BUS_FORMULA[coll]}; no Gloo columns (gloo_allreduce_bench times allreduce only)")
        print(f"# runs: Conflux {n_runs['conflux']}, Open MPI {n_runs['ompi']}; "
              f"load average {load[0]} at the start, {load[1]} at the end (the whole setting)")
    if calm_line(s):
        print(calm_line(s))
    if os.path.exists(f"{out}/{s}/qdisc"):
        print("# qdisc: " + open(f"{out}/{s}/qdisc").read().strip())
    ceiling, n_iperf = iperf_gbytes(s)
    if ceiling is not None:
        print(f"# iperf3 ceiling: {ceiling:.2f} GB/s ({ceiling * 8:.2f} Gbit/s, one way, "
              f"{stat} of {n_iperf})")
        fwd, n_bidir = iperf_gbytes(s, "iperfbidir")
        rev, _ = iperf_gbytes(s, "iperfbidir", "sum_received_bidir_reverse")
        if fwd is not None and rev is not None:
            print(f"# iperf3 --bidir: {fwd:.2f} and {rev:.2f} GB/s, both ways at once "
                  f"({stat} of {n_bidir}); Conflux/ceiling below uses the one-way figure")
    mc = memcpy_gbps(s, coll)
    if mc is not None:
        print(f"# memcpy bandwidth: {mc:.2f} GB/s (conflux-perf, {stat} of the repeats)")
    print(f"#{'size':>9} {'Conflux':>8} {'OMPI':>8}" + (f" {'Gloo':>8}" if gloo else "")
          + f" {'Cfx/OMPI':>9}" + (f" {'Cfx/Gloo':>9}" if gloo else "")
          + ("  Cfx/iperf3" if ceiling else ""))
    print(f"#{'(B)':>9} {'busbw':>8} {'busbw':>8}" + (f" {'busbw':>8}" if gloo else ""))
    sizes = sorted(set(t["conflux"]) | set(t["ompi"]) | set(t["gloo"]))
    bw = {lib: {sz: v[1] for sz, v in t[lib].items()} for lib in t}
    for sz in sizes:
        c, o, g = (bw[lib].get(sz) for lib in ("conflux", "ompi", "gloo"))
        line = (f"{human(sz):>10} {fmt(c, '8.3f')} {fmt(o, '8.3f')}"
                + (f" {fmt(g, '8.3f')}" if gloo else "") + f" {fmt(ratio(c, o), '9.2f')}"
                + (f" {fmt(ratio(c, g), '9.2f')}" if gloo else ""))
        if ceiling:
            line += f" {fmt(ratio(c, ceiling), '10.2f')}"
        print(line)
    small = min(sizes) if sizes else None
    if small is not None:
        lat = {lib: t[lib][small][0] if small in t[lib] else None for lib in t}
        print(f"# {small}-byte latency (us): Conflux {fmt(lat['conflux'], '.2f')}, "
              f"Open MPI {fmt(lat['ompi'], '.2f')}"
              + (f", Gloo {fmt(lat['gloo'], '.2f')}" if gloo else ""))
    # Issue 5's targets, from these figures.
    def check(name, ok, detail):
        targets.append(f"{'met   ' if ok else 'MISSED'} {name_target}: {name}: {detail}")

    name_target = s if coll == "allreduce" else f"{s} {coll}"

    def worst(pairs):
        r = [(sz, c / o) for sz, c, o in pairs if c is not None and o]
        return min(r, key=lambda x: x[1]) if r else None

    if coll == "alltoall":
        # Issue 15: >= Open MPI's MPI_Alltoall at >= 64 KiB per peer over shared memory.
        if s == "shm" and t["ompi"]:
            w = worst([(sz, bw["conflux"].get(sz), bw["ompi"].get(sz))
                       for sz in sizes if sz >= 2 * (64 << 10)])
            if w:
                check(f"busbw >= Open MPI's {MPI_CALL[coll]} at every size >= 64K per peer",
                      w[1] >= 1.0, f"lowest Conflux/OMPI {w[1]:.2f} at {human(w[0])}")
        return
    if coll != "allreduce":
        # Broadcast and allgather: >= Open MPI's MPI_Bcast/MPI_Allgather at >= 1 MiB, on one
        # host (shared memory and loopback TCP).
        if s in ("shm", "tcp") and t["ompi"]:
            w = worst([(sz, bw["conflux"].get(sz), bw["ompi"].get(sz))
                       for sz in sizes if sz >= 1 << 20])
            if w:
                check(f"busbw >= Open MPI's {MPI_CALL[coll]} at every size >= 1M", w[1] >= 1.0,
                      f"lowest Conflux/OMPI {w[1]:.2f} at {human(w[0])}")
        return
    if s in ("shm", "tcp") and t["ompi"]:
        lo = 0 if s == "shm" else 64 << 10
        w = worst([(sz, bw["conflux"].get(sz), bw["ompi"].get(sz)) for sz in sizes if sz >= lo])
        if w:
            check(f"busbw >= Open MPI at every size >= {human(lo) if lo else '8'} B", w[1] >= 1.0,
                  f"lowest Conflux/OMPI {w[1]:.2f} at {human(w[0])}")
    if s == "shm":
        if mc:
            low = lowest_from(bw["conflux"], sizes, 32 << 20)
            if low:
                check("busbw >= 0.4 x memcpy at >= 32M", low[1] >= 0.4 * mc,
                      f"lowest {low[1]:.2f} GB/s at {human(low[0])} = {low[1] / mc:.2f} x memcpy {mc:.2f}")
        if small is not None and lat["conflux"] is not None and lat["ompi"] is not None:
            check(f"{small}-byte latency <= Open MPI's", lat["conflux"] <= lat["ompi"],
                  f"{lat['conflux']:.2f} us vs {lat['ompi']:.2f} us")
    if s == "veth10g":
        if ceiling:
            low = lowest_from(bw["conflux"], sizes, 8 << 20)
            if low:
                check("busbw >= 0.9 x iperf3 at >= 8M", low[1] >= 0.9 * ceiling,
                      f"lowest {low[1]:.2f} GB/s at {human(low[0])} = {low[1] / ceiling:.2f} x iperf3 {ceiling:.2f}")
        if small is not None and lat["conflux"] is not None and lat["gloo"] is not None:
            check(f"{small}-byte latency <= half of Gloo's", lat["conflux"] <= 0.5 * lat["gloo"],
                  f"{lat['conflux']:.2f} us vs Gloo {lat['gloo']:.2f} us")


def oversub_table():
    """The oversubscribed run against the 2-rank one, and its target."""
    def oversub(n):
        rs = runs("oversub", f"np{n}")
        vals = [v for r in rs for v in r.values()]
        return (pick_high([v[1] for v in vals]), pick_low([v[0] for v in vals]),
                len(rs)) if vals else (None, None, 0)
    many, two = oversub(oversub_ranks), oversub(2)
    n_tried = len(run_files("oversub", f"np{oversub_ranks}"))

    print(f"\n## oversub: {oversub_ranks} ranks on {os.cpu_count()} cpus against 2, shared memory")
    if calm_line("oversub"):
        print(calm_line("oversub"))
    for n, v in ((oversub_ranks, many), (2, two)):
        print(f"# {n} ranks: busbw {fmt(v[0], '.2f')} GB/s, time {fmt(v[1], '.0f')} us "
              f"({stat} of {v[2]} completed runs)")
    if many[0] is not None and two[0]:
        r = many[0] / two[0]
        print(f"# {oversub_ranks}-rank / 2-rank busbw: {r:.2f}")
        targets.append(f"{'met   ' if r >= 0.3 and many[2] == n_tried else 'MISSED'} oversub: "
                       f"{oversub_ranks} ranks complete ({many[2]} of {n_tried}) and busbw >= 0.3 x "
                       f"2 ranks: {r:.2f}")
    else:
        targets.append(f"MISSED oversub: {oversub_ranks} ranks did not complete")


def main():
    print(open(f"{out}/run-info.txt").read().rstrip())
    print(f"statistic over repeats: {stat} (of each size's time and bandwidth)")
    for s in settings:
        if s != "oversub" and os.path.isdir(f"{out}/{s}"):
            for coll in COLLS:
                if coll == "allreduce" and not any(has_runs(s, c) for c in COLLS):
                    setting_table(s)  # an empty table, as before: says the setting ran nothing
                elif has_runs(s, coll):
                    setting_table(s, coll)
    if "oversub" in settings and os.path.isdir(f"{out}/oversub"):
        oversub_table()
    if problems:
        print("\n## runs left out of the medians")
        for line in sorted(set(problems)):
            print(line)
    if targets:
        print(f"\n## issue 5 targets, from the {stat} figures above")
        for line in targets:
            print(line)
    print(f"\n# logs: {out}")


if __name__ == "__main__":
    main()
