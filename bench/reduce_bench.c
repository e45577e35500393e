/*
 * cfx_reduce_bench: throughput of the host reduction kernels, per data type,
 * op and instruction-set path, next to memcpy on the same buffers.
 *
 *   cfx_reduce_bench [--bytes N] [--reps N]
 *
 * The three buffers (src_a, src_b, dst) are allocated and touched once before
 * any timing: on these VMs a freshly touched page costs ~12 us, which would
 * otherwise dominate the first run. Each figure is the best of --reps runs
 * (fewer for a figure whose runs already took 0.3 s: the slow scalar paths).
 * Sources hold values near 1 so float kernels never meet subnormals.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conflux.h"
#include "kernels/reduce.h"
#include "kernels/reduce_ops.h"

#define DEFAULT_BYTES   ((size_t)32 << 20)
#define DEFAULT_REPS    3
#define FIGURE_BUDGET_S 0.3

static const char *const type_names[cfxNumTypes] = {"int8",    "uint8",    "int32",   "uint32",
                                                    "int64",   "uint64",   "float16", "float32",
                                                    "float64", "bfloat16", "fp8e4m3", "fp8e5m2"};
static const char *const op_names[] = {"sum", "prod", "max", "min"};
static const cfxRedOp_t ops[] = {cfxSum, cfxProd, cfxMax, cfxMin};
#define N_OPS (sizeof(ops) / sizeof(ops[0]))

struct bench_buffers {
    unsigned char *src_a;
    unsigned char *src_b;
    unsigned char *dst;
    size_t bytes;
};

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* xorshift64: reproducible filler. */
static uint64_t next_random(uint64_t *state)
{
    uint64_t x = *state;

    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return x;
}

/* Fill @p buf with @p count elements of @p type: random integers, floats in [1, 2). */
static void fill(unsigned char *buf, size_t count, cfxDataType_t type, uint64_t seed)
{
    size_t size = cfx_type_size(type);
    uint64_t state = seed | 1;

    for (size_t i = 0; i < count; i++) {
        uint64_t r = next_random(&state);
        float f = 1.0f + (float)(r >> 40) * 0x1p-24f;
        double d = 1.0 + (double)(r >> 11) * 0x1p-53;
        uint16_t h;
        uint8_t q;

        switch (type) {
        case cfxFloat16:
            h = cfx_f32_to_f16(f);
            memcpy(buf + i * size, &h, size);
            break;
        case cfxBfloat16:
            h = cfx_f32_to_bf16(f);
            memcpy(buf + i * size, &h, size);
            break;
        case cfxFloat8e4m3:
            q = cfx_f32_to_e4m3(f);
            memcpy(buf + i * size, &q, size);
            break;
        case cfxFloat8e5m2:
            q = cfx_f32_to_e5m2(f);
            memcpy(buf + i * size, &q, size);
            break;
        case cfxFloat32: memcpy(buf + i * size, &f, size); break;
        case cfxFloat64: memcpy(buf + i * size, &d, size); break;
        default: memcpy(buf + i * size, &r, size); break;
        }
    }
}

/* Best time of up to @p reps runs of one reduction over the whole buffers,
 * stopping early once a figure has taken FIGURE_BUDGET_S (slow scalar paths). */
static double time_reduce(const struct bench_buffers *bufs, enum cfx_reduce_isa isa,
                          cfxDataType_t type, cfxRedOp_t op, int reps)
{
    size_t count = bufs->bytes / cfx_type_size(type);
    double best = 1e30;

    double spent = 0;

    for (int rep = 0; rep < reps && spent < FIGURE_BUDGET_S; rep++) {
        double t0 = now_s();
        cfx_reduce_host_isa(isa, bufs->dst, bufs->src_a, bufs->src_b, count, type, op);
        double t = now_s() - t0;
        if (t < best)
            best = t;
        spent += t;
    }
    return best;
}

static double time_memcpy(const struct bench_buffers *bufs, int reps)
{
    double best = 1e30;

    for (int rep = 0; rep < reps; rep++) {
        double t0 = now_s();
        memcpy(bufs->dst, bufs->src_a, bufs->bytes);
        double t = now_s() - t0;
        if (t < best)
            best = t;
    }
    /* Keep the copy observable. */
    if (bufs->dst[bufs->bytes / 2] != bufs->src_a[bufs->bytes / 2])
        abort();
    return best;
}

static int parse_size(const char *text, size_t *value_p)
{
    char *end;
    unsigned long long v;

    errno = 0;
    v = strtoull(text, &end, 0);
    if (errno != 0 || end == text)
        return -1;
    if (*end == 'K' || *end == 'k')
        v <<= 10, end++;
    else if (*end == 'M' || *end == 'm')
        v <<= 20, end++;
    else if (*end == 'G' || *end == 'g')
        v <<= 30, end++;
    if (*end != '\0' || v == 0)
        return -1;
    *value_p = (size_t)v;
    return 0;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: cfx_reduce_bench [--bytes N[K|M|G]] [--reps N]\n"
            "  --bytes  size of each of the three buffers (default 32M)\n"
            "  --reps   runs per figure, best one kept (default %d)\n",
            DEFAULT_REPS);
}

