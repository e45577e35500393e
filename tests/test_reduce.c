/*
 * Reduction kernels (kernels/reduce.h, kernels/reduce_cuda.h) against an
 * independent scalar reference written here, not taken from reduce_ops.h:
 * integers in 64-bit arithmetic truncated to the width; float16 through the
 * compiler's _Float16; bfloat16 and float8 decoded from their bit fields with
 * ldexp and encoded by searching for the nearest representable value (ties to
 * the even code). Sums and products of two narrow values are computed in
 * double, where they are exact (or, for bfloat16, rounded harmlessly: 53 >=
 * 2 * 8 + 2 bits), then rounded once.
 *
 * Every host path runs every test: portable, avx2, avx512. A path this CPU
 * lacks is a printed skip. Value tables are replicated over 67 elements so
 * they cross whole vectors (up to 64 lanes) and a scalar tail.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cfx_build_config.h"
#include "conflux.h"
#include "kernels/reduce.h"
#include "kernels/reduce_cuda.h"
#include "kernels/reduce_ops.h"

/* ================================================================ types */

enum kind { K_INT, K_UINT, K_F16, K_F32, K_F64, K_BF16, K_E4M3, K_E5M2 };

struct type_info {
    cfxDataType_t type;
    const char *name;
    size_t size;
    enum kind kind;
    const uint64_t *specials; /* bit patterns mixed into random data */
    size_t n_specials;
};

static const uint64_t f16_specials[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400,
                                        0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e00, 0x7c01,
                                        0xffff, 0x3c00, 0xbc00, 0x3555, 0x7bfe, 0x0200};
static const uint64_t bf16_specials[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x0080,
                                         0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x7fc0, 0x7f81,
                                         0xffff, 0x3f80, 0xbf80, 0x3eab, 0x7f7e};
static const uint64_t e4m3_specials[] = {0x00, 0x80, 0x01, 0x81, 0x07, 0x08, 0x7e, 0xfe,
                                         0x7f, 0xff, 0x38, 0xb8, 0x77, 0x7d, 0x70};
static const uint64_t e5m2_specials[] = {0x00, 0x80, 0x01, 0x81, 0x03, 0x04, 0x7b, 0xfb,
                                         0x7c, 0xfc, 0x7d, 0x7e, 0x7f, 0xff, 0x3c, 0x78};
static const uint64_t f32_specials[] = {
    0x00000000, 0x80000000, 0x3f800000, 0xbf800000, 0x00000001, 0x80000001, 0x007fffff, 0x00800000,
    0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0xffc00000, 0x3fc00000};
static const uint64_t f64_specials[] = {0x0000000000000000, 0x8000000000000000, 0x3ff0000000000000,
                                        0xbff0000000000000, 0x0000000000000001, 0x000fffffffffffff,
                                        0x0010000000000000, 0x7fefffffffffffff, 0xffefffffffffffff,
                                        0x7ff0000000000000, 0xfff0000000000000, 0x7ff8000000000000,
                                        0x7ff0000000000001, 0xfff8000000000000};
static const uint64_t int_specials[] = {0,
                                        1,
                                        2,
                                        0x7f,
                                        0x80,
                                        0xff,
                                        0x7fffffff,
                                        0x80000000,
                                        0xffffffff,
                                        0x7fffffffffffffff,
                                        0x8000000000000000,
                                        0xffffffffffffffff};

#define SPECIALS(a) a, sizeof(a) / sizeof(a[0])

static const struct type_info types[cfxNumTypes] = {
    {cfxInt8, "int8", 1, K_INT, SPECIALS(int_specials)},
    {cfxUint8, "uint8", 1, K_UINT, SPECIALS(int_specials)},
    {cfxInt32, "int32", 4, K_INT, SPECIALS(int_specials)},
    {cfxUint32, "uint32", 4, K_UINT, SPECIALS(int_specials)},
    {cfxInt64, "int64", 8, K_INT, SPECIALS(int_specials)},
    {cfxUint64, "uint64", 8, K_UINT, SPECIALS(int_specials)},
    {cfxFloat16, "float16", 2, K_F16, SPECIALS(f16_specials)},
    {cfxFloat32, "float32", 4, K_F32, SPECIALS(f32_specials)},
    {cfxFloat64, "float64", 8, K_F64, SPECIALS(f64_specials)},
    {cfxBfloat16, "bfloat16", 2, K_BF16, SPECIALS(bf16_specials)},
    {cfxFloat8e4m3, "float8e4m3", 1, K_E4M3, SPECIALS(e4m3_specials)},
    {cfxFloat8e5m2, "float8e5m2", 1, K_E5M2, SPECIALS(e5m2_specials)},
};

static const cfxRedOp_t all_ops[] = {cfxSum, cfxProd, cfxMax, cfxMin, cfxAvg};
static const char *const op_names[] = {"sum", "prod", "max", "min", "avg"};
#define N_OPS (sizeof(all_ops) / sizeof(all_ops[0]))

static const struct type_info *type_info_of(cfxDataType_t type)
{
    return &types[type];
}

/* ========================================================== bits helpers */

static uint64_t load_bits(const unsigned char *p, size_t size)
{
    uint64_t v = 0;

    memcpy(&v, p, size); /* little endian: the low bytes */
    return v;
}

static void store_bits(unsigned char *p, uint64_t v, size_t size)
{
    memcpy(p, &v, size);
}

static int64_t sign_extend(uint64_t v, size_t size)
{
    unsigned shift = (unsigned)(64 - 8 * size);

    return (int64_t)(v << shift) >> shift;
}

static float f32_of(uint32_t bits)
{
    float f;

    memcpy(&f, &bits, sizeof(f));
    return f;
}

static uint32_t bits_of_f32(float f)
{
    uint32_t u;

    memcpy(&u, &f, sizeof(u));
    return u;
}

static double f64_of(uint64_t bits)
{
    double d;

    memcpy(&d, &bits, sizeof(d));
    return d;
}

static uint64_t bits_of_f64(double d)
{
    uint64_t u;

    memcpy(&u, &d, sizeof(u));
    return u;
}

/* ================================================= independent reference */

/* IEEE 754-2019 maximumNumber / minimumNumber, with -0 < +0. */
static double ref_max_min(double a, double b, int is_max)
{
    if (isnan(a))
        return b;
    if (isnan(b))
        return a;
    if (a == 0 && b == 0) {
        int neg = is_max ? (signbit(a) && signbit(b)) : (signbit(a) || signbit(b));
        return neg ? -0.0 : 0.0;
    }
    if (is_max)
        return a > b ? a : b;
    return a < b ? a : b;
}

/*
 * Magnitude codes 0..top of a format, increasing in value; code top is
 * infinity, which rounds as if it were overflow_value (2^(emax+1)). Returns
 * the code nearest to m >= 0 (ties to the even code).
 */
