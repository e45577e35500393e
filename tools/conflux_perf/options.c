/*
 * The command line of conflux-perf: a subcommand naming the collective, then
 * nccl-tests' flags with nccl-tests' meanings and defaults, then our own
 * (--np, --mem, --json). Every value is checked here, once; a bad one is a
 * usage error (exit 2) that names the flag.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "perf.h"

/* Keep in cfxDataType_t order; the first name is the one printed. */
static const char *const type_names[cfxNumTypes][4] = {
    {"int8", "char", NULL},
    {"uint8", NULL},
    {"int32", "int", NULL},
    {"uint32", NULL},
    {"int64", NULL},
    {"uint64", NULL},
    {"half", "float16", "fp16", NULL},
    {"float", "float32", "fp32", NULL},
    {"double", "float64", "fp64", NULL},
    {"bfloat16", "bf16", NULL},
    {"f8e4m3", "e4m3", "fp8_e4m3", NULL},
    {"f8e5m2", "e5m2", "fp8_e5m2", NULL},
};
static const size_t type_sizes[cfxNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

/* Keep in cfxRedOp_t order. */
static const char *const op_names[cfxNumOps] = {"sum", "prod", "max", "min", "avg"};

const char *perf_type_name(cfxDataType_t type)
{
    return type_names[type][0];
}

const char *perf_op_name(cfxRedOp_t op)
{
    return op_names[op];
}

size_t perf_type_size(cfxDataType_t type)
{
    return type_sizes[type];
}

/* Keep in enum perf_mem order. */
static const char *const mem_names[] = {"auto", "host", "device"};

const char *perf_mem_name(enum perf_mem mem)
{
    return mem_names[mem];
}

void perf_options_usage(FILE *out, const char *prog)
{
    fprintf(out,
            "usage: %s %s [options]\n"
            "\n"
            "Sizes (suffixes K, M, G are powers of 1024):\n"
            "  -b, --minbytes SIZE     smallest size (default 32M)\n"
            "  -e, --maxbytes SIZE     largest size (default 32M)\n"
            "  -f, --stepfactor N      multiply the size by N between steps (default 1)\n"
            "  -i, --stepbytes SIZE    add SIZE between steps when the factor is 1 (default 1M)\n"
            "Iterations:\n"
            "  -n, --iters N           timed iterations per size (default 20)\n"
            "  -w, --warmup_iters N    warmup iterations at the largest and smallest size "
            "(default 5)\n"
            "  -m, --agg_iters N       calls per timed iteration, in one group (default 1)\n"
            "  -c, --check N           checked calls per size, 0 for none (default 1)\n"
            "  -a, --average 0|1|2|3   time across ranks: rank 0, mean, min, max (default 1)\n"
            "Data:\n"
            "  -d, --datatype TYPE     int8 uint8 int32 uint32 int64 uint64 half float double\n"
            "                          bfloat16 f8e4m3 f8e5m2, or all (default float)\n"
            "  -o, --op OP             sum prod max min avg, or all (default sum)\n"
            "  -r, --root RANK         root of broadcast and reduce, or all (default 0)\n"
            "  --mem host|device|auto  buffers in host memory (stream NULL) or GPU memory\n"
            "                          (cuMemAlloc, a stream per rank); auto: GPU memory when\n"
            "                          this rank can use a GPU (default auto)\n"
            "  -R, --local_register 0|1  register both buffers with cfxCommRegister before\n"
            "                          the first call (transports that move registered\n"
            "                          memory then send from it; default 0)\n"
            "Ranks:\n"
            "  -t, --nthreads N        N ranks as threads of this one process (one CUDA\n"
            "                          context for all: their kernels run at once)\n"
            "  --np N                  fork N ranks on this host (one process each)\n"
            "                          without --np: RANK, WORLD_SIZE, MASTER_ADDR and\n"
            "                          MASTER_PORT; else mpirun; else srun (SLURM_PROCID,\n"
            "                          SLURM_NTASKS; root at MASTER_ADDR:MASTER_PORT,\n"
            "                          CFX_COMM_ID or the srun host); else one rank\n"
            "Output:\n"
            "  --json FILE             also write the results to FILE as JSON\n"
            "  -h, --help              this text\n"
            "Accepted so nccl-tests command lines run: -g 1, -z 0|1, -y 0|1, -G 0\n"
            "(one GPU per rank; host calls complete on the NULL stream, device calls\n"
            "on the rank's own stream, synchronised after each timed loop).\n",
            prog, perf_coll_names());
}

/* ------------------------------------------------------------ values */

/* Print "prog: problem" and the usage to stderr; returns PERF_EXIT_USAGE. */
__attribute__((format(printf, 2, 3))) static int usage_error(const char *prog, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, args);
    fprintf(stderr, "\n\n");
    va_end(args);
    perf_options_usage(stderr, prog);
    return PERF_EXIT_USAGE;
}

