/*
 * Test-side reference arithmetic for the collective conformance suite:
 * inputs chosen so that every reduction is exact in every type (small
 * integers; products of +-1 and 2), an independent encoder/decoder for each
 * type, and the expected result of each op. Nothing here uses the library's
 * own kernels.
 */
#ifndef CFX_TEST_COLL_CHECK_H
#define CFX_TEST_COLL_CHECK_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "conflux.h"

static inline size_t ref_size(cfxDataType_t t)
{
    static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return sizes[t];
}

static inline int ref_is_float(cfxDataType_t t)
{
    return t == cfxFloat16 || t == cfxFloat32 || t == cfxFloat64 || t == cfxBfloat16 ||
           t == cfxFloat8e4m3 || t == cfxFloat8e5m2;
}

static inline int ref_is_signed(cfxDataType_t t)
{
    return t == cfxInt8 || t == cfxInt32 || t == cfxInt64 || ref_is_float(t);
}

static inline int ref_is_small_float(cfxDataType_t t)
{
    return t == cfxFloat8e4m3 || t == cfxFloat8e5m2;
}

/* Encode an exactly representable value into a binary float format with
 * @p man mantissa bits and exponent bias @p bias (normal numbers and zero). */
static inline uint32_t ref_encode_minifloat(double v, int man, int bias)
{
    uint32_t sign = v < 0 ? 1u : 0u;
    double a = fabs(v);
    if (a == 0)
        return sign << (man + (man == 3 ? 4 : man == 2 ? 5 : man == 7 ? 8 : 5));
    int e;
    double m = frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    uint32_t exp_field = (uint32_t)(e - 1 + bias);
    uint32_t man_field = (uint32_t)((m * 2 - 1) * (double)(1u << man) + 0.5);
    int exp_bits = man == 3 ? 4 : man == 2 ? 5 : man == 7 ? 8 : 5;
    return (sign << (exp_bits + man)) | (exp_field << man) | man_field;
}

static inline double ref_decode_minifloat(uint32_t bits, int man, int exp_bits, int bias)
{
    uint32_t sign = (bits >> (exp_bits + man)) & 1u;
    uint32_t exp_field = (bits >> man) & ((1u << exp_bits) - 1);
    uint32_t man_field = bits & ((1u << man) - 1);
    double v;
    if (exp_field == 0)
        v = ldexp((double)man_field, 1 - bias - man);
    else
        v = ldexp(1.0 + (double)man_field / (double)(1u << man), (int)exp_field - bias);
    return sign ? -v : v;
}

/* Store @p v (exactly representable) as type @p t at @p p. Integers wrap. */
static inline void ref_store(cfxDataType_t t, void *p, double v, uint64_t int_bits)
{
    switch (t) {
    case cfxInt8:
    case cfxUint8: {
        uint8_t x = (uint8_t)int_bits;
        memcpy(p, &x, 1);
        break;
    }
    case cfxInt32:
    case cfxUint32: {
        uint32_t x = (uint32_t)int_bits;
        memcpy(p, &x, 4);
        break;
    }
    case cfxInt64:
    case cfxUint64: memcpy(p, &int_bits, 8); break;
    case cfxFloat32: {
        float x = (float)v;
        memcpy(p, &x, 4);
        break;
    }
    case cfxFloat64: memcpy(p, &v, 8); break;
    case cfxFloat16: {
        uint16_t x = (uint16_t)ref_encode_minifloat(v, 10, 15);
        memcpy(p, &x, 2);
        break;
    }
    case cfxBfloat16: {
        uint16_t x = (uint16_t)ref_encode_minifloat(v, 7, 127);
        memcpy(p, &x, 2);
        break;
    }
    case cfxFloat8e4m3: {
        uint8_t x = (uint8_t)ref_encode_minifloat(v, 3, 7);
        memcpy(p, &x, 1);
        break;
    }
    case cfxFloat8e5m2: {
        uint8_t x = (uint8_t)ref_encode_minifloat(v, 2, 15);
        memcpy(p, &x, 1);
        break;
    }
    default: break;
    }
}