static uint32_t ref_round_to_code(double m, double (*value)(uint32_t), uint32_t top,
                                  double overflow_value)
{
    uint32_t lo = 0, hi = top, c, next;
    double v_lo, v_next;

    if (m >= overflow_value)
        return top;
    /* Largest code c with value(c) <= m. */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        if (mid != top && value(mid) <= m)
            lo = mid;
        else
            hi = mid - 1;
    }
    c = lo;
    v_lo = value(c);
    if (v_lo == m)
        return c;
    next = c + 1;
    v_next = next == top ? overflow_value : value(next);
    if (m - v_lo < v_next - m)
        return c;
    if (v_next - m < m - v_lo)
        return next;
    return (c & 1) ? next : c;
}

/* bfloat16: the top half of a float32. */
static double ref_bf16_value(uint32_t code)
{
    return (double)f32_of(code << 16);
}

static uint16_t ref_bf16_encode(double v)
{
    if (isnan(v))
        return 0x7fff;
    return (uint16_t)((signbit(v) ? 0x8000u : 0u) |
                      ref_round_to_code(fabs(v), ref_bf16_value, 0x7f80, ldexp(1, 128)));
}

static double ref_bf16_decode(uint16_t bits)
{
    return (double)f32_of((uint32_t)bits << 16);
}

#if defined(__FLT16_MAX__)
/* float16 through the compiler's own _Float16 conversions. */
static double ref_f16_decode(uint16_t bits)
{
    _Float16 h;

    memcpy(&h, &bits, sizeof(h));
    return (double)h;
}

static uint16_t ref_f16_encode(double v)
{
    _Float16 h = (_Float16)v;
    uint16_t bits;

    if (isnan(v))
        return 0x7fff;
    memcpy(&bits, &h, sizeof(bits));
    return bits;
}
#else
/* No _Float16 in this compiler: bit fields and the nearest-code search. */
static double ref_f16_decode(uint16_t bits)
{
    int e = (bits >> 10) & 31, m = bits & 1023;
    double mag = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);

    return (bits & 0x8000) ? -mag : mag;
}

static double ref_f16_value(uint32_t code)
{
    return ref_f16_decode((uint16_t)code);
}

static uint16_t ref_f16_encode(double v)
{
    if (isnan(v))
        return 0x7fff;
    return (uint16_t)((signbit(v) ? 0x8000u : 0u) |
                      ref_round_to_code(fabs(v), ref_f16_value, 0x7c00, 65536.0));
}
#endif

/* float8 from its bit fields. e4m3: bias 7, no infinity, S.1111.111 is NaN.
 * e5m2: bias 15, IEEE-style infinities and NaNs. */
static double ref_fp8_decode_fields(uint8_t bits, int e5m2)
{
    int e, m;
    double mag;

    if (e5m2) {
        e = (bits >> 2) & 31;
        m = bits & 3;
        if (e == 31)
            mag = m ? NAN : INFINITY;
        else
            mag = e == 0 ? ldexp(m, -16) : ldexp(4 + m, e - 17);
    } else {
        e = (bits >> 3) & 15;
        m = bits & 7;
        if (e == 15 && m == 7)
            mag = NAN;
        else
            mag = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    }
    return (bits & 0x80) ? -mag : mag;
}

static double fp8_table[2][256];

static void fp8_table_init(void)
{
    for (int f = 0; f < 2; f++)
        for (int c = 0; c < 256; c++)
            fp8_table[f][c] = ref_fp8_decode_fields((uint8_t)c, f);
}

static double ref_fp8_decode(uint8_t bits, int e5m2)
{
    if (fp8_table[0][0x38] == 0) /* 0x38 is 1.0 in e4m3 */
        fp8_table_init();
    return fp8_table[e5m2][bits];
}

/*
 * Round to float8 as NCCL does (CUDA's __NV_SATFINITE): nearest finite value,
 * ties to the even code; beyond the largest finite value (infinity included)
 * saturate to it; NaN gives the canonical 0x7f.
 */
static uint8_t ref_fp8_encode(double v, int e5m2)
{
    uint8_t max_code = e5m2 ? 0x7b : 0x7e;
    uint8_t sign = signbit(v) ? 0x80 : 0;
    double m = fabs(v), best_d = INFINITY;
    uint8_t best = 0;

    if (isnan(v))
        return 0x7f;
    if (m > ref_fp8_decode(max_code, e5m2))
        return sign | max_code;
    for (unsigned c = 0; c <= max_code; c++) {
        double d = fabs(ref_fp8_decode((uint8_t)c, e5m2) - m);
        if (d < best_d || (d == best_d && (c & 1) == 0)) {
            best = (uint8_t)c;
            best_d = d;
        }
    }
    return sign | best;
}

/* Value of one element as a double (floats only). */
static double ref_decode(const struct type_info *t, uint64_t bits)
{
    switch (t->kind) {
    case K_F16: return ref_f16_decode((uint16_t)bits);
    case K_BF16: return ref_bf16_decode((uint16_t)bits);
    case K_E4M3: return ref_fp8_decode((uint8_t)bits, 0);
    case K_E5M2: return ref_fp8_decode((uint8_t)bits, 1);
    case K_F32: return (double)f32_of((uint32_t)bits);
    default: return f64_of(bits);
    }
}

/* Round a double to the float type @p t (one rounding). */
static uint64_t ref_encode(const struct type_info *t, double v)
{
    switch (t->kind) {
    case K_F16: return ref_f16_encode(v);
    case K_BF16: return ref_bf16_encode(v);
    case K_E4M3: return ref_fp8_encode(v, 0);
    case K_E5M2: return ref_fp8_encode(v, 1);
    case K_F32: return bits_of_f32((float)v);
    default: return bits_of_f64(v);
    }
}

/* want = a op b for one element (Avg reduces as Sum). */
static uint64_t ref_reduce(const struct type_info *t, cfxRedOp_t op, uint64_t a, uint64_t b)
{
    if (t->kind == K_INT || t->kind == K_UINT) {
        int is_signed = t->kind == K_INT;
        int64_t sa = sign_extend(a, t->size), sb = sign_extend(b, t->size);
        uint64_t mask = t->size == 8 ? ~0ull : (1ull << (8 * t->size)) - 1;
        switch (op) {
        case cfxProd: return (a * b) & mask;
        case cfxMax: return is_signed ? (sa > sb ? a : b) : (a > b ? a : b);
        case cfxMin: return is_signed ? (sa < sb ? a : b) : (a < b ? a : b);
        default: return (a + b) & mask;
        }
    }
    if (t->kind == K_F32) {
        /* The definition itself: one float32 operation. */
        float x = f32_of((uint32_t)a), y = f32_of((uint32_t)b);
        switch (op) {
        case cfxProd: return bits_of_f32(x * y);
        case cfxMax:
        case cfxMin: return bits_of_f32((float)ref_max_min(x, y, op == cfxMax));
        default: return bits_of_f32(x + y);
        }
    }
    if (t->kind == K_F64) {
        double x = f64_of(a), y = f64_of(b);
        switch (op) {
        case cfxProd: return bits_of_f64(x * y);
        case cfxMax:
        case cfxMin: return bits_of_f64(ref_max_min(x, y, op == cfxMax));
        default: return bits_of_f64(x + y);
        }
    }
    {
        double x = ref_decode(t, a), y = ref_decode(t, b);
        switch (op) {
        case cfxProd: return ref_encode(t, x * y);
        case cfxMax:
        case cfxMin: return ref_encode(t, ref_max_min(x, y, op == cfxMax));
        default: return ref_encode(t, x + y);
        }
    }
}

