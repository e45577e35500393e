/*
 * The sweep shared by the comparison benchmarks: flags, the collective, sizes,
 * test data and the table (the rules are in sweep.h). Flags and defaults are
 * conflux-perf's (tools/conflux_perf/options.c), -C standing for its
 * subcommand, so one command line suits all three.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include "sweep.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PAGE_BYTES 4096

/* Keep in enum sweep_coll order. */
static const char *const coll_names[] = {"allreduce", "broadcast", "allgather", "alltoall"};
#define N_COLLS (sizeof(coll_names) / sizeof(coll_names[0]))

/* "allreduce|broadcast" for the collectives in `colls`. */
static void coll_list(unsigned colls, char *out, size_t out_bytes)
{
    size_t used = 0;
    out[0] = '\0';
    for (size_t c = 0; c < N_COLLS && used < out_bytes; c++)
        if (colls & SWEEP_COLL_BIT(c))
            used += (size_t)snprintf(out + used, out_bytes - used, "%s%s", used ? "|" : "",
                                     coll_names[c]);
}

static void print_usage(FILE *out, const char *prog, const char *launch_help, unsigned colls)
{
    char names[64];
    coll_list(colls, names, sizeof(names));
    fprintf(out,
            "usage: %s [options]\n"
            "\n"
            "float32 collectives, timed as conflux-perf times its out-of-place column.\n"
            "  -C, --coll NAME         %s (default allreduce; broadcast from rank %d;\n"
            "                          allgather's size is the total output)\n"
            "Sizes (suffixes K, M, G are powers of 1024):\n"
            "  -b, --minbytes SIZE     smallest size (default 32M)\n"
            "  -e, --maxbytes SIZE     largest size (default 32M)\n"
            "  -f, --stepfactor N      multiply the size by N between steps (default 1)\n"
            "  -i, --stepbytes SIZE    add SIZE between steps when the factor is 1 (default 1M)\n"
            "Iterations:\n"
            "  -n, --iters N           timed iterations per size (default 20)\n"
            "  -w, --warmup_iters N    warmup iterations at the largest and smallest size "
            "(default 5)\n"
            "  -c, --check N           checked calls per size, 0 for none (default 1)\n"
            "  -h, --help              this text\n"
            "\n"
            "%s\n",
            prog, names, SWEEP_ROOT, launch_help);
}

__attribute__((format(printf, 4, 5))) static int
usage_error(const char *prog, const char *launch_help, unsigned colls, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, args);
    fprintf(stderr, "\n\n");
    va_end(args);
    print_usage(stderr, prog, launch_help, colls);
    return SWEEP_EXIT_USAGE;
}

static int parse_long(const char *text, long min, long max, long *value_p)
{
    char *end = NULL;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (text[0] == '\0' || *end != '\0' || errno != 0 || value < min || value > max)
        return -1;
    *value_p = value;
    return 0;
}

/* nccl-tests' sizes: a number, maybe fractional, then K, M or G and an optional B. */
static int parse_size(const char *text, size_t *bytes_p)
{
    char *end = NULL;
    errno = 0;
    double number = strtod(text, &end);
    if (end == text || errno != 0 || !(number >= 0.0))
        return -1;
    double unit = 1.0;
    switch (*end) {
    case 'k':
    case 'K': unit = 1024.0, end++; break;
    case 'm':
    case 'M': unit = 1024.0 * 1024.0, end++; break;
    case 'g':
    case 'G': unit = 1024.0 * 1024.0 * 1024.0, end++; break;
    default: break;
    }
    if (*end == 'b' || *end == 'B')
        end++;
    double bytes = floor(number * unit);
    if (*end != '\0' || bytes > (double)(SIZE_MAX / 4))
        return -1;
    *bytes_p = (size_t)bytes;
    return 0;
}