/* Value of a float element as a double. */
static inline double ref_load_float(cfxDataType_t t, const void *p)
{
    switch (t) {
    case cfxFloat32: {
        float x;
        memcpy(&x, p, 4);
        return x;
    }
    case cfxFloat64: {
        double x;
        memcpy(&x, p, 8);
        return x;
    }
    case cfxFloat16: {
        uint16_t x;
        memcpy(&x, p, 2);
        return ref_decode_minifloat(x, 10, 5, 15);
    }
    case cfxBfloat16: {
        uint16_t x;
        memcpy(&x, p, 2);
        return ref_decode_minifloat(x, 7, 8, 127);
    }
    case cfxFloat8e4m3: {
        uint8_t x;
        memcpy(&x, p, 1);
        return ref_decode_minifloat(x, 3, 4, 7);
    }
    case cfxFloat8e5m2: {
        uint8_t x;
        memcpy(&x, p, 1);
        return ref_decode_minifloat(x, 2, 5, 15);
    }
    default: return NAN;
    }
}

/* Raw bits of an integer element, zero-extended. */
static inline uint64_t ref_load_bits(cfxDataType_t t, const void *p)
{
    uint64_t x = 0;
    memcpy(&x, p, ref_size(t));
    return x;
}

/* The input of @p rank at element @p i for op @p op: exact in every type. */
static inline int64_t ref_input(cfxDataType_t t, cfxRedOp_t op, int rank, size_t i, int seed)
{
    uint64_t h = (uint64_t)rank * 2654435761u + i * 40503u + (uint64_t)seed * 97u;
    h ^= h >> 13;
    if (op == cfxProd) {
        static const int64_t signed_set[] = {1, 2, -1, 1};
        static const int64_t unsigned_set[] = {1, 2, 1, 1};
        return ref_is_signed(t) ? signed_set[h % 4] : unsigned_set[h % 4];
    }
    if (op == cfxMax || op == cfxMin) {
        if (ref_is_small_float(t))
            return (int64_t)(h % 17) - 8;
        return ref_is_signed(t) ? (int64_t)(h % 201) - 100 : (int64_t)(h % 201);
    }
    /* Sum and average: partial sums stay exact even in fp8 (|sum| <= nranks). */
    if (ref_is_small_float(t))
        return (int64_t)(h % 3) - 1;
    return ref_is_signed(t) ? (int64_t)(h % 5) - 2 : (int64_t)(h % 5);
}

/* Store the input value of (rank, i). */
static inline void ref_fill(cfxDataType_t t, cfxRedOp_t op, int rank, int seed, void *buf,
                            size_t count)
{
    for (size_t i = 0; i < count; i++) {
        int64_t v = ref_input(t, op, rank, i, seed);
        ref_store(t, (char *)buf + i * ref_size(t), (double)v, (uint64_t)v);
    }
}

/* Expected reduction of element i over nranks ranks: exact value as a double
 * (floats) and wrapped bits (integers). */
