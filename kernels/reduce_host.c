/*
 * Host reductions: the portable kernels (plain C loops over reduce_ops.h,
 * shaped so the compiler can auto-vectorize them) and the dispatch to the
 * AVX2 / AVX-512 tables, chosen once from the CPU's features.
 *
 * Elements are loaded and stored with memcpy, so any alignment is fine (a
 * typed access to a misaligned pointer is undefined, and an auto-vectorized
 * loop may assume natural alignment). Each kernel picks a loop by aliasing:
 * with dst distinct from both sources every pointer is restrict, which is
 * what lets the compiler vectorize; dst == src_a (the common in-place case)
 * and dst == src_b have their own restrict loops; all three equal takes a
 * plain loop.
 */
#include "kernels/reduce.h"

#include <assert.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "kernels/reduce_isa.h"
#include "kernels/reduce_ops.h"

/* ------------------------------------------------------ portable kernels */

/* Element i of type T at byte pointer p. */
#define LOAD_(T, p, i, out)  memcpy(&(out), (p) + (i) * sizeof(T), sizeof(T))
#define STORE_(T, p, i, val) memcpy((p) + (i) * sizeof(T), &(val), sizeof(T))

/* for i < n: D[i] = cfx_<op>_<name>(A[i], B[i]) */
#define REDUCE_LOOP_(name, T, op, D, A, B, n)                                                      \
    for (size_t i = 0; i < (n); i++) {                                                             \
        T x_, y_, r_;                                                                              \
        LOAD_(T, A, i, x_);                                                                        \
        LOAD_(T, B, i, y_);                                                                        \
        r_ = cfx_##op##_##name(x_, y_);                                                            \
        STORE_(T, D, i, r_);                                                                       \
    }

#define PORTABLE_KERNEL(name, T, op)                                                               \
    static void op##_##name##_apart(unsigned char *restrict d, const unsigned char *restrict a,    \
                                    const unsigned char *restrict b, size_t n)                     \
    {                                                                                              \
        REDUCE_LOOP_(name, T, op, d, a, b, n)                                                      \
    }                                                                                              \
    static void op##_##name##_into_a(unsigned char *restrict d, const unsigned char *restrict b,   \
                                     size_t n)                                                     \
    {                                                                                              \
        REDUCE_LOOP_(name, T, op, d, d, b, n)                                                      \
    }                                                                                              \
    static void op##_##name##_into_b(const unsigned char *restrict a, unsigned char *restrict d,   \
                                     size_t n)                                                     \
    {                                                                                              \
        REDUCE_LOOP_(name, T, op, d, a, d, n)                                                      \
    }                                                                                              \
    static void op##_##name##_self(unsigned char *d, size_t n)                                     \
    {                                                                                              \
        REDUCE_LOOP_(name, T, op, d, d, d, n)                                                      \
    }                                                                                              \
    static void op##_##name(void *dst, const void *src_a, const void *src_b, size_t count)         \
    {                                                                                              \
        unsigned char *d = dst;                                                                    \
        const unsigned char *a = src_a, *b = src_b;                                                \
        if (d != a && d != b)                                                                      \
            op##_##name##_apart(d, a, b, count);                                                   \
        else if (d != b)                                                                           \
            op##_##name##_into_a(d, b, count);                                                     \
        else if (d != a)                                                                           \
            op##_##name##_into_b(a, d, count);                                                     \
        else                                                                                       \
            op##_##name##_self(d, count);                                                          \
    }

/* for i < n: D[i] = cfx_avg_finish_<name>(S[i], nranks) */
#define FINISH_LOOP_(name, T, D, S, n, nranks)                                                     \
    for (size_t i = 0; i < (n); i++) {                                                             \
        T x_;                                                                                      \
        LOAD_(T, S, i, x_);                                                                        \
        x_ = cfx_avg_finish_##name(x_, nranks);                                                    \
        STORE_(T, D, i, x_);                                                                       \
    }

#define FINISH_KERNEL(name, T)                                                                     \
    static void finish_##name##_apart(unsigned char *restrict d, const unsigned char *restrict s,  \
                                      size_t n, int nranks)                                        \
    {                                                                                              \
        FINISH_LOOP_(name, T, d, s, n, nranks)                                                     \
    }                                                                                              \
    static void finish_##name##_self(unsigned char *d, size_t n, int nranks)                       \
    {                                                                                              \
        FINISH_LOOP_(name, T, d, d, n, nranks)                                                     \
    }                                                                                              \
    static void finish_##name(void *dst, const void *src, size_t count, int nranks)                \
    {                                                                                              \
        if (dst == src)                                                                            \
            finish_##name##_self(dst, count, nranks);                                              \
        else                                                                                       \
            finish_##name##_apart(dst, src, count, nranks);                                        \
    }

#define PORTABLE_TYPE(e, name, T)                                                                  \
    PORTABLE_KERNEL(name, T, sum)                                                                  \
    PORTABLE_KERNEL(name, T, prod)                                                                 \
    PORTABLE_KERNEL(name, T, max)                                                                  \
    PORTABLE_KERNEL(name, T, min)                                                                  \
    FINISH_KERNEL(name, T)
CFX_REDUCE_FOR_EACH_TYPE(PORTABLE_TYPE)
#undef PORTABLE_TYPE