/* want = x / nranks: integers truncate toward zero, floats round once. */
static uint64_t ref_avg_finish(const struct type_info *t, uint64_t x, int nranks)
{
    uint64_t mask = t->size == 8 ? ~0ull : (1ull << (8 * t->size)) - 1;

    switch (t->kind) {
    case K_INT: {
        __int128 v = sign_extend(x, t->size);
        __int128 q = (v < 0 ? -((-v) / nranks) : v / nranks);
        return (uint64_t)q & mask;
    }
    case K_UINT: return x / (uint64_t)nranks;
    case K_F64: return bits_of_f64(f64_of(x) / nranks);
    default:
        /* Quotient in double, then one rounding (harmless for float32 too). */
        return ref_encode(t, ref_decode(t, x) / nranks);
    }
}

/* Equal results: same bits, except any NaN equals any NaN for float32/64
 * (their NaN payloads are the hardware's). */
static int same_result(const struct type_info *t, uint64_t got, uint64_t want)
{
    if (t->kind == K_F32 && isnan(f32_of((uint32_t)got)) && isnan(f32_of((uint32_t)want)))
        return 1;
    if (t->kind == K_F64 && isnan(f64_of(got)) && isnan(f64_of(want)))
        return 1;
    return got == want;
}

/* ====================================================== test machinery */

static uint64_t rng_state = 0x853c49e6748fea9bull;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;

    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng_state = x;
    return x;
}

/* Random bits, a quarter of them the type's special values. */
static void fill_random(const struct type_info *t, unsigned char *p, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        uint64_t r = rnd();
        uint64_t v = (r & 3) == 0 ? t->specials[(r >> 8) % t->n_specials] : rnd();
        store_bits(p + i * t->size, v, t->size);
    }
}

/* Run @p body on @p isa, or skip with the reason when this CPU lacks it. */
static void run_on_path(enum cfx_reduce_isa isa, void (*body)(enum cfx_reduce_isa))
{
    if (!cfx_reduce_isa_supported(isa))
        cr_skip_test("the %s path is not supported by this CPU (or not built for this "
                     "architecture)",
                     cfx_reduce_isa_name(isa));
    body(isa);
}

/*
 * TEST_EVERY_PATH(name) { ... uses isa ... } defines the tests
 * reduce_portable::name, reduce_avx2::name and reduce_avx512::name.
 */