/* A whole decimal number in [min, max]. */
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

/* A size as nccl-tests reads it: a number, maybe fractional, then an optional
 * K, M or G (powers of 1024, either case) and an optional B. */
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
    case 'K':
        unit = 1024.0;
        end++;
        break;
    case 'm':
    case 'M':
        unit = 1024.0 * 1024.0;
        end++;
        break;
    case 'g':
    case 'G':
        unit = 1024.0 * 1024.0 * 1024.0;
        end++;
        break;
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

static int parse_type(const char *text, int *type_p)
{
    if (strcasecmp(text, "all") == 0) {
        *type_p = PERF_ALL;
        return 0;
    }
    for (int t = 0; t < cfxNumTypes; t++)
        for (int a = 0; a < 4 && type_names[t][a] != NULL; a++)
            if (strcasecmp(text, type_names[t][a]) == 0) {
                *type_p = t;
                return 0;
            }
    return -1;
}

static int parse_op(const char *text, int *op_p)
{
    if (strcasecmp(text, "all") == 0) {
        *op_p = PERF_ALL;
        return 0;
    }
    for (int o = 0; o < cfxNumOps; o++)
        if (strcasecmp(text, op_names[o]) == 0) {
            *op_p = o;
            return 0;
        }
    return -1;
}

static void join_command(int argc, char **argv, char *out, size_t out_bytes)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < argc && used + 1 < out_bytes; i++) {
        int n = snprintf(out + used, out_bytes - used, "%s%s", i ? " " : "", argv[i]);
        if (n < 0)
            break;
        used += (size_t)n;
    }
}

/* ------------------------------------------------------------ parse */

enum { OPT_NP = 1000, OPT_JSON, OPT_MEM };

