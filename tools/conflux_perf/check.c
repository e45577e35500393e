/*
 * Data check: inputs whose reduction is exact in every type, so a result is
 * right or wrong bit for bit, whatever order the library adds in.
 *
 * Every input is a small non-negative integer, and every partial result of
 * the reduction (any subset of the ranks) is an integer the type holds
 * exactly: at most `exact_max` below (2^precision for floats: 2048 for half,
 * 256 for bfloat16, 16 for e4m3, 8 for e5m2; the largest value for
 * integers, so no integer ever wraps). With n ranks:
 *   sum   each input in [0, span], span = min(64, exact_max / n); when that
 *         is 0 (n > exact_max) one rank per element gives 1, the rest 0.
 *   prod  element i is 2 on t_i of the ranks and 1 on the others, so the
 *         product is 2^t_i, t_i <= min(n, largest power of two the type holds).
 *   avg   rank r gives base_i + d_r with d_r = +1, -1, +1, -1, ... (0 for the
 *         last of an odd count), so the sum is n*base_i and the average base_i;
 *         when n is too large, one rank gives n and the rest 0 (average 1).
 *   max, min, and the copies (broadcast, allgather, sendrecv): any value in
 *         [0, min(64, exact_max)].
 * The expected result is computed here in double, where all of this is exact.
 * Output buffers are filled with 0xff bytes first (NaN, or -1, or a value far
 * above any input), so an element the call never wrote counts as wrong.
 */
#include <math.h>
#include <string.h>

#include "perf.h"

#define VALUE_CAP 64

/* Largest n such that every integer in [0, n] is exact, per cfxDataType_t. */
static const uint64_t exact_max[cfxNumTypes] = {
    127,         /* int8 */
    255,         /* uint8 */
    2147483647,  /* int32 */
    4294967295u, /* uint32 */
    1ull << 53,  /* int64: checked through double */
    1ull << 53,  /* uint64 */
    2048,        /* half */
    1ull << 24,  /* float */
    1ull << 53,  /* double */
    256,         /* bfloat16 */
    16,          /* f8e4m3 */
    8,           /* f8e5m2 */
};

/* Largest t such that 2^t is exact and finite, per cfxDataType_t. */
static const int pow2_max[cfxNumTypes] = {6, 7, 30, 31, 62, 63, 15, 127, 1023, 127, 8, 15};

/* ------------------------------------------------------------ narrow floats */

struct narrow_format {
    int mant_bits;
    int exp_bits;
    int bias;
    int has_inf; /* IEEE-like all-ones exponent; else (e4m3) only S.1111.111 is NaN */
};

static const struct narrow_format fmt_half = {10, 5, 15, 1};
static const struct narrow_format fmt_bf16 = {7, 8, 127, 1};
static const struct narrow_format fmt_e4m3 = {3, 4, 7, 0};
static const struct narrow_format fmt_e5m2 = {2, 5, 15, 1};

/* Bits of v, which the format must hold exactly (no rounding here). */
static uint32_t narrow_encode(const struct narrow_format *f, double v)
{
    uint32_t sign = 0;
    if (v < 0) {
        sign = 1u << (f->exp_bits + f->mant_bits);
        v = -v;
    }
    if (v == 0)
        return sign;
    int e2;
    double frac = frexp(v, &e2); /* v = frac * 2^e2, frac in [0.5, 1) */
    int biased = e2 - 1 + f->bias;
    uint32_t mant;
    if (biased <= 0) {
        mant = (uint32_t)ldexp(v, f->bias - 1 + f->mant_bits); /* subnormal */
        biased = 0;
    } else {
        mant = (uint32_t)ldexp(2.0 * frac - 1.0, f->mant_bits);
    }
    return sign | ((uint32_t)biased << f->mant_bits) | mant;
}

static double narrow_decode(const struct narrow_format *f, uint32_t bits)
{
    uint32_t mant_mask = (1u << f->mant_bits) - 1, exp_mask = (1u << f->exp_bits) - 1;
    uint32_t mant = bits & mant_mask, biased = (bits >> f->mant_bits) & exp_mask;
    int negative = (bits >> (f->mant_bits + f->exp_bits)) & 1;
    double v;
    if (biased == exp_mask && (f->has_inf || mant == mant_mask))
        v = (f->has_inf && mant == 0) ? INFINITY : NAN;
    else if (biased == 0)
        v = ldexp((double)mant, 1 - f->bias - f->mant_bits);
    else
        v = ldexp((double)(mant | (1u << f->mant_bits)), (int)biased - f->bias - f->mant_bits);
    return negative ? -v : v;
}

/* ------------------------------------------------------------ elements */

static void store(void *buf, size_t i, cfxDataType_t type, double v)
{
    switch (type) {
    case cfxInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case cfxUint8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case cfxInt32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case cfxUint32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case cfxInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case cfxUint64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case cfxFloat16: ((uint16_t *)buf)[i] = (uint16_t)narrow_encode(&fmt_half, v); break;
    case cfxFloat32: ((float *)buf)[i] = (float)v; break;
    case cfxFloat64: ((double *)buf)[i] = v; break;
    case cfxBfloat16: ((uint16_t *)buf)[i] = (uint16_t)narrow_encode(&fmt_bf16, v); break;
    case cfxFloat8e4m3: ((uint8_t *)buf)[i] = (uint8_t)narrow_encode(&fmt_e4m3, v); break;
    case cfxFloat8e5m2: ((uint8_t *)buf)[i] = (uint8_t)narrow_encode(&fmt_e5m2, v); break;
    default: break;
    }
}