#define TEST_EVERY_PATH(name)                                                                      \
    static void path_test_##name(enum cfx_reduce_isa isa);                                         \
    Test(reduce_portable, name)                                                                    \
    {                                                                                              \
        run_on_path(CFX_REDUCE_ISA_PORTABLE, path_test_##name);                                    \
    }                                                                                              \
    Test(reduce_avx2, name)                                                                        \
    {                                                                                              \
        run_on_path(CFX_REDUCE_ISA_AVX2, path_test_##name);                                        \
    }                                                                                              \
    Test(reduce_avx512, name)                                                                      \
    {                                                                                              \
        run_on_path(CFX_REDUCE_ISA_AVX512, path_test_##name);                                      \
    }                                                                                              \
    static void path_test_##name(enum cfx_reduce_isa isa)

/* As TEST_EVERY_PATH, for the vector paths only: reduce_avx2::name, reduce_avx512::name. */
#define TEST_VECTOR_PATHS(name)                                                                    \
    static void path_test_##name(enum cfx_reduce_isa isa);                                         \
    Test(reduce_avx2, name)                                                                        \
    {                                                                                              \
        run_on_path(CFX_REDUCE_ISA_AVX2, path_test_##name);                                        \
    }                                                                                              \
    Test(reduce_avx512, name)                                                                      \
    {                                                                                              \
        run_on_path(CFX_REDUCE_ISA_AVX512, path_test_##name);                                      \
    }                                                                                              \
    static void path_test_##name(enum cfx_reduce_isa isa)

enum alias { ALIAS_NONE, ALIAS_DST_A, ALIAS_DST_B, ALIAS_ALL };

/* Where the operands sit: byte offsets from 64-byte aligned bases, and aliasing. */
struct layout {
    size_t a_off, b_off, d_off;
    enum alias alias;
};

#define GUARD_BYTES 64
#define CANARY      0xa5

/*
 * Run one reduction on @p isa with random operands laid out as @p lay and
 * compare every element with the reference, and the bytes around dst with
 * their canary.
 */
static void check_reduce(enum cfx_reduce_isa isa, const struct type_info *t, cfxRedOp_t op,
                         const char *op_name, size_t count, struct layout lay)
{
    size_t bytes = count * t->size;
    size_t buf_bytes = bytes + 2 * GUARD_BYTES + 64;
    unsigned char *a_buf = aligned_alloc(64, (buf_bytes + 63) / 64 * 64);
    unsigned char *b_buf = aligned_alloc(64, (buf_bytes + 63) / 64 * 64);
    unsigned char *d_buf = aligned_alloc(64, (buf_bytes + 63) / 64 * 64);
    unsigned char *d_base;
    uint64_t *want = malloc((count + 1) * sizeof(*want));
    unsigned char *a, *b, *d;

    cr_assert(a_buf && b_buf && d_buf && want, "out of memory");
    memset(a_buf, CANARY, buf_bytes);
    memset(b_buf, CANARY, buf_bytes);
    memset(d_buf, CANARY, buf_bytes);
    a = a_buf + GUARD_BYTES + lay.a_off;
    b = b_buf + GUARD_BYTES + lay.b_off;
    d = d_buf + GUARD_BYTES + lay.d_off;
    d_base = d_buf;
    fill_random(t, a, count);
    fill_random(t, b, count);
    switch (lay.alias) {
    case ALIAS_DST_A: d = a, d_base = a_buf; break;
    case ALIAS_DST_B: d = b, d_base = b_buf; break;
    case ALIAS_ALL: b = a, d = a, d_base = a_buf; break;
    default: break;
    }
    for (size_t i = 0; i < count; i++)
        want[i] = ref_reduce(t, op, load_bits(a + i * t->size, t->size),
                             load_bits(b + i * t->size, t->size));

    cfx_reduce_host_isa(isa, d, a, b, count, t->type, op);

    for (size_t i = 0; i < count; i++) {
        uint64_t got = load_bits(d + i * t->size, t->size);
        cr_assert(same_result(t, got, want[i]),
                  "%s %s %s, count %zu, offsets a+%zu b+%zu dst+%zu alias %d: element %zu is "
                  "0x%" PRIx64 ", reference 0x%" PRIx64,
                  cfx_reduce_isa_name(isa), t->name, op_name, count, lay.a_off, lay.b_off,
                  lay.d_off, (int)lay.alias, i, got, want[i]);
    }
    for (size_t k = 0; k < buf_bytes; k++) {
        const unsigned char *p = d_base + k;
        if (p >= d && p < d + bytes)
            continue;
        cr_assert(*p == CANARY, "%s %s %s, count %zu, alias %d: the byte at dst%+td was written",
                  cfx_reduce_isa_name(isa), t->name, op_name, count, (int)lay.alias, p - d);
    }
    free(want);
    free(d_buf);
    free(b_buf);
    free(a_buf);
}

/* check_reduce for every type and op. */
static void check_all(enum cfx_reduce_isa isa, size_t count, struct layout lay, int byte_offsets)
{
    for (size_t ti = 0; ti < cfxNumTypes; ti++) {
        const struct type_info *t = &types[ti];
        struct layout l = lay;
        if (byte_offsets && t->size == 1)
            continue; /* one byte is one element: covered by the element offsets */
        if (!byte_offsets) {
            l.a_off *= t->size;
            l.b_off *= t->size;
            l.d_off *= t->size;
        }
        for (size_t o = 0; o < N_OPS; o++)
            check_reduce(isa, t, all_ops[o], op_names[o], count, l);
    }
}

static const size_t odd_counts[] = {0, 1, 7, 8, 15, 33, 63, 64, 65, 127, 1023, 4099};
#define N_COUNTS (sizeof(odd_counts) / sizeof(odd_counts[0]))

/* One value case: for each element, a op b must give want (all as doubles,
 * encoded exactly into the type; NaN wants any NaN for float32/64 and the
 * canonical NaN for the narrow types). */
struct value_case {
    cfxDataType_t type;
    cfxRedOp_t op;
    double a, b, want;
};

#define CASE_COUNT 67 /* a 64-lane vector and a tail */

/* Exact encoding of @p v (which the type must represent) for operands. */
static uint64_t encode_exact(const struct type_info *t, double v)
{
    if (t->kind == K_E4M3 || t->kind == K_E5M2) {
        if (isnan(v))
            return 0x7f;
        for (unsigned c = 0; c < 256; c++) {
            double x = ref_fp8_decode((uint8_t)c, t->kind == K_E5M2);
            if (x == v && !signbit(x) == !signbit(v))
                return c;
        }
        cr_assert_fail("%g is not a %s value", v, t->name);
    }
    return ref_encode(t, v);
}

static void check_value_cases(enum cfx_reduce_isa isa, const struct value_case *cases, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        const struct type_info *t = type_info_of(cases[k].type);
        unsigned char a[CASE_COUNT * 8], b[CASE_COUNT * 8], d[CASE_COUNT * 8];
        uint64_t abits = encode_exact(t, cases[k].a), bbits = encode_exact(t, cases[k].b);
        uint64_t want = encode_exact(t, cases[k].want);

        for (size_t i = 0; i < CASE_COUNT; i++) {
            store_bits(a + i * t->size, abits, t->size);
            store_bits(b + i * t->size, bbits, t->size);
        }
        cfx_reduce_host_isa(isa, d, a, b, CASE_COUNT, t->type, cases[k].op);
        for (size_t i = 0; i < CASE_COUNT; i++) {
            uint64_t got = load_bits(d + i * t->size, t->size);
            cr_assert(same_result(t, got, want),
                      "%s %s %s(%g, %g): element %zu is 0x%" PRIx64 ", want 0x%" PRIx64 " (%g)",
                      cfx_reduce_isa_name(isa), t->name, op_names[cases[k].op], cases[k].a,
                      cases[k].b, i, got, want, cases[k].want);
        }
    }
}

/* ============================================= every path: random data */

TEST_EVERY_PATH(matches_reference_on_random_data_of_odd_lengths)
{
    for (size_t c = 0; c < N_COUNTS; c++)
        check_all(isa, odd_counts[c], (struct layout){0, 0, 0, ALIAS_NONE}, 0);
}

TEST_EVERY_PATH(matches_reference_with_pointers_off_by_one_element)
{
    check_all(isa, 1023, (struct layout){1, 0, 0, ALIAS_NONE}, 0);
    check_all(isa, 1023, (struct layout){0, 1, 0, ALIAS_NONE}, 0);
    check_all(isa, 1023, (struct layout){0, 0, 1, ALIAS_NONE}, 0);
    check_all(isa, 1023, (struct layout){1, 1, 1, ALIAS_NONE}, 0);
}

TEST_EVERY_PATH(matches_reference_with_pointers_off_by_one_byte)
{
    check_all(isa, 1023, (struct layout){1, 0, 0, ALIAS_NONE}, 1);
    check_all(isa, 1023, (struct layout){0, 3, 0, ALIAS_NONE}, 1);
    check_all(isa, 1023, (struct layout){0, 0, 5, ALIAS_NONE}, 1);
    check_all(isa, 1023, (struct layout){1, 1, 1, ALIAS_NONE}, 1);
}

TEST_EVERY_PATH(matches_reference_when_dst_is_src_a)
{
    check_all(isa, 1023, (struct layout){0, 0, 0, ALIAS_DST_A}, 0);
    check_all(isa, 1023, (struct layout){1, 0, 0, ALIAS_DST_A}, 0);
}

TEST_EVERY_PATH(matches_reference_when_dst_is_src_b)
{
    check_all(isa, 1023, (struct layout){0, 0, 0, ALIAS_DST_B}, 0);
}

TEST_EVERY_PATH(matches_reference_when_dst_and_both_sources_are_one_buffer)
{
    check_all(isa, 1023, (struct layout){0, 0, 0, ALIAS_ALL}, 0);
}

/* The vector paths compute exactly what the portable path computes. Only
 * float32/float64 NaN payloads may differ (hardware-chosen). */
TEST_VECTOR_PATHS(matches_portable_path_bit_for_bit)
{
    const size_t count = 4099;

    for (size_t ti = 0; ti < cfxNumTypes; ti++) {
        const struct type_info *t = &types[ti];
        unsigned char *a = malloc(count * t->size), *b = malloc(count * t->size);
        unsigned char *want = malloc(count * t->size), *got = malloc(count * t->size);

        cr_assert(a && b && want && got, "out of memory");
        fill_random(t, a, count);
        fill_random(t, b, count);
        for (size_t o = 0; o < N_OPS; o++) {
            cfx_reduce_host_isa(CFX_REDUCE_ISA_PORTABLE, want, a, b, count, t->type, all_ops[o]);
            cfx_reduce_host_isa(isa, got, a, b, count, t->type, all_ops[o]);
            for (size_t i = 0; i < count; i++) {
                uint64_t g = load_bits(got + i * t->size, t->size);
                uint64_t w = load_bits(want + i * t->size, t->size);
                cr_assert(same_result(t, g, w),
                          "%s %s %s: element %zu is 0x%" PRIx64 ", portable 0x%" PRIx64,
                          cfx_reduce_isa_name(isa), t->name, op_names[o], i, g, w);
            }
        }
        free(got);
        free(want);
        free(b);
        free(a);
    }
}

/* ================================= every path: exhaustive narrow floats */

TEST_EVERY_PATH(float8_all_256x256_pairs_match_reference)
{
    static uint8_t a[65536], b[65536], d[65536];
    static const cfxDataType_t fp8[] = {cfxFloat8e4m3, cfxFloat8e5m2};

    for (size_t i = 0; i < 65536; i++) {
        a[i] = (uint8_t)(i >> 8);
        b[i] = (uint8_t)i;
    }
    for (size_t f = 0; f < 2; f++) {
        const struct type_info *t = type_info_of(fp8[f]);
        for (size_t o = 0; o < N_OPS; o++) {
            cfx_reduce_host_isa(isa, d, a, b, 65536, t->type, all_ops[o]);
            for (size_t i = 0; i < 65536; i++) {
                uint64_t want = ref_reduce(t, all_ops[o], a[i], b[i]);
                cr_assert(d[i] == want, "%s %s %s(0x%02x, 0x%02x) is 0x%02x, reference 0x%02x",
                          cfx_reduce_isa_name(isa), t->name, op_names[o], a[i], b[i], d[i],
                          (unsigned)want);
            }
        }
    }
}

TEST_EVERY_PATH(float16_and_bfloat16_every_value_against_specials_match_reference)
{
    static uint16_t a[65536], b[65536], d[65536];
    static const cfxDataType_t half_types[] = {cfxFloat16, cfxBfloat16};

    for (size_t i = 0; i < 65536; i++)
        a[i] = (uint16_t)i;
    for (size_t h = 0; h < 2; h++) {
        const struct type_info *t = type_info_of(half_types[h]);
        for (size_t s = 0; s < t->n_specials; s++) {
            for (size_t i = 0; i < 65536; i++)
                b[i] = (uint16_t)t->specials[s];
            for (size_t o = 0; o < N_OPS; o++) {
                cfx_reduce_host_isa(isa, d, a, b, 65536, t->type, all_ops[o]);
                for (size_t i = 0; i < 65536; i++) {
                    uint64_t want = ref_reduce(t, all_ops[o], a[i], b[i]);
                    cr_assert(d[i] == want, "%s %s %s(0x%04x, 0x%04x) is 0x%04x, reference 0x%04x",
                              cfx_reduce_isa_name(isa), t->name, op_names[o], a[i], b[i], d[i],
                              (unsigned)want);
                }
            }
        }
    }
}

/* ================================== every path: the rules, value by value */

TEST_EVERY_PATH(nan_and_infinity_propagate_through_sum_and_prod)
{
    /* float8 e4m3 has no infinity and e5m2 saturates it (see the next test). */
    static const cfxDataType_t float_types[] = {cfxFloat16, cfxFloat32, cfxFloat64, cfxBfloat16};
    static const cfxDataType_t fp8_types[] = {cfxFloat8e4m3, cfxFloat8e5m2};

    for (size_t k = 0; k < 4; k++) {
        cfxDataType_t ty = float_types[k];
        const struct value_case cases[] = {
            {ty, cfxSum, NAN, 1, NAN},
            {ty, cfxSum, 1, NAN, NAN},
            {ty, cfxProd, NAN, 2, NAN},
            {ty, cfxAvg, -2, NAN, NAN},
            {ty, cfxSum, INFINITY, 1, INFINITY},
            {ty, cfxSum, -INFINITY, -1, -INFINITY},
            {ty, cfxProd, INFINITY, -2, -INFINITY},
            {ty, cfxSum, INFINITY, -INFINITY, NAN},
            {ty, cfxProd, INFINITY, 0, NAN},
            {ty, cfxMax, INFINITY, 1, INFINITY},
            {ty, cfxMin, -INFINITY, 1, -INFINITY},
        };
        check_value_cases(isa, cases, sizeof(cases) / sizeof(cases[0]));
    }
    for (size_t k = 0; k < 2; k++) {
        cfxDataType_t ty = fp8_types[k];
        const struct value_case cases[] = {
            {ty, cfxSum, NAN, 1, NAN},
            {ty, cfxSum, 1, NAN, NAN},
            {ty, cfxProd, NAN, 2, NAN},
            {ty, cfxSum, -0.0, -0.0, -0.0},
        };
        check_value_cases(isa, cases, sizeof(cases) / sizeof(cases[0]));
    }
}

TEST_EVERY_PATH(nan_results_of_narrow_floats_are_canonical)
{
    /* Negative, signalling and payload-carrying NaNs all come out as 0x7f..f. */
    static const struct {
        cfxDataType_t type;
        uint16_t nan_in, canonical;
    } cases[] = {
        {cfxFloat16, 0xfc01, 0x7fff},  {cfxFloat16, 0x7e00, 0x7fff}, {cfxBfloat16, 0xff81, 0x7fff},
        {cfxBfloat16, 0x7fc0, 0x7fff}, {cfxFloat8e4m3, 0xff, 0x7f},  {cfxFloat8e5m2, 0xfd, 0x7f},
        {cfxFloat8e5m2, 0x7e, 0x7f},
    };

    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        const struct type_info *t = type_info_of(cases[k].type);
        unsigned char a[CASE_COUNT * 2], b[CASE_COUNT * 2], d[CASE_COUNT * 2];
        uint64_t one = encode_exact(t, 1.0);

        for (size_t o = 0; o < N_OPS; o++) {
            for (size_t i = 0; i < CASE_COUNT; i++) {
                store_bits(a + i * t->size, cases[k].nan_in, t->size);
                /* max/min return the number for NaN vs number: use two NaNs there */
                store_bits(b + i * t->size,
                           all_ops[o] == cfxMax || all_ops[o] == cfxMin ? cases[k].nan_in : one,
                           t->size);
            }
            cfx_reduce_host_isa(isa, d, a, b, CASE_COUNT, t->type, all_ops[o]);
            for (size_t i = 0; i < CASE_COUNT; i++)
                cr_assert(load_bits(d + i * t->size, t->size) == cases[k].canonical,
                          "%s %s %s with NaN 0x%x: element %zu is 0x%" PRIx64 ", want 0x%x",
                          cfx_reduce_isa_name(isa), t->name, op_names[o], cases[k].nan_in, i,
                          load_bits(d + i * t->size, t->size), cases[k].canonical);
        }
    }
}

TEST_EVERY_PATH(float8_overflow_saturates_to_max_finite_like_nccl)
{
    const cfxDataType_t e4 = cfxFloat8e4m3, e5 = cfxFloat8e5m2;
    const struct value_case cases[] = {
        {e4, cfxSum, 448, 448, 448},       {e4, cfxSum, 448, 16, 448}, /* 464 is a tie: even 448 */
        {e4, cfxSum, 448, 32, 448}, /* 480 would be S.1111.111 = NaN */
        {e4, cfxProd, -448, 2, -448},      {e4, cfxSum, 240, 240, 448},
        {e5, cfxSum, 57344, 57344, 57344}, {e5, cfxProd, -57344, 4, -57344},
        {e5, cfxSum, INFINITY, 1, 57344}, /* __NV_SATFINITE saturates infinities too */
        {e5, cfxMax, INFINITY, 1, 57344},  {e5, cfxMin, -INFINITY, 1, -57344},
    };

    check_value_cases(isa, cases, sizeof(cases) / sizeof(cases[0]));
}

TEST_EVERY_PATH(max_min_of_nan_and_number_give_the_number)
{
    for (size_t ti = 0; ti < cfxNumTypes; ti++) {
        cfxDataType_t ty = types[ti].type;
        if (types[ti].kind == K_INT || types[ti].kind == K_UINT)
            continue;
        const struct value_case cases[] = {
            {ty, cfxMax, NAN, 1, 1}, {ty, cfxMax, -2, NAN, -2},   {ty, cfxMin, NAN, -2, -2},
            {ty, cfxMin, 1, NAN, 1}, {ty, cfxMax, NAN, NAN, NAN}, {ty, cfxMin, NAN, NAN, NAN},
            {ty, cfxMax, -1, 1, 1},  {ty, cfxMin, -1, 1, -1},
        };
        check_value_cases(isa, cases, sizeof(cases) / sizeof(cases[0]));
    }
}

TEST_EVERY_PATH(max_min_order_negative_zero_below_positive_zero)
{
    for (size_t ti = 0; ti < cfxNumTypes; ti++) {
        cfxDataType_t ty = types[ti].type;
        if (types[ti].kind == K_INT || types[ti].kind == K_UINT)
            continue;
        const struct value_case cases[] = {
            {ty, cfxMax, -0.0, 0.0, 0.0},   {ty, cfxMax, 0.0, -0.0, 0.0},
            {ty, cfxMin, -0.0, 0.0, -0.0},  {ty, cfxMin, 0.0, -0.0, -0.0},
            {ty, cfxMax, -0.0, -0.0, -0.0}, {ty, cfxMin, 0.0, 0.0, 0.0},
        };
        check_value_cases(isa, cases, sizeof(cases) / sizeof(cases[0]));
    }
}

TEST_EVERY_PATH(integer_sum_and_prod_wrap_around)
{
    static const struct {
        cfxDataType_t type;
        cfxRedOp_t op;
        uint64_t a, b, want; /* bit patterns */
    } cases[] = {
        {cfxInt8, cfxSum, 0x7f, 0x01, 0x80},  /* 127 + 1 = -128 */
        {cfxInt8, cfxProd, 0x10, 0x10, 0x00}, /* 16 * 16 = 0 */
        {cfxInt8, cfxProd, 0x80, 0xff, 0x80}, /* -128 * -1 = -128 */
        {cfxUint8, cfxSum, 0xff, 0x01, 0x00},
        {cfxUint8, cfxProd, 0xff, 0xff, 0x01},
        {cfxInt32, cfxSum, 0x7fffffff, 1, 0x80000000},
        {cfxInt32, cfxProd, 0x80000000, 0xffffffff, 0x80000000},
        {cfxUint32, cfxProd, 0x10000, 0x10000, 0},
        {cfxUint32, cfxSum, 0xffffffff, 2, 1},
        {cfxInt64, cfxSum, 0x7fffffffffffffff, 1, 0x8000000000000000},
        {cfxInt64, cfxProd, 0x8000000000000000, 0xffffffffffffffff, 0x8000000000000000},
        {cfxInt64, cfxProd, 0x100000001, 0x100000001, 0x200000001},
        {cfxUint64, cfxProd, 0xffffffffffffffff, 0xffffffffffffffff, 1},
        {cfxUint64, cfxSum, 0xffffffffffffffff, 0xffffffffffffffff, 0xfffffffffffffffe},
        {cfxInt64, cfxMax, 0x8000000000000000, 0x7fffffffffffffff, 0x7fffffffffffffff},
        {cfxUint64, cfxMax, 0x8000000000000000, 0x7fffffffffffffff, 0x8000000000000000},
        {cfxInt8, cfxMin, 0x80, 0x7f, 0x80},
        {cfxUint8, cfxMin, 0x80, 0x7f, 0x7f},
    };

    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        const struct type_info *t = type_info_of(cases[k].type);
        unsigned char a[CASE_COUNT * 8], b[CASE_COUNT * 8], d[CASE_COUNT * 8];

        for (size_t i = 0; i < CASE_COUNT; i++) {
            store_bits(a + i * t->size, cases[k].a, t->size);
            store_bits(b + i * t->size, cases[k].b, t->size);
        }
        cfx_reduce_host_isa(isa, d, a, b, CASE_COUNT, t->type, cases[k].op);
        for (size_t i = 0; i < CASE_COUNT; i++)
            cr_assert(load_bits(d + i * t->size, t->size) == cases[k].want,
                      "%s %s %s(0x%" PRIx64 ", 0x%" PRIx64 "): element %zu is 0x%" PRIx64
                      ", want 0x%" PRIx64,
                      cfx_reduce_isa_name(isa), t->name, op_names[cases[k].op], cases[k].a,
                      cases[k].b, i, load_bits(d + i * t->size, t->size), cases[k].want);
    }
}

/* ====================================================== the Avg finish */

Test(reduce, avg_finish_truncates_integers_toward_zero)
{
    static const struct {
        cfxDataType_t type;
        int64_t x;
        int nranks;
        int64_t want;
    } cases[] = {
        {cfxInt8, -7, 2, -3},
        {cfxInt8, 7, 2, 3},
        {cfxInt8, -1, 4, 0},
        {cfxInt8, -128, 3, -42},
        {cfxInt8, -128, 1000, 0},
        {cfxUint8, 255, 2, 127},
        {cfxInt32, -7, 2, -3},
        {cfxInt32, INT32_MIN, 2, INT32_MIN / 2},
        {cfxUint32, 7, 2, 3},
        {cfxInt64, -7, 2, -3},
        {cfxInt64, INT64_MIN, 3, INT64_MIN / 3},
        {cfxUint64, -1, 2, INT64_MAX}, /* 0xffff...ff / 2 */
    };

    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        const struct type_info *t = type_info_of(cases[k].type);
        unsigned char x[CASE_COUNT * 8], d[CASE_COUNT * 8];

        for (size_t i = 0; i < CASE_COUNT; i++)
            store_bits(x + i * t->size, (uint64_t)cases[k].x, t->size);
        cfx_reduce_avg_finish(d, x, CASE_COUNT, t->type, cases[k].nranks);
        cfx_reduce_avg_finish(x, x, CASE_COUNT, t->type, cases[k].nranks); /* in place */
        for (size_t i = 0; i < CASE_COUNT; i++) {
            int64_t got = t->kind == K_INT
                              ? sign_extend(load_bits(d + i * t->size, t->size), t->size)
                              : (int64_t)load_bits(d + i * t->size, t->size);
            cr_assert(got == cases[k].want, "%s %" PRId64 " / %d gave %" PRId64 ", want %" PRId64,
                      t->name, cases[k].x, cases[k].nranks, got, cases[k].want);
            cr_assert(memcmp(d + i * t->size, x + i * t->size, t->size) == 0,
                      "%s in-place finish differs", t->name);
        }
    }
}

Test(reduce, avg_finish_divides_floats_and_rounds_once)
{
    static const struct {
        cfxDataType_t type;
        double x;
        int nranks;
        double want;
    } cases[] = {
        {cfxFloat32, 1, 3, 1.0f / 3.0f},     {cfxFloat64, 1, 3, 1.0 / 3.0},
        {cfxFloat16, 1, 3, 0.333251953125}, /* 0x3555 */
        {cfxBfloat16, 1, 3, 0.333984375},   /* 0x3eab */
        {cfxFloat8e4m3, 1, 3, 0.34375},     /* 0x2b */
        {cfxFloat8e5m2, 1, 3, 0.3125},      /* 0x35 */
        {cfxFloat16, -6, 4, -1.5},           {cfxFloat8e4m3, 448, 2, 224},
        {cfxFloat16, INFINITY, 8, INFINITY}, {cfxBfloat16, -INFINITY, 8, -INFINITY},
        {cfxFloat16, NAN, 2, NAN},           {cfxFloat8e4m3, NAN, 2, NAN},
        {cfxFloat32, -0.0, 4, -0.0},
    };

    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        const struct type_info *t = type_info_of(cases[k].type);
        unsigned char x[CASE_COUNT * 8], d[CASE_COUNT * 8];
        uint64_t want = encode_exact(t, cases[k].want);

        for (size_t i = 0; i < CASE_COUNT; i++)
            store_bits(x + i * t->size, encode_exact(t, cases[k].x), t->size);
        cfx_reduce_avg_finish(d, x, CASE_COUNT, t->type, cases[k].nranks);
        for (size_t i = 0; i < CASE_COUNT; i++)
            cr_assert(same_result(t, load_bits(d + i * t->size, t->size), want),
                      "%s %g / %d gave 0x%" PRIx64 ", want 0x%" PRIx64 " (%g)", t->name, cases[k].x,
                      cases[k].nranks, load_bits(d + i * t->size, t->size), want, cases[k].want);
    }
}