static const struct option long_options[] = {
    {"minbytes", required_argument, NULL, 'b'},
    {"maxbytes", required_argument, NULL, 'e'},
    {"stepbytes", required_argument, NULL, 'i'},
    {"stepfactor", required_argument, NULL, 'f'},
    {"iters", required_argument, NULL, 'n'},
    {"warmup_iters", required_argument, NULL, 'w'},
    {"agg_iters", required_argument, NULL, 'm'},
    {"check", required_argument, NULL, 'c'},
    {"average", required_argument, NULL, 'a'},
    {"datatype", required_argument, NULL, 'd'},
    {"op", required_argument, NULL, 'o'},
    {"root", required_argument, NULL, 'r'},
    {"nthreads", required_argument, NULL, 't'},
    {"ngpus", required_argument, NULL, 'g'},
    {"blocking", required_argument, NULL, 'z'},
    {"stream_null", required_argument, NULL, 'y'},
    {"cudagraph", required_argument, NULL, 'G'},
    {"local_register", required_argument, NULL, 'R'},
    {"np", required_argument, NULL, OPT_NP},
    {"json", required_argument, NULL, OPT_JSON},
    {"mem", required_argument, NULL, OPT_MEM},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

int perf_options_parse(int argc, char **argv, struct perf_options *opt_p, int *help_p)
{
    const char *prog = "conflux-perf";
    struct perf_options opt = {
        .coll = NULL,
        .min_bytes = 32u << 20,
        .max_bytes = 32u << 20,
        .step_bytes = 1u << 20,
        .step_factor = 1,
        .iters = 20,
        .warmup_iters = 5,
        .agg_iters = 1,
        .check_iters = 1,
        .type = cfxFloat,
        .op = cfxSum,
        .root = 0,
        .average = 1,
        .np = 0,
        .threads = 1,
        .mem = PERF_MEM_AUTO,
        .json_path = NULL,
    };
    *help_p = 0;
    if (argc < 2)
        return usage_error(prog, "no collective given");
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        *help_p = 1;
        return PERF_EXIT_OK;
    }
    opt.coll = perf_coll_find(argv[1]);
    if (opt.coll == NULL)
        return usage_error(prog, "unknown collective '%s'", argv[1]);
    join_command(argc, argv, opt.command, sizeof(opt.command));

    /* Options follow the subcommand: parse argv[1..] with argv[1] as "program". */
    int sub_argc = argc - 1;
    char **sub_argv = argv + 1;
    opterr = 0;
    optind = 1;
    for (;;) {
        int c = getopt_long(sub_argc, sub_argv, ":b:e:i:f:n:w:m:c:a:d:o:r:t:g:z:y:G:R:h",
                            long_options, NULL);
        if (c == -1)
            break;
        long value = 0;
        switch (c) {
        case 'b':
            if (parse_size(optarg, &opt.min_bytes) != 0)
                return usage_error(prog, "bad %s '%s'", "-b/--minbytes", optarg);
            break;
        case 'e':
            if (parse_size(optarg, &opt.max_bytes) != 0)
                return usage_error(prog, "bad %s '%s'", "-e/--maxbytes", optarg);
            break;
        case 'i':
            if (parse_size(optarg, &opt.step_bytes) != 0)
                return usage_error(prog, "bad %s '%s'", "-i/--stepbytes", optarg);
            break;
        case 'f':
            if (parse_long(optarg, 1, 1L << 20, &value) != 0)
                return usage_error(prog, "bad %s '%s' (a whole number >= 1)", "-f/--stepfactor",
                                   optarg);
            opt.step_factor = (size_t)value;
            break;
        case 'n':
            if (parse_long(optarg, 1, 1L << 30, &value) != 0)
                return usage_error(prog, "bad %s '%s' (>= 1)", "-n/--iters", optarg);
            opt.iters = (int)value;
            break;
        case 'w':
            if (parse_long(optarg, 0, 1L << 30, &value) != 0)
                return usage_error(prog, "bad %s '%s' (>= 0)", "-w/--warmup_iters", optarg);
            opt.warmup_iters = (int)value;
            break;
        case 'm':
            if (parse_long(optarg, 1, 1L << 20, &value) != 0)
                return usage_error(prog, "bad %s '%s' (>= 1)", "-m/--agg_iters", optarg);
            opt.agg_iters = (int)value;
            break;
        case 'c':
            if (parse_long(optarg, 0, 1L << 20, &value) != 0)
                return usage_error(prog, "bad %s '%s' (>= 0)", "-c/--check", optarg);
            opt.check_iters = (int)value;
            break;
        case 'a':
            if (parse_long(optarg, 0, 3, &value) != 0)
                return usage_error(prog, "bad %s '%s' (0, 1, 2 or 3)", "-a/--average", optarg);
            opt.average = (int)value;
            break;
        case 'd':
            if (parse_type(optarg, &opt.type) != 0)
                return usage_error(prog, "unknown %s '%s'", "-d/--datatype", optarg);
            break;
        case 'o':
            if (parse_op(optarg, &opt.op) != 0)
                return usage_error(prog, "unknown %s '%s'", "-o/--op", optarg);
            break;
        case 'r':
            if (strcasecmp(optarg, "all") == 0 || strcmp(optarg, "-1") == 0)
                opt.root = PERF_ALL;
            else if (parse_long(optarg, 0, 1L << 20, &value) != 0)
                return usage_error(prog, "bad %s '%s' (a rank or all)", "-r/--root", optarg);
            else
                opt.root = (int)value;
            break;
        case 't':
            if (parse_long(optarg, 1, 1024, &value) != 0)
                return usage_error(prog, "bad %s '%s' (1 to 1024)", "-t/--nthreads", optarg);
            opt.threads = (int)value;
            break;
        case 'g':
            if (strcmp(optarg, "1") != 0)
                return usage_error(prog, "%s '%s': one GPU per rank; use -t, --np or a launcher",
                                   "-g/--ngpus", optarg);
            break;
        case 'z':
        case 'y':
            if (strcmp(optarg, "0") != 0 && strcmp(optarg, "1") != 0)
                return usage_error(prog, "bad %s '%s' (0 or 1)",
                                   c == 'z' ? "-z/--blocking" : "-y/--stream_null", optarg);
            break;
        case 'R':
            if (strcmp(optarg, "0") != 0 && strcmp(optarg, "1") != 0)
                return usage_error(prog, "bad %s '%s' (0 or 1; no symmetric registration)",
                                   "-R/--local_register", optarg);
            opt.local_register = optarg[0] == '1';
            break;
        case 'G':
            if (strcmp(optarg, "0") != 0)
                return usage_error(prog, "%s '%s': conflux-perf does not capture CUDA graphs",
                                   "-G/--cudagraph", optarg);
            break;
        case OPT_NP:
            if (parse_long(optarg, 1, 1024, &value) != 0)
                return usage_error(prog, "bad %s '%s' (1 to 1024)", "--np", optarg);
            opt.np = (int)value;
            break;
        case OPT_MEM: {
            int found = 0;
            for (int m = 0; m < (int)(sizeof(mem_names) / sizeof(mem_names[0])); m++)
                if (strcasecmp(optarg, mem_names[m]) == 0) {
                    opt.mem = (enum perf_mem)m;
                    found = 1;
                }
            if (!found)
                return usage_error(prog, "bad %s '%s' (host, device or auto)", "--mem", optarg);
            if (opt.mem == PERF_MEM_DEVICE && !perf_gpu_built())
                return usage_error(prog,
                                   "--mem device: this conflux-perf was built without CUDA (CMake "
                                   "found no CUDA toolkit); use --mem host");
            break;
        }
        case OPT_JSON:
            if (optarg[0] == '\0')
                return usage_error(prog, "--json needs a file name");
            opt.json_path = optarg;
            break;
        case 'h': *help_p = 1; return PERF_EXIT_OK;
        case ':': return usage_error(prog, "option '%s' needs a value", sub_argv[optind - 1]);
        default: return usage_error(prog, "unknown option '%s'", sub_argv[optind - 1]);
        }
    }
    if (optind < sub_argc)
        return usage_error(prog, "unexpected argument '%s'", sub_argv[optind]);
    if (opt.threads > 1 && opt.np > 0)
        return usage_error(prog,
                           "-t %d and --np %d: ranks are either threads of this process "
                           "or processes, not both",
                           opt.threads, opt.np);
    if (opt.min_bytes > opt.max_bytes)
        return usage_error(prog, "%s is larger than %s", "-b/--minbytes", "-e/--maxbytes");
    if (opt.step_factor <= 1 && opt.step_bytes == 0 && opt.min_bytes < opt.max_bytes)
        return usage_error(prog, "%s is 0 and %s is 1: the sweep would never end", "-i/--stepbytes",
                           "-f/--stepfactor");
    if (opt.step_factor > 1 && opt.min_bytes == 0 && opt.max_bytes > 0)
        return usage_error(prog, "%s is 0 with %s > 1: the sweep would never grow", "-b/--minbytes",
                           "-f/--stepfactor");
    *opt_p = opt;
    return PERF_EXIT_OK;
}
