/*
 * Per-element reduction ops: the one definition of what Sum, Prod, Max, Min
 * and the Avg finish compute for each data type of conflux.h. Included by the
 * host kernels (C) and by the CUDA kernels (host and device), so the CPU and
 * the GPU produce the same bits.
 *
 * Rules (docs/kernels.md says the same):
 * - Integers: Sum and Prod wrap modulo 2^bits (done in unsigned arithmetic, so
 *   signed overflow is never undefined). The Avg finish truncates toward zero.
 * - float16, bfloat16, float8 e4m3 and e5m2 are widened to float32, reduced in
 *   float32, and rounded to nearest-even when stored. Every NaN result is
 *   stored as the format's canonical NaN, the positive all-ones pattern
 *   (0x7fff, 0x7fff, 0x7f, 0x7f), which is NVIDIA's canonical NaN.
 * - float16 and bfloat16 follow IEEE 754: overflow gives infinity, infinities
 *   are kept.
 * - float8 follows NCCL, which converts with CUDA's __NV_SATFINITE: a result
 *   beyond the largest finite value, infinity included, is stored as
 *   +-max finite (e4m3 448, e5m2 57344). NaN stays NaN.
 * - Max and Min are IEEE 754-2019 maximumNumber/minimumNumber, the C fmax and
 *   fmin rule made exact: a NaN and a number give the number, two NaNs give a
 *   NaN (the first operand's, for float32/float64), and -0 < +0.
 * - float32/float64 NaN payloads out of Sum/Prod are whatever the hardware
 *   makes (x86 keeps an operand's payload, GPUs return a canonical NaN).
 *
 * Names: cfx_<op>_<type>(a, b) with op in sum, prod, max, min and type in
 * i8 u8 i32 u32 i64 u64 f16 f32 f64 bf16 e4m3 e5m2; cfx_avg_finish_<type>(x,
 * nranks). The 16- and 8-bit floats travel as their bit patterns (uint16_t,
 * uint8_t). CFX_REDUCE_FOR_EACH_TYPE lists the types for code that dispatches.
 */
#ifndef CFX_KERNELS_REDUCE_OPS_H
#define CFX_KERNELS_REDUCE_OPS_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define CFX_HD __host__ __device__ inline
#else
#define CFX_HD static inline
#endif

/*
 * X(type enum, short name, storage type) for the 12 types, in enum order.
 * Keep in step with cfxDataType_t.
 */
#define CFX_REDUCE_FOR_EACH_TYPE(X)                                                                \
    X(cfxInt8, i8, int8_t)                                                                         \
    X(cfxUint8, u8, uint8_t)                                                                       \
    X(cfxInt32, i32, int32_t)                                                                      \
    X(cfxUint32, u32, uint32_t)                                                                    \
    X(cfxInt64, i64, int64_t)                                                                      \
    X(cfxUint64, u64, uint64_t)                                                                    \
    X(cfxFloat16, f16, uint16_t)                                                                   \
    X(cfxFloat32, f32, float)                                                                      \
    X(cfxFloat64, f64, double)                                                                     \
    X(cfxBfloat16, bf16, uint16_t)                                                                 \
    X(cfxFloat8e4m3, e4m3, uint8_t)                                                                \
    X(cfxFloat8e5m2, e5m2, uint8_t)

/* Canonical NaN bit patterns stored for NaN results of the narrow floats. */
#define CFX_F16_NAN  0x7fffu
#define CFX_BF16_NAN 0x7fffu
#define CFX_E4M3_NAN 0x7fu
#define CFX_E5M2_NAN 0x7fu

/* ------------------------------------------------------------ bit casts */

CFX_HD uint32_t cfx_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

CFX_HD float cfx_f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

CFX_HD uint64_t cfx_f64_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof(u));
    return u;
}

CFX_HD double cfx_f64_from_bits(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof(d));
    return d;
}

/* ------------------------------------------------- narrow float formats */

/*
 * Decode a narrow IEEE-style float (1 sign bit, exp_bits, man_bits, bias) to
 * float32, exactly. has_inf: the all-ones exponent is inf/NaN (f16, e5m2);
 * otherwise only the all-ones pattern is NaN (e4m3). Every value of these
 * formats, subnormals included, is a normal float32, so flush-to-zero modes
 * cannot change the result.
 */
CFX_HD float cfx_narrow_to_f32(uint32_t bits, unsigned exp_bits, unsigned man_bits, unsigned bias,
                               int has_inf)
{
    uint32_t width = 1u + exp_bits + man_bits;
    uint32_t sign = (bits >> (width - 1u)) & 1u;
    uint32_t exp = (bits >> man_bits) & ((1u << exp_bits) - 1u);
    uint32_t man = bits & ((1u << man_bits) - 1u);
    uint32_t exp_max = (1u << exp_bits) - 1u;
    float mag;

    if (exp == exp_max && (has_inf || man == (1u << man_bits) - 1u)) {
        mag = cfx_f32_from_bits(man == 0u && has_inf ? 0x7f800000u : 0x7fc00000u);
    } else if (exp == 0u) {
        /* man * 2^(1 - bias - man_bits); the power of two is a normal float32. */
        mag = (float)man * cfx_f32_from_bits((127u + 1u - bias - man_bits) << 23);
    } else {
        mag = cfx_f32_from_bits(((exp - bias + 127u) << 23) | (man << (23u - man_bits)));
    }
    return sign ? -mag : mag;
}