Test(reduce, avg_finish_matches_reference_on_random_data)
{
    static const int nranks_list[] = {1, 2, 3, 7, 8, 1000};
    const size_t count = 1027;

    for (size_t ti = 0; ti < cfxNumTypes; ti++) {
        const struct type_info *t = &types[ti];
        unsigned char *x = malloc(count * t->size), *d = malloc(count * t->size);

        cr_assert(x && d, "out of memory");
        for (size_t r = 0; r < sizeof(nranks_list) / sizeof(nranks_list[0]); r++) {
            fill_random(t, x, count);
            cfx_reduce_avg_finish(d, x, count, t->type, nranks_list[r]);
            for (size_t i = 0; i < count; i++) {
                uint64_t want =
                    ref_avg_finish(t, load_bits(x + i * t->size, t->size), nranks_list[r]);
                uint64_t got = load_bits(d + i * t->size, t->size);
                cr_assert(same_result(t, got, want),
                          "%s 0x%" PRIx64 " / %d gave 0x%" PRIx64 ", reference 0x%" PRIx64, t->name,
                          load_bits(x + i * t->size, t->size), nranks_list[r], got, want);
            }
        }
        free(d);
        free(x);
    }
}

/* ============================================ conversions of reduce_ops.h */

Test(reduce_ops, float16_and_bfloat16_decode_every_value_exactly)
{
    for (uint32_t v = 0; v < 65536; v++) {
        double f16 = ref_f16_decode((uint16_t)v), bf16 = ref_bf16_decode((uint16_t)v);
        float got_f16 = cfx_f16_to_f32((uint16_t)v), got_bf16 = cfx_bf16_to_f32((uint16_t)v);

        cr_assert((isnan(f16) && isnan(got_f16)) ||
                      (got_f16 == f16 && !signbit(got_f16) == !signbit(f16)),
                  "float16 0x%04x decoded to %a, want %a", v, got_f16, f16);
        cr_assert((isnan(bf16) && isnan(got_bf16)) ||
                      (got_bf16 == bf16 && !signbit(got_bf16) == !signbit(bf16)),
                  "bfloat16 0x%04x decoded to %a, want %a", v, got_bf16, bf16);
    }
}

