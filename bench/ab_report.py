#!/usr/bin/env python3
"""Table of an interleaved A/B run (bench/shm_fifo_ab.sh, bench/tcp_zero_copy_ab.sh).

usage: ab_report.py DIR NAME [NAME ...]

DIR holds one file per NAME (missing ones are skipped), each line "size
microseconds" from one repeat. Prints a Markdown table: per size, each
run's median [min-max] in microseconds, then each later run's median over
the first's (above 1: the first is faster).
"""
import collections
import os
import statistics
import sys


def main():
    out, names = sys.argv[1], sys.argv[2:]
    runs = {}
    for name in names:
        path = os.path.join(out, name)
        if not os.path.exists(path):
            continue
        times = collections.defaultdict(list)
        for line in open(path):
            size, us = line.split()
            times[int(size)].append(float(us))
        runs[name] = times
    cols = [c for c in names if c in runs]
    first = cols[0]
    print("| size | " + " | ".join(cols) + " | " + " | ".join(f"{c}/{first}" for c in cols[1:]) + " |")
    print("|---" * (2 * len(cols)) + "|")
    for size in sorted(runs[first]):
        cells, med = [], {}
        for c in cols:
            t = runs[c].get(size, [])
            if not t:
                cells.append("-")
                continue
            med[c] = statistics.median(t)
            cells.append(f"{med[c]:.0f} [{min(t):.0f}-{max(t):.0f}]")
        ratios = [f"{med[c] / med[first]:.2f}" if c in med else "-" for c in cols[1:]]
        print(f"| {size >> 10} KiB | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")


if __name__ == "__main__":
    main()