#define PORTABLE_ROW(e, name, T) [e] = {sum_##name, prod_##name, max_##name, min_##name},
static const cfx_reduce_kernel_table portable_kernels = {CFX_REDUCE_FOR_EACH_TYPE(PORTABLE_ROW)};
#undef PORTABLE_ROW

typedef void (*finish_kernel_fn)(void *dst, const void *src, size_t count, int nranks);

#define FINISH_ROW(e, name, T) [e] = finish_##name,
static const finish_kernel_fn finish_kernels[cfxNumTypes] = {CFX_REDUCE_FOR_EACH_TYPE(FINISH_ROW)};
#undef FINISH_ROW

/* ------------------------------------------------------------- dispatch */

size_t cfx_type_size(cfxDataType_t type)
{
    switch (type) {
#define TYPE_SIZE(e, name, T)                                                                      \
    case e: return sizeof(T);
        CFX_REDUCE_FOR_EACH_TYPE(TYPE_SIZE)
#undef TYPE_SIZE
    default: return 0;
    }
}

#if defined(__x86_64__)
/* F16C (CPUID.1:ECX bit 29); not every compiler's __builtin_cpu_supports knows
 * it. Its OS support (YMM state) comes with AVX2's, which libgcc checks. */
static int cpu_has_f16c(void)
{
    unsigned int eax, ebx, ecx, edx;

    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}
#endif

int cfx_reduce_isa_supported(enum cfx_reduce_isa isa)
{
    switch (isa) {
    case CFX_REDUCE_ISA_PORTABLE: return 1;
#if defined(__x86_64__)
    /* libgcc's checks include the OS's XSAVE support for the wider registers. */
    case CFX_REDUCE_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case CFX_REDUCE_ISA_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") &&
               __builtin_cpu_supports("fma") && cpu_has_f16c();
#endif
    default: return 0;
    }
}

const char *cfx_reduce_isa_name(enum cfx_reduce_isa isa)
{
    switch (isa) {
    case CFX_REDUCE_ISA_PORTABLE: return "portable";
    case CFX_REDUCE_ISA_AVX2: return "avx2";
    case CFX_REDUCE_ISA_AVX512: return "avx512";
    default: return "unknown";
    }
}

enum cfx_reduce_isa cfx_reduce_isa_selected(void)
{
    /* Detection is idempotent, so racing first callers store the same value. */
    static atomic_int selected = -1;
    int isa = atomic_load_explicit(&selected, memory_order_relaxed);

    if (isa < 0) {
        isa = CFX_REDUCE_ISA_COUNT - 1;
        while (isa > CFX_REDUCE_ISA_PORTABLE && !cfx_reduce_isa_supported(isa))
            isa--;
        atomic_store_explicit(&selected, isa, memory_order_relaxed);
    }
    return (enum cfx_reduce_isa)isa;
}

static enum cfx_reduce_op_col op_col(cfxRedOp_t op)
{
    switch (op) {
    case cfxProd: return CFX_REDUCE_COL_PROD;
    case cfxMax: return CFX_REDUCE_COL_MAX;
    case cfxMin: return CFX_REDUCE_COL_MIN;
    /* cfxSum, and cfxAvg, which reduces as Sum */
    default: return CFX_REDUCE_COL_SUM;
    }
}

/* The table entry of isa for (type, col); NULL where the path has none. */
static cfx_reduce_kernel_fn isa_kernel(enum cfx_reduce_isa isa, cfxDataType_t type,
                                       enum cfx_reduce_op_col col)
{
    switch (isa) {
    case CFX_REDUCE_ISA_PORTABLE: return portable_kernels[type][col];
#if defined(__x86_64__)
    case CFX_REDUCE_ISA_AVX2: return cfx_reduce_avx2_kernels[type][col];
    case CFX_REDUCE_ISA_AVX512: return cfx_reduce_avx512_kernels[type][col];
#endif
    default: return NULL;
    }
}

int cfx_reduce_isa_has_kernel(enum cfx_reduce_isa isa, cfxDataType_t type, cfxRedOp_t op)
{
    if ((unsigned)type >= cfxNumTypes || (unsigned)op >= cfxNumOps)
        return 0;
    return isa_kernel(isa, type, op_col(op)) != NULL;
}

void cfx_reduce_host_isa(enum cfx_reduce_isa isa, void *dst, const void *src_a, const void *src_b,
                         size_t count, cfxDataType_t type, cfxRedOp_t op)
{
    enum cfx_reduce_op_col col = op_col(op);
    cfx_reduce_kernel_fn kernel;

    assert((unsigned)type < cfxNumTypes && (unsigned)op < cfxNumOps);
    assert(cfx_reduce_isa_supported(isa));
    kernel = isa_kernel(isa, type, col);
    if (kernel == NULL)
        kernel = portable_kernels[type][col];
    kernel(dst, src_a, src_b, count);
}

void cfx_reduce_host(void *dst, const void *src_a, const void *src_b, size_t count,
                     cfxDataType_t type, cfxRedOp_t op)
{
    cfx_reduce_host_isa(cfx_reduce_isa_selected(), dst, src_a, src_b, count, type, op);
}

void cfx_reduce_avg_finish(void *dst, const void *src, size_t count, cfxDataType_t type, int nranks)
{
    assert((unsigned)type < cfxNumTypes && nranks > 0);
    finish_kernels[type](dst, src, count, nranks);
}
