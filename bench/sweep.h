/*
 * What the comparison benchmarks (mpi_coll_bench, gloo_allreduce_bench)
 * share: conflux-perf's size and iteration flags with conflux-perf's meanings,
 * the collective (-C), the size sweep, the timing rule, exact float32 test
 * data and the output table. bench/compare.sh reads their rows next to
 * conflux-perf's.
 *
 * Rules, the same as conflux-perf's out-of-place column (docs/performance.md;
 * tools/conflux_perf/colls.c and bench.c), for a sweep step of `bytes`:
 *   - float32; count = bytes / 4, except allgather and alltoall: count =
 *     bytes / 4 / n per rank or per peer (the call's count argument, the
 *     row's count);
 *   - the row's size is the larger of the send and receive sizes: count * 4,
 *     and n * count * 4 for allgather (the total output) and alltoall (each
 *     buffer);
 *   - allreduce: sum; broadcast: from rank SWEEP_ROOT, the root passes its
 *     send buffer and the others their receive buffer (MPI_Bcast has one);
 *   - buffers allocated once at the largest size and touched before timing;
 *   - warmup: -w calls at the largest size, then -w at the smallest;
 *   - per size: one untimed call, then -n timed calls with no barrier between
 *     them; call k works at offset (k mod steps) * size, steps = max / size;
 *   - time per call = wall time / n, then the mean over ranks;
 *   - algbw = size / time (1 GB = 1e9 B); busbw = algbw * 2(n-1)/n for
 *     allreduce, algbw for broadcast, algbw * (n-1)/n for allgather and
 *     alltoall (nccl-tests' factors);
 *   - -c N: N checked calls per size after the timed ones, at offset 0.
 *
 * Output: '#' header lines, then one row per size:
 *   size count time_us algbw busbw
 * then "# Out of bounds values : N OK|FAILED" and "# Avg bus bandwidth : X".
 * Usable from C and C++.
 */
#ifndef CFX_BENCH_SWEEP_H
#define CFX_BENCH_SWEEP_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Exit codes: as conflux-perf's. */
#define SWEEP_EXIT_OK     0
#define SWEEP_EXIT_FAILED 1
#define SWEEP_EXIT_USAGE  2

/* The collectives, named as conflux-perf's subcommands. */
enum sweep_coll {
    SWEEP_ALLREDUCE,
    SWEEP_BROADCAST,
    SWEEP_ALLGATHER,
    SWEEP_ALLTOALL,
};
#define SWEEP_COLL_BIT(coll) (1u << (coll))

/* The root of broadcast: conflux-perf's default -r. */
#define SWEEP_ROOT 0

struct sweep_options {
    enum sweep_coll coll; /* -C; default allreduce */
    size_t min_bytes;     /* -b */
    size_t max_bytes;     /* -e */
    size_t step_factor;   /* -f; 1: add step_bytes instead */
    size_t step_bytes;    /* -i */
    long iters;           /* -n */
    long warmup_iters;    /* -w */
    long check_iters;     /* -c */
};

/* One call's sizes at a sweep step, as conflux-perf's sizing (bench.c). */
struct sweep_sizing {
    size_t count;       /* the call's count argument: per rank for allgather */
    size_t total_bytes; /* the row's size, algbw's numerator, the offset stride */
    size_t steps;       /* distinct offsets in buffers of max_bytes (>= 1) */
};

/*
 * Parse argv. `colls` holds the SWEEP_COLL_BIT of each collective the program
 * can time (-C accepts those only). Returns SWEEP_EXIT_OK with *opt_p set (and
 * *help_p set to 1, the usage printed to stdout, for -h), or SWEEP_EXIT_USAGE
 * after printing the problem and the usage to stderr. `launch_help` is a
 * paragraph on where ranks come from, printed at the end of the usage.
 */
int sweep_options_parse(int argc, char **argv, const char *prog, const char *launch_help,
                        unsigned colls, struct sweep_options *opt_p, int *help_p);

/* The size after `bytes`, or 0 when the sweep is over (nccl-tests' rule). */
size_t sweep_next_bytes(const struct sweep_options *opt, size_t bytes);

/* Seconds on CLOCK_MONOTONIC. */
double sweep_now_s(void);

/* Bytes to allocate for each of the send and receive buffers (page multiple, > 0). */
size_t sweep_buffer_bytes(const struct sweep_options *opt);

/* The sizes of opt->coll's call at sweep step `bytes` among `nranks` ranks. */
void sweep_sizing_init(const struct sweep_options *opt, size_t bytes, int nranks,
                       struct sweep_sizing *sz_p);

/* Allreduce: rank `rank`'s input, small integers, so any order of summation is exact. */
void sweep_fill(float *send, size_t count, int rank);

/* Allreduce: elements of `recv` that differ from the exact sum over `nranks` ranks. */
size_t sweep_verify(const float *recv, size_t count, int nranks);

/* Broadcast and allgather: rank `rank`'s data, integers below 2^24, distinct
 * over any 2^24 consecutive elements and between ranks at one index, so a
 * block moved, shifted or taken from the wrong rank shows. */
void sweep_fill_copy(float *send, size_t count, int rank);

/* Elements of `recv` that differ from rank `rank`'s sweep_fill_copy data. */
size_t sweep_verify_copy(const float *recv, size_t count, int rank);
/* sweep_verify_copy of elements offset .. offset+count-1 of rank's send buffer. */
size_t sweep_verify_copy_at(const float *recv, size_t count, int rank, size_t offset);

/* Header lines; `title` is the first line, after "# "; the next say opt->coll. */
void sweep_print_header(FILE *out, const char *title, const struct sweep_options *opt, int nranks);

/* One row; `seconds` is the mean time per call over the ranks. Returns busbw. */
double sweep_print_row(FILE *out, const struct sweep_options *opt, const struct sweep_sizing *sz,
                       double seconds, int nranks);

/* The footer. */
void sweep_print_footer(FILE *out, long long wrong, double avg_busbw);

#ifdef __cplusplus
}
#endif

#endif /* CFX_BENCH_SWEEP_H */