static double load(const void *buf, size_t i, cfxDataType_t type)
{
    switch (type) {
    case cfxInt8: return ((const int8_t *)buf)[i];
    case cfxUint8: return ((const uint8_t *)buf)[i];
    case cfxInt32: return ((const int32_t *)buf)[i];
    case cfxUint32: return ((const uint32_t *)buf)[i];
    case cfxInt64: return (double)((const int64_t *)buf)[i];
    case cfxUint64: return (double)((const uint64_t *)buf)[i];
    case cfxFloat16: return narrow_decode(&fmt_half, ((const uint16_t *)buf)[i]);
    case cfxFloat32: return ((const float *)buf)[i];
    case cfxFloat64: return ((const double *)buf)[i];
    case cfxBfloat16: return narrow_decode(&fmt_bf16, ((const uint16_t *)buf)[i]);
    case cfxFloat8e4m3: return narrow_decode(&fmt_e4m3, ((const uint8_t *)buf)[i]);
    case cfxFloat8e5m2: return narrow_decode(&fmt_e5m2, ((const uint8_t *)buf)[i]);
    default: return NAN;
    }
}

/* ------------------------------------------------------------ values */

/* A well-mixed 64-bit number from (index, rank, seed). */
static uint64_t mix(uint64_t index, uint64_t rank, uint64_t seed)
{
    uint64_t x =
        index * 0x9e3779b97f4a7c15ull + rank * 0xc2b2ae3d27d4eb4full + seed * 0x165667b19e3779f9ull;
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 32;
    return x;
}

#define RANK_NONE 0xffffffffu /* mix() input for per-element, not per-rank, values */

static double input_value(const struct perf_values *v, int rank, size_t index)
{
    uint64_t n = (uint64_t)v->nranks;
    if (!v->reduces || v->op == cfxMax || v->op == cfxMin)
        return (double)(mix(index, (uint64_t)rank, v->seed) % (v->span + 1));
    switch (v->op) {
    case cfxSum:
        if (v->sparse)
            return index % n == (uint64_t)rank ? 1.0 : 0.0;
        return (double)(mix(index, (uint64_t)rank, v->seed) % (v->span + 1));
    case cfxProd: {
        uint64_t twos = mix(index, RANK_NONE, v->seed) % (uint64_t)(v->prod_max_exp + 1);
        return (index + (uint64_t)rank) % n < twos ? 2.0 : 1.0;
    }
    case cfxAvg: {
        if (v->sparse)
            return index % n == (uint64_t)rank ? (double)v->span : 0.0;
        double base = (double)(1 + mix(index, RANK_NONE, v->seed) % v->span);
        if (rank % 2 == 1)
            return base - 1.0;
        return (uint64_t)rank + 1 < n ? base + 1.0 : base;
    }
    default: return 0.0;
    }
}

/* The reduction of element `index` over all ranks, exactly. */
static double reduced_value(const struct perf_values *v, size_t index)
{
    double acc = input_value(v, 0, index);
    for (int r = 1; r < v->nranks; r++) {
        double x = input_value(v, r, index);
        switch (v->op) {
        case cfxSum:
        case cfxAvg: acc += x; break;
        case cfxProd: acc *= x; break;
        case cfxMax: acc = x > acc ? x : acc; break;
        case cfxMin: acc = x < acc ? x : acc; break;
        default: break;
        }
    }
    return v->op == cfxAvg ? acc / v->nranks : acc;
}

void perf_values_init(struct perf_values *values, const struct perf_coll *coll, cfxDataType_t type,
                      cfxRedOp_t op, int nranks, uint32_t seed)
{
    uint64_t exact = exact_max[type], n = (uint64_t)nranks;
    struct perf_values v = {
        .type = type,
        .op = op,
        .nranks = nranks,
        .seed = seed,
        .reduces = coll->kind == PERF_ALLREDUCE || coll->kind == PERF_REDUCE ||
                   coll->kind == PERF_REDUCESCATTER,
        .span = exact < VALUE_CAP ? exact : VALUE_CAP,
        .sparse = 0,
        .prod_max_exp = 0,
    };
    if (v.reduces && op == cfxSum) {
        uint64_t per_rank = exact / n;
        v.sparse = per_rank == 0;
        v.span = per_rank < VALUE_CAP ? per_rank : VALUE_CAP;
    } else if (v.reduces && op == cfxProd) {
        v.prod_max_exp = nranks < pow2_max[type] ? nranks : pow2_max[type];
    } else if (v.reduces && op == cfxAvg) {
        uint64_t per_rank = exact / n; /* inputs are at most span + 1 <= per_rank */
        v.sparse = per_rank < 2;
        if (v.sparse)
            v.span = n <= exact ? n : 0; /* the one contribution: average 1, or all 0 */
        else
            v.span = per_rank - 1 < VALUE_CAP ? per_rank - 1 : VALUE_CAP;
    }
    *values = v;
}

void perf_values_fill(const struct perf_values *values, void *buf, size_t count, int rank,
                      size_t first)
{
    for (size_t k = 0; k < count; k++)
        store(buf, k, values->type, input_value(values, rank, first + k));
}

size_t perf_values_verify(const struct perf_values *values, const void *buf, size_t count,
                          size_t first, int src_rank)
{
    size_t wrong = 0;
    for (size_t k = 0; k < count; k++) {
        double want = src_rank >= 0 ? input_value(values, src_rank, first + k)
                                    : reduced_value(values, first + k);
        double got = load(buf, k, values->type);
        wrong += !(got == want);
    }
    return wrong;
}