Test(reduce_ops, float8_decode_every_value_exactly)
{
    for (uint32_t v = 0; v < 256; v++) {
        double e4 = ref_fp8_decode_fields((uint8_t)v, 0), e5 = ref_fp8_decode_fields((uint8_t)v, 1);
        float got_e4 = cfx_e4m3_to_f32((uint8_t)v), got_e5 = cfx_e5m2_to_f32((uint8_t)v);

        cr_assert((isnan(e4) && isnan(got_e4)) ||
                      (got_e4 == e4 && !signbit(got_e4) == !signbit(e4)),
                  "e4m3 0x%02x decoded to %a, want %a", v, got_e4, e4);
        cr_assert((isnan(e5) && isnan(got_e5)) ||
                      (got_e5 == e5 && !signbit(got_e5) == !signbit(e5)),
                  "e5m2 0x%02x decoded to %a, want %a", v, got_e5, e5);
    }
}

Test(reduce_ops, float32_to_narrow_rounds_to_nearest_even)
{
    /* Random float32 bit patterns, biased toward each format's range, plus
     * every midpoint between neighbouring float8 values. */
    for (int n = 0; n < 400000; n++) {
        uint32_t bits = (uint32_t)rnd();
        float f;
        if (n & 1) /* exponent within 2^-30 .. 2^18 */
            bits = (bits & 0x807fffffu) | ((uint32_t)(97 + (rnd() % 48)) << 23);
        f = f32_of(bits);
        cr_assert(cfx_f32_to_f16(f) == ref_f16_encode(f), "float16 of %a: 0x%04x, want 0x%04x", f,
                  cfx_f32_to_f16(f), ref_f16_encode(f));
        cr_assert(cfx_f32_to_bf16(f) == ref_bf16_encode(f), "bfloat16 of %a: 0x%04x, want 0x%04x",
                  f, cfx_f32_to_bf16(f), ref_bf16_encode(f));
        cr_assert(cfx_f32_to_e4m3(f) == ref_fp8_encode(f, 0), "e4m3 of %a: 0x%02x, want 0x%02x", f,
                  cfx_f32_to_e4m3(f), ref_fp8_encode(f, 0));
        cr_assert(cfx_f32_to_e5m2(f) == ref_fp8_encode(f, 1), "e5m2 of %a: 0x%02x, want 0x%02x", f,
                  cfx_f32_to_e5m2(f), ref_fp8_encode(f, 1));
    }
    for (int e5m2 = 0; e5m2 < 2; e5m2++) {
        for (unsigned c = 0; c < (e5m2 ? 0x7bu : 0x7eu); c++) {
            double lo = ref_fp8_decode((uint8_t)c, e5m2),
                   hi = ref_fp8_decode((uint8_t)(c + 1), e5m2);
            float mid = (float)((lo + hi) / 2); /* exact in float32 */
            uint8_t got = e5m2 ? cfx_f32_to_e5m2(mid) : cfx_f32_to_e4m3(mid);
            cr_assert(got == ((c & 1) ? c + 1 : c), "%s midpoint %a rounded to 0x%02x",
                      e5m2 ? "e5m2" : "e4m3", mid, got);
            got = e5m2 ? cfx_f32_to_e5m2(-mid) : cfx_f32_to_e4m3(-mid);
            cr_assert(got == (0x80 | ((c & 1) ? c + 1 : c)), "%s midpoint %a rounded to 0x%02x",
                      e5m2 ? "e5m2" : "e4m3", -mid, got);
        }
    }
}