static inline void ref_reduce(cfxDataType_t t, cfxRedOp_t op, int nranks, size_t i, int seed,
                              double *value_p, uint64_t *bits_p)
{
    int64_t acc = ref_input(t, op, 0, i, seed);
    uint64_t wrap = (uint64_t)acc;
    for (int r = 1; r < nranks; r++) {
        int64_t v = ref_input(t, op, r, i, seed);
        switch (op) {
        case cfxSum:
        case cfxAvg:
            acc += v;
            wrap += (uint64_t)v;
            break;
        case cfxProd:
            acc *= v;
            wrap *= (uint64_t)v;
            break;
        case cfxMax:
            acc = v > acc ? v : acc;
            wrap = (uint64_t)acc;
            break;
        case cfxMin:
            acc = v < acc ? v : acc;
            wrap = (uint64_t)acc;
            break;
        default: break;
        }
    }
    double value = (double)acc;
    if (op == cfxAvg) {
        value = (double)acc / nranks;
        if (!ref_is_float(t)) {
            /* Integer average: wrapped sum, then divide, truncating toward zero. */
            size_t bits = ref_size(t) * 8;
            uint64_t mask = bits == 64 ? ~0ull : ((1ull << bits) - 1);
            uint64_t sum = wrap & mask;
            if (ref_is_signed(t)) {
                int64_t s = bits == 64 ? (int64_t)sum
                                       : (int64_t)(sum ^ (1ull << (bits - 1))) -
                                             (int64_t)(1ull << (bits - 1));
                wrap = (uint64_t)(s / nranks);
            } else {
                wrap = sum / (uint64_t)nranks;
            }
        }
    }
    *value_p = value;
    *bits_p = wrap;
}

/* Whether element @p got matches the expectation (floats: exact, or within a
 * rounding step of the type for the average, which divides). */
static inline int ref_matches(cfxDataType_t t, cfxRedOp_t op, const void *got, double value,
                              uint64_t bits)
{
    if (!ref_is_float(t)) {
        size_t n = ref_size(t) * 8;
        uint64_t mask = n == 64 ? ~0ull : ((1ull << n) - 1);
        return (ref_load_bits(t, got) & mask) == (bits & mask);
    }
    double g = ref_load_float(t, got);
    if (op != cfxAvg)
        return g == value;
    static const double rel[] = {0, 0, 0, 0, 0, 0, 1e-3, 1e-7, 1e-15, 8e-3, 0.07, 0.13};
    return fabs(g - value) <= rel[t] * fabs(value) + 1e-12;
}

/* ---- tagged float32 values: where a byte came from, for tests of data
 * that transports may move in place (zero copy) ---- */

/* Element @p i that rank @p from sends rank @p to in round @p round; every
 * value exact in float32 and none negative (tests mark stale data with
 * negative ones). */
static inline float ref_tagged(int from, int to, size_t i, int round)
{
    return (float)(from * 1000003 + to * 10007 + (int)(i % 100003) + round * 7);
}

/* A message of @p count elements from rank @p from to rank @p to in round
 * @p round, into @p buf. */
static inline void ref_tagged_msg_fill(float *buf, int from, int to, size_t count, int round)
{
    for (size_t i = 0; i < count; i++)
        buf[i] = ref_tagged(from, to, i, round);
}

/* The first wrong element of such a message in @p buf, or -1. */
static inline long ref_tagged_msg_check(const float *buf, int from, int to, size_t count, int round)
{
    for (size_t i = 0; i < count; i++)
        if (buf[i] != ref_tagged(from, to, i, round))
            return (long)i;
    return -1;
}

/* @p count copies of @p value into @p buf (stale-data marks). */
static inline void ref_fill_value(float *buf, size_t count, float value)
{
    for (size_t i = 0; i < count; i++)
        buf[i] = value;
}

/* An alltoall's send buffer, @p count per peer of @p n, from rank @p r. */
static inline void ref_tagged_fill(float *send, int n, int r, size_t count, int round)
{
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < count; i++)
            send[(size_t)q * count + i] = ref_tagged(r, q, i, round);
}

/* The first wrong element of rank @p r's alltoall receive buffer (its
 * index, the sender in *from_p), or -1 when all are right. */
static inline long ref_tagged_check(const float *recv, int n, int r, size_t count, int round,
                                    int *from_p)
{
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < count; i++)
            if (recv[(size_t)q * count + i] != ref_tagged(q, r, i, round)) {
                *from_p = q;
                return (long)((size_t)q * count + i);
            }
    return -1;
}

#endif /* CFX_TEST_COLL_CHECK_H */