/*
 * Round a float32 to a narrow format, to nearest with ties to even.
 * max_finite is the largest finite magnitude code; a magnitude that rounds
 * beyond it is stored as overflow (infinity for IEEE formats, max_finite for
 * saturating ones). NaN becomes nan (the canonical NaN, sign clear).
 */
CFX_HD uint32_t cfx_f32_to_narrow(float f, unsigned exp_bits, unsigned man_bits, unsigned bias,
                                  uint32_t max_finite, uint32_t overflow, uint32_t nan)
{
    uint32_t x = cfx_f32_bits(f);
    uint32_t abs = x & 0x7fffffffu;
    uint32_t sign = (x >> 31) << (exp_bits + man_bits);
    uint32_t r;

    if (abs > 0x7f800000u)
        return nan;
    if (abs >= (127u + 1u - bias) << 23) {
        /* Normal in the target: drop 23 - man_bits bits, rounding the bits
         * as an integer (a carry into the exponent is the right answer). */
        unsigned shift = 23u - man_bits;
        r = (abs + ((1u << (shift - 1u)) - 1u) + ((abs >> shift) & 1u)) >> shift;
        r -= (127u - bias) << man_bits;
        if (r > max_finite)
            r = overflow;
    } else {
        /* Subnormal (or zero) in the target: value = man24 * 2^(e - 150),
         * target unit = 2^(1 - bias - man_bits). */
        uint32_t e = abs >> 23;
        uint32_t man24 = (abs & 0x7fffffu) | 0x800000u;
        uint32_t shift = 151u - bias - man_bits - e;
        uint32_t rem, half;

        if (shift >= 25u)
            return sign; /* below half the smallest subnormal: +-0 */
        r = man24 >> shift;
        rem = man24 & ((1u << shift) - 1u);
        half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u)))
            r++;
    }
    return sign | r;
}

CFX_HD float cfx_f16_to_f32(uint16_t h)
{
    return cfx_narrow_to_f32(h, 5, 10, 15, 1);
}

CFX_HD uint16_t cfx_f32_to_f16(float f)
{
    return (uint16_t)cfx_f32_to_narrow(f, 5, 10, 15, 0x7bffu, 0x7c00u, CFX_F16_NAN);
}

CFX_HD float cfx_bf16_to_f32(uint16_t h)
{
    return cfx_f32_from_bits((uint32_t)h << 16);
}