static const struct option long_options[] = {
    {"coll", required_argument, NULL, 'C'},
    {"minbytes", required_argument, NULL, 'b'},
    {"maxbytes", required_argument, NULL, 'e'},
    {"stepbytes", required_argument, NULL, 'i'},
    {"stepfactor", required_argument, NULL, 'f'},
    {"iters", required_argument, NULL, 'n'},
    {"warmup_iters", required_argument, NULL, 'w'},
    {"check", required_argument, NULL, 'c'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

int sweep_options_parse(int argc, char **argv, const char *prog, const char *launch_help,
                        unsigned colls, struct sweep_options *opt_p, int *help_p)
{
    struct sweep_options opt = {
        .coll = SWEEP_ALLREDUCE,
        .min_bytes = 32u << 20,
        .max_bytes = 32u << 20,
        .step_factor = 1,
        .step_bytes = 1u << 20,
        .iters = 20,
        .warmup_iters = 5,
        .check_iters = 1,
    };
    *help_p = 0;
    opterr = 0;
    optind = 1;
    for (;;) {
        int c = getopt_long(argc, argv, ":C:b:e:i:f:n:w:c:h", long_options, NULL);
        if (c == -1)
            break;
        long value = 0;
        switch (c) {
        case 'C': {
            size_t k = 0;
            while (k < N_COLLS && strcmp(optarg, coll_names[k]) != 0)
                k++;
            if (k == N_COLLS || !(colls & SWEEP_COLL_BIT(k))) {
                char names[64];
                coll_list(colls, names, sizeof(names));
                return usage_error(prog, launch_help, colls, "bad -C/--coll '%s' (%s)", optarg,
                                   names);
            }
            opt.coll = (enum sweep_coll)k;
            break;
        }
        case 'b':
            if (parse_size(optarg, &opt.min_bytes) != 0)
                return usage_error(prog, launch_help, colls, "bad -b/--minbytes '%s'", optarg);
            break;
        case 'e':
            if (parse_size(optarg, &opt.max_bytes) != 0)
                return usage_error(prog, launch_help, colls, "bad -e/--maxbytes '%s'", optarg);
            break;
        case 'i':
            if (parse_size(optarg, &opt.step_bytes) != 0)
                return usage_error(prog, launch_help, colls, "bad -i/--stepbytes '%s'", optarg);
            break;
        case 'f':
            if (parse_long(optarg, 1, 1L << 20, &value) != 0)
                return usage_error(prog, launch_help, colls, "bad -f/--stepfactor '%s' (>= 1)",
                                   optarg);
            opt.step_factor = (size_t)value;
            break;
        case 'n':
            if (parse_long(optarg, 1, 1L << 30, &value) != 0)
                return usage_error(prog, launch_help, colls, "bad -n/--iters '%s' (>= 1)", optarg);
            opt.iters = value;
            break;
        case 'w':
            if (parse_long(optarg, 0, 1L << 30, &value) != 0)
                return usage_error(prog, launch_help, colls, "bad -w/--warmup_iters '%s' (>= 0)",
                                   optarg);
            opt.warmup_iters = value;
            break;
        case 'c':
            if (parse_long(optarg, 0, 1L << 20, &value) != 0)
                return usage_error(prog, launch_help, colls, "bad -c/--check '%s' (>= 0)", optarg);
            opt.check_iters = value;
            break;
        case 'h':
            print_usage(stdout, prog, launch_help, colls);
            *help_p = 1;
            return SWEEP_EXIT_OK;
        case ':':
            return usage_error(prog, launch_help, colls, "option '%s' needs a value",
                               argv[optind - 1]);
        default:
            return usage_error(prog, launch_help, colls, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return usage_error(prog, launch_help, colls, "unexpected argument '%s'", argv[optind]);
    if (opt.min_bytes > opt.max_bytes)
        return usage_error(prog, launch_help, colls, "-b/--minbytes is larger than -e/--maxbytes");
    if (opt.step_factor <= 1 && opt.step_bytes == 0 && opt.min_bytes < opt.max_bytes)
        return usage_error(prog, launch_help, colls,
                           "-i is 0 and -f is 1: the sweep would never end");
    if (opt.step_factor > 1 && opt.min_bytes == 0 && opt.max_bytes > 0)
        return usage_error(prog, launch_help, colls,
                           "-b is 0 with -f > 1: the sweep would never grow");
    *opt_p = opt;
    return SWEEP_EXIT_OK;
}

size_t sweep_next_bytes(const struct sweep_options *opt, size_t bytes)
{
    size_t next = opt->step_factor > 1 ? bytes * opt->step_factor : bytes + opt->step_bytes;
    if (next <= bytes || next > opt->max_bytes)
        return 0; /* done, or 0 * factor, or overflow */
    return next;
}

double sweep_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

size_t sweep_buffer_bytes(const struct sweep_options *opt)
{
    size_t bytes = (opt->max_bytes + PAGE_BYTES - 1) / PAGE_BYTES * PAGE_BYTES;
    return bytes ? bytes : PAGE_BYTES;
}

void sweep_sizing_init(const struct sweep_options *opt, size_t bytes, int nranks,
                       struct sweep_sizing *sz_p)
{
    size_t count = bytes / sizeof(float);
    size_t total = count;
    if (opt->coll == SWEEP_ALLGATHER || opt->coll == SWEEP_ALLTOALL) {
        count /= (size_t)nranks;
        total = count * (size_t)nranks;
    }
    sz_p->count = count;
    sz_p->total_bytes = total * sizeof(float);
    sz_p->steps = sz_p->total_bytes ? opt->max_bytes / sz_p->total_bytes : 1;
    if (sz_p->steps == 0)
        sz_p->steps = 1;
}

/* Element i of rank r is (r + 1) + (i mod 7): sums stay far below 2^24. */
void sweep_fill(float *send, size_t count, int rank)
{
    for (size_t i = 0; i < count; i++)
        send[i] = (float)(rank + 1 + (int)(i % 7));
}

size_t sweep_verify(const float *recv, size_t count, int nranks)
{
    size_t wrong = 0;
    float base = (float)nranks * (float)(nranks + 1) / 2.0f;
    for (size_t i = 0; i < count; i++)
        if (recv[i] != base + (float)nranks * (float)(i % 7))
            wrong++;
    return wrong;
}

/* Element i of rank r: (i + r * K) times an odd constant, mod 2^24: a
 * bijection on any 2^24 consecutive indices; exact in a float. */
static float copy_value(size_t i, int rank)
{
    uint32_t index = (uint32_t)i + (uint32_t)rank * 0x5bd1e9u;
    return (float)((index * 0x9e3779b1u) & 0xffffffu);
}

void sweep_fill_copy(float *send, size_t count, int rank)
{
    for (size_t i = 0; i < count; i++)
        send[i] = copy_value(i, rank);
}

size_t sweep_verify_copy(const float *recv, size_t count, int rank)
{
    return sweep_verify_copy_at(recv, count, rank, 0);
}

size_t sweep_verify_copy_at(const float *recv, size_t count, int rank, size_t offset)
{
    size_t wrong = 0;
    for (size_t i = 0; i < count; i++)
        if (recv[i] != copy_value(offset + i, rank))
            wrong++;
    return wrong;
}

void sweep_print_header(FILE *out, const char *title, const struct sweep_options *opt, int nranks)
{
    static const char *const what[] = {
        [SWEEP_ALLREDUCE] = "float32 sum allreduce",
        [SWEEP_BROADCAST] = "float32 broadcast from rank 0",
        [SWEEP_ALLGATHER] = "float32 allgather (size: the total output; count: per rank)",
        [SWEEP_ALLTOALL] = "float32 alltoall (size: each buffer; count: per peer)",
    };
    static const char *const busbw[] = {
        [SWEEP_ALLREDUCE] = "busbw = algbw * 2(n-1)/n",
        [SWEEP_BROADCAST] = "busbw = algbw",
        [SWEEP_ALLGATHER] = "busbw = algbw * (n-1)/n",
        [SWEEP_ALLTOALL] = "busbw = algbw * (n-1)/n",
    };
    _Static_assert(SWEEP_ROOT == 0, "the broadcast line names rank 0");
    fprintf(out, "# %s\n", title);
    fprintf(out,
            "# %d ranks, %s, out of place, minBytes %zu maxBytes %zu step: %zu(%s) "
            "warmup iters: %ld iters: %ld check: %ld\n",
            nranks, what[opt->coll], opt->min_bytes, opt->max_bytes,
            opt->step_factor > 1 ? opt->step_factor : opt->step_bytes,
            opt->step_factor > 1 ? "factor" : "bytes", opt->warmup_iters, opt->iters,
            opt->check_iters);
    fprintf(out, "# time: the mean of the ranks' mean time per call; algbw = size / time; %s\n",
            busbw[opt->coll]);
    fprintf(out, "#%11s %13s %11s %7s %7s\n", "size", "count", "time", "algbw", "busbw");
    fprintf(out, "#%11s %13s %11s %7s %7s\n", "(B)", "(elements)", "(us)", "(GB/s)", "(GB/s)");
    fflush(out);
}

double sweep_print_row(FILE *out, const struct sweep_options *opt, const struct sweep_sizing *sz,
                       double seconds, int nranks)
{
    double algbw = seconds > 0.0 ? (double)sz->total_bytes / 1e9 / seconds : 0.0;
    double factor = 1.0; /* broadcast */
    if (opt->coll == SWEEP_ALLREDUCE)
        factor = 2.0 * (nranks - 1) / nranks;
    else if (opt->coll == SWEEP_ALLGATHER || opt->coll == SWEEP_ALLTOALL)
        factor = (double)(nranks - 1) / nranks;
    double busbw = algbw * factor;
    fprintf(out, "%12zu %13zu %11.2f %7.2f %7.2f\n", sz->total_bytes, sz->count, seconds * 1e6,
            algbw, busbw);
    fflush(out);
    return busbw;
}

void sweep_print_footer(FILE *out, long long wrong, double avg_busbw)
{
    fprintf(out, "# Out of bounds values : %lld %s\n", wrong, wrong ? "FAILED" : "OK");
    fprintf(out, "# Avg bus bandwidth    : %g\n", avg_busbw);
    fflush(out);
}