/* ================================================== sizes and paths */

Test(reduce, type_size_matches_each_conflux_type)
{
    for (size_t ti = 0; ti < cfxNumTypes; ti++)
        cr_assert(cfx_type_size(types[ti].type) == types[ti].size, "%s: %zu bytes, want %zu",
                  types[ti].name, cfx_type_size(types[ti].type), types[ti].size);
    cr_assert(cfx_type_size(cfxNumTypes) == 0, "a value outside cfxDataType_t has no size");
}

Test(reduce, selected_path_is_the_best_supported_one)
{
    enum cfx_reduce_isa sel = cfx_reduce_isa_selected();

    cr_assert(cfx_reduce_isa_supported(CFX_REDUCE_ISA_PORTABLE), "portable is always supported");
    cr_assert(cfx_reduce_isa_supported(sel), "selected path %s is not supported",
              cfx_reduce_isa_name(sel));
    for (int isa = sel + 1; isa < CFX_REDUCE_ISA_COUNT; isa++)
        cr_assert(!cfx_reduce_isa_supported(isa), "%s is supported but %s was selected",
                  cfx_reduce_isa_name(isa), cfx_reduce_isa_name(sel));
    cr_log_info("host reductions use the %s path", cfx_reduce_isa_name(sel));
}

Test(reduce, vector_paths_report_their_own_kernels)
{
    for (size_t ti = 0; ti < cfxNumTypes; ti++)
        for (size_t o = 0; o < N_OPS; o++)
            cr_assert(
                cfx_reduce_isa_has_kernel(CFX_REDUCE_ISA_PORTABLE, types[ti].type, all_ops[o]),
                "portable lacks %s %s", types[ti].name, op_names[o]);
#if defined(__x86_64__)
    cr_assert(cfx_reduce_isa_has_kernel(CFX_REDUCE_ISA_AVX2, cfxFloat32, cfxSum),
              "avx2 has float32 sum");
    cr_assert(cfx_reduce_isa_has_kernel(CFX_REDUCE_ISA_AVX512, cfxBfloat16, cfxAvg),
              "avx512 has bfloat16 avg (as sum)");
    cr_assert(cfx_reduce_isa_has_kernel(CFX_REDUCE_ISA_AVX2, cfxFloat8e4m3, cfxMin),
              "avx2 has float8 e4m3 min");
#endif
    cr_assert(!cfx_reduce_isa_has_kernel(CFX_REDUCE_ISA_PORTABLE, cfxNumTypes, cfxSum),
              "no kernel for a type outside cfxDataType_t");
}