CFX_HD uint16_t cfx_f32_to_bf16(float f)
{
    uint32_t x = cfx_f32_bits(f);

    if ((x & 0x7fffffffu) > 0x7f800000u)
        return CFX_BF16_NAN;
    /* Same exponent range as float32: round the low 16 bits away. */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

CFX_HD float cfx_e4m3_to_f32(uint8_t b)
{
    return cfx_narrow_to_f32(b, 4, 3, 7, 0);
}

CFX_HD uint8_t cfx_f32_to_e4m3(float f)
{
    return (uint8_t)cfx_f32_to_narrow(f, 4, 3, 7, 0x7eu, 0x7eu, CFX_E4M3_NAN);
}

CFX_HD float cfx_e5m2_to_f32(uint8_t b)
{
    return cfx_narrow_to_f32(b, 5, 2, 15, 1);
}

CFX_HD uint8_t cfx_f32_to_e5m2(float f)
{
    /* Saturating like NCCL (__NV_SATFINITE); IEEE would be overflow 0x7c. */
    return (uint8_t)cfx_f32_to_narrow(f, 5, 2, 15, 0x7bu, 0x7bu, CFX_E5M2_NAN);
}

/* ------------------------------------------------------ float max / min */

/*
 * maximumNumber / minimumNumber. For equal operands the bitwise AND (max) or
 * OR (min) of the two picks +0 over -0 (resp. -0 over +0) and is the value
 * itself otherwise. The vector paths compute exactly this; keep them in step.
 */
CFX_HD float cfx_max_f32(float a, float b)
{
    /* Selects, not branches: the compiler can if-convert and vectorize them. */
    float r = a > b ? a : b;
    r = a == b ? cfx_f32_from_bits(cfx_f32_bits(a) & cfx_f32_bits(b)) : r;
    r = a != a ? b : r;
    return b != b ? a : r;
}

CFX_HD float cfx_min_f32(float a, float b)
{
    float r = a < b ? a : b;
    r = a == b ? cfx_f32_from_bits(cfx_f32_bits(a) | cfx_f32_bits(b)) : r;
    r = a != a ? b : r;
    return b != b ? a : r;
}

CFX_HD double cfx_max_f64(double a, double b)
{
    double r = a > b ? a : b;
    r = a == b ? cfx_f64_from_bits(cfx_f64_bits(a) & cfx_f64_bits(b)) : r;
    r = a != a ? b : r;
    return b != b ? a : r;
}

CFX_HD double cfx_min_f64(double a, double b)
{
    double r = a < b ? a : b;
    r = a == b ? cfx_f64_from_bits(cfx_f64_bits(a) | cfx_f64_bits(b)) : r;
    r = a != a ? b : r;
    return b != b ? a : r;
}

/* ----------------------------------------------------- integer elements */

/* Sum and Prod in the unsigned type of the same width: wraps, never UB. */
#define CFX_REDUCE_INT_OPS(name, ctype, utype, dtype)                                              \
    CFX_HD ctype cfx_sum_##name(ctype a, ctype b)                                                  \
    {                                                                                              \
        return (ctype)(utype)((utype)a + (utype)b);                                                \
    }                                                                                              \
    CFX_HD ctype cfx_prod_##name(ctype a, ctype b)                                                 \
    {                                                                                              \
        return (ctype)(utype)((utype)a * (utype)b);                                                \
    }                                                                                              \
    CFX_HD ctype cfx_max_##name(ctype a, ctype b)                                                  \
    {                                                                                              \
        return a > b ? a : b;                                                                      \
    }                                                                                              \
    CFX_HD ctype cfx_min_##name(ctype a, ctype b)                                                  \
    {                                                                                              \
        return a < b ? a : b;                                                                      \
    }                                                                                              \
    CFX_HD ctype cfx_avg_finish_##name(ctype x, int nranks)                                        \
    {                                                                                              \
        return (ctype)(x / (dtype)nranks); /* C division truncates toward zero */                  \
    }

/*
 * uint8_t products promote to int: 255 * 255 fits; uint32_t/uint64_t stay
 * unsigned. dtype divides for the Avg finish: wide enough for x and nranks
 * (nranks >= 1), signed exactly when the element type is.
 */
CFX_REDUCE_INT_OPS(i8, int8_t, uint8_t, int)
CFX_REDUCE_INT_OPS(u8, uint8_t, uint8_t, int)
CFX_REDUCE_INT_OPS(i32, int32_t, uint32_t, int32_t)
CFX_REDUCE_INT_OPS(u32, uint32_t, uint32_t, uint32_t)
CFX_REDUCE_INT_OPS(i64, int64_t, uint64_t, int64_t)
CFX_REDUCE_INT_OPS(u64, uint64_t, uint64_t, uint64_t)

#undef CFX_REDUCE_INT_OPS

/* ------------------------------------------------- float32 and float64 */

CFX_HD float cfx_sum_f32(float a, float b)
{
    return a + b;
}

CFX_HD float cfx_prod_f32(float a, float b)
{
    return a * b;
}

CFX_HD float cfx_avg_finish_f32(float x, int nranks)
{
    return x / (float)nranks;
}

CFX_HD double cfx_sum_f64(double a, double b)
{
    return a + b;
}

CFX_HD double cfx_prod_f64(double a, double b)
{
    return a * b;
}

CFX_HD double cfx_avg_finish_f64(double x, int nranks)
{
    return x / (double)nranks;
}

/* ------------------------------------- narrow floats, computed in float32 */

#define CFX_REDUCE_NARROW_OPS(name, ctype)                                                         \
    CFX_HD ctype cfx_sum_##name(ctype a, ctype b)                                                  \
    {                                                                                              \
        return cfx_f32_to_##name(cfx_##name##_to_f32(a) + cfx_##name##_to_f32(b));                 \
    }                                                                                              \
    CFX_HD ctype cfx_prod_##name(ctype a, ctype b)                                                 \
    {                                                                                              \
        return cfx_f32_to_##name(cfx_##name##_to_f32(a) * cfx_##name##_to_f32(b));                 \
    }                                                                                              \
    CFX_HD ctype cfx_max_##name(ctype a, ctype b)                                                  \
    {                                                                                              \
        return cfx_f32_to_##name(cfx_max_f32(cfx_##name##_to_f32(a), cfx_##name##_to_f32(b)));     \
    }                                                                                              \
    CFX_HD ctype cfx_min_##name(ctype a, ctype b)                                                  \
    {                                                                                              \
        return cfx_f32_to_##name(cfx_min_f32(cfx_##name##_to_f32(a), cfx_##name##_to_f32(b)));     \
    }                                                                                              \
    CFX_HD ctype cfx_avg_finish_##name(ctype x, int nranks)                                        \
    {                                                                                              \
        return cfx_f32_to_##name(cfx_##name##_to_f32(x) / (float)nranks);                          \
    }

CFX_REDUCE_NARROW_OPS(f16, uint16_t)
CFX_REDUCE_NARROW_OPS(bf16, uint16_t)
CFX_REDUCE_NARROW_OPS(e4m3, uint8_t)
CFX_REDUCE_NARROW_OPS(e5m2, uint8_t)

#undef CFX_REDUCE_NARROW_OPS

#endif /* CFX_KERNELS_REDUCE_OPS_H */