int main(int argc, char **argv)
{
    struct bench_buffers bufs = {.bytes = DEFAULT_BYTES};
    size_t reps_arg = DEFAULT_REPS;
    int reps;
    int supported[CFX_REDUCE_ISA_COUNT];
    double memcpy_gbs;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--bytes") == 0 && i + 1 < argc) {
            if (parse_size(argv[++i], &bufs.bytes) != 0) {
                usage(stderr);
                return 2;
            }
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            if (parse_size(argv[++i], &reps_arg) != 0 || reps_arg > 1000) {
                usage(stderr);
                return 2;
            }
        } else {
            usage(strcmp(argv[i], "--help") == 0 ? stdout : stderr);
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }
    reps = (int)reps_arg;
    bufs.bytes &= ~(size_t)7; /* a whole number of elements of every type */
    if (bufs.bytes == 0) {
        usage(stderr);
        return 2;
    }

    bufs.src_a = aligned_alloc(64, bufs.bytes);
    bufs.src_b = aligned_alloc(64, bufs.bytes);
    bufs.dst = aligned_alloc(64, bufs.bytes);
    if (bufs.src_a == NULL || bufs.src_b == NULL || bufs.dst == NULL) {
        fprintf(stderr, "cfx_reduce_bench: cannot allocate 3 x %zu bytes\n", bufs.bytes);
        return 1;
    }
    memset(bufs.src_a, 1, bufs.bytes);
    memset(bufs.src_b, 2, bufs.bytes);
    memset(bufs.dst, 0, bufs.bytes);

    for (int isa = 0; isa < CFX_REDUCE_ISA_COUNT; isa++)
        supported[isa] = cfx_reduce_isa_supported(isa);
    memcpy_gbs = 2.0 * (double)bufs.bytes / time_memcpy(&bufs, reps + 2) / 1e9;

    printf("# cfx_reduce_bench: dst = src_a op src_b on the host, %zu-byte buffers, best of %d "
           "runs (fewer past %.1f s)\n",
           bufs.bytes, reps, FIGURE_BUDGET_S);
    printf("# GB/s = (bytes read + bytes written) / s, 1 GB = 1e9 B: a reduction moves 3 x "
           "buffer (src_a, src_b, dst), memcpy 2 x buffer (src, dst)\n");
    printf("# paths:");
    for (int isa = 0; isa < CFX_REDUCE_ISA_COUNT; isa++)
        printf(" %s%s", cfx_reduce_isa_name(isa),
               supported[isa] ? "" : " (not supported by this CPU/build)");
    printf("; cfx_reduce_host uses %s\n", cfx_reduce_isa_name(cfx_reduce_isa_selected()));
    printf("# \"=p\": the path has no kernel of its own and runs the portable one. "
           "avg reduces as sum.\n");
    printf("%-9s %-5s", "type", "op");
    for (int isa = 0; isa < CFX_REDUCE_ISA_COUNT; isa++)
        printf(" %10s", cfx_reduce_isa_name(isa));
    printf(" %10s\n", "memcpy");

    for (int t = 0; t < cfxNumTypes; t++) {
        cfxDataType_t type = (cfxDataType_t)t;
        size_t count = bufs.bytes / cfx_type_size(type);

        fill(bufs.src_a, count, type, 0x9e3779b97f4a7c15ull);
        fill(bufs.src_b, count, type, 0xd1b54a32d192ed03ull);
        for (size_t o = 0; o < N_OPS; o++) {
            double portable_gbs = 0;

            printf("%-9s %-5s", type_names[t], op_names[o]);
            for (int isa = 0; isa < CFX_REDUCE_ISA_COUNT; isa++) {
                double gbs;

                if (!supported[isa]) {
                    printf(" %10s", "-");
                    continue;
                }
                if (isa != CFX_REDUCE_ISA_PORTABLE &&
                    !cfx_reduce_isa_has_kernel(isa, type, ops[o])) {
                    printf(" %7.2f =p", portable_gbs);
                    continue;
                }
                gbs = 3.0 * (double)bufs.bytes / time_reduce(&bufs, isa, type, ops[o], reps) / 1e9;
                if (isa == CFX_REDUCE_ISA_PORTABLE)
                    portable_gbs = gbs;
                printf(" %10.2f", gbs);
            }
            printf(" %10.2f\n", memcpy_gbs);
            fflush(stdout);
        }
    }

    free(bufs.dst);
    free(bufs.src_b);
    free(bufs.src_a);
    return 0;
}