/* ================================================================ CUDA */

#if CFX_HAVE_CUDA
/*
 * The test target has no CUDA include path, so the few runtime calls used
 * here are declared by hand (C ABI: cudaError_t and cudaMemcpyKind are ints).
 * They resolve against the cudart that libconflux links.
 */
int cudaMalloc(void **ptr, size_t size);
int cudaFree(void *ptr);
int cudaMemcpy(void *dst, const void *src, size_t count, int kind);
int cudaDeviceSynchronize(void);
#define CUDA_H2D 1
#define CUDA_D2H 2
#endif

Test(reduce_cuda, kernels_match_the_host_path_bit_for_bit)
{
#if !CFX_HAVE_CUDA
    cr_skip_test("built without CUDA (CFX_HAVE_CUDA is 0)");
#else
    const size_t count = 70001;

    if (!cfx_reduce_cuda_available())
        cr_skip_test("no usable CUDA device (cudaGetDeviceCount failed or found none)");
    for (size_t ti = 0; ti < cfxNumTypes; ti++) {
        const struct type_info *t = &types[ti];
        size_t bytes = (count + 1) * t->size;
        unsigned char *a = malloc(bytes), *b = malloc(bytes), *want = malloc(bytes);
        unsigned char *got = malloc(bytes);
        unsigned char *da = NULL, *db = NULL, *dd = NULL;

        cr_assert(a && b && want && got, "out of memory");
        cr_assert(cudaMalloc((void **)&da, bytes) == 0 && cudaMalloc((void **)&db, bytes) == 0 &&
                      cudaMalloc((void **)&dd, bytes) == 0,
                  "cudaMalloc failed");
        fill_random(t, a, count + 1);
        fill_random(t, b, count + 1);
        cr_assert(cudaMemcpy(da, a, bytes, CUDA_H2D) == 0 &&
                      cudaMemcpy(db, b, bytes, CUDA_H2D) == 0,
                  "cudaMemcpy to the device failed");
        for (size_t o = 0; o < N_OPS; o++) {
            /* offset 0: the 16-byte pack path; offset 1 element: element by element */
            for (size_t off = 0; off < 2; off++) {
                size_t skip = off * t->size;
                cr_assert(cfx_reduce_cuda(dd + skip, da + skip, db + skip, count, t->type,
                                          all_ops[o], NULL) == cfxSuccess,
                          "cfx_reduce_cuda failed");
                cr_assert(cudaDeviceSynchronize() == 0, "kernel failed");
                cr_assert(cudaMemcpy(got, dd + skip, count * t->size, CUDA_D2H) == 0,
                          "cudaMemcpy from the device failed");
                cfx_reduce_host_isa(CFX_REDUCE_ISA_PORTABLE, want, a + skip, b + skip, count,
                                    t->type, all_ops[o]);
                for (size_t i = 0; i < count; i++) {
                    uint64_t g = load_bits(got + i * t->size, t->size);
                    uint64_t w = load_bits(want + i * t->size, t->size);
                    cr_assert(same_result(t, g, w),
                              "cuda %s %s offset %zu: element %zu is 0x%" PRIx64
                              ", host 0x%" PRIx64,
                              t->name, op_names[o], off, i, g, w);
                }
            }
        }
        cr_assert(cfx_reduce_cuda_avg_finish(dd, da, count, t->type, 3, NULL) == cfxSuccess,
                  "cfx_reduce_cuda_avg_finish failed");
        cr_assert(cudaDeviceSynchronize() == 0, "avg finish kernel failed");
        cr_assert(cudaMemcpy(got, dd, count * t->size, CUDA_D2H) == 0,
                  "cudaMemcpy from the device failed");
        cfx_reduce_avg_finish(want, a, count, t->type, 3);
        cr_assert(memcmp(got, want, count * t->size) == 0 || t->kind == K_F32 || t->kind == K_F64,
                  "cuda %s avg finish differs from the host", t->name);
        cudaFree(dd);
        cudaFree(db);
        cudaFree(da);
        free(got);
        free(want);
        free(b);
        free(a);
    }
#endif
}
