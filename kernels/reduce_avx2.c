/*
 * AVX2 (+ F16C, FMA) host reduction kernels. This file alone is compiled with
 * -mavx2 -mfma -mf16c; reduce_host.c calls it only when the CPU has them.
 *
 * Each kernel runs whole 256-bit vectors with unaligned loads and stores (the
 * two sources are loaded before dst is stored, so exact aliasing is safe) and
 * finishes the last partial vector with the scalar ops of reduce_ops.h. The
 * results are bit-identical to the portable kernels: the vector ops below
 * compute the same function element by element (NaN rules included; see
 * reduce_ops.h).
 *
 * float8 goes through float16 with F16C: widening is exact, and narrowing
 * rounds twice (float32 -> float16 by F16C, then float16 -> float8 in integer
 * arithmetic), which equals one rounding because the float32 value is the
 * exact sum/product/max/min of two float8 values and float16 keeps at least
 * 2p + 2 bits for float8's p <= 4 (and e4m3's subnormals are float16 normals
 * after the 2^-8 scaling below). The tests check all 256 x 256 pairs.
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/reduce_isa.h"
#include "kernels/reduce_ops.h"

/* -------------------------------------------------------- vector ops */

static inline __m256i mul_epi8(__m256i a, __m256i b)
{
    /* Low byte of each 16-bit product is the 8-bit product modulo 256. */
    __m256i even = _mm256_mullo_epi16(a, b);
    __m256i odd = _mm256_mullo_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8));
    return _mm256_or_si256(_mm256_and_si256(even, _mm256_set1_epi16(0x00ff)),
                           _mm256_slli_epi16(odd, 8));
}

static inline __m256i mul_epi64(__m256i a, __m256i b)
{
    /* lo*lo + ((hi_a*lo_b + lo_a*hi_b) << 32), modulo 2^64. */
    __m256i lo = _mm256_mul_epu32(a, b);
    __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b),
                                     _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32)));
    return _mm256_add_epi64(lo, _mm256_slli_epi64(cross, 32));
}

static inline __m256i max_epi64(__m256i a, __m256i b)
{
    return _mm256_blendv_epi8(b, a, _mm256_cmpgt_epi64(a, b));
}

static inline __m256i min_epi64(__m256i a, __m256i b)
{
    return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b));
}

static inline __m256i max_epu64(__m256i a, __m256i b)
{
    __m256i bias = _mm256_set1_epi64x(INT64_MIN);
    __m256i gt = _mm256_cmpgt_epi64(_mm256_xor_si256(a, bias), _mm256_xor_si256(b, bias));
    return _mm256_blendv_epi8(b, a, gt);
}

static inline __m256i min_epu64(__m256i a, __m256i b)
{
    __m256i bias = _mm256_set1_epi64x(INT64_MIN);
    __m256i gt = _mm256_cmpgt_epi64(_mm256_xor_si256(a, bias), _mm256_xor_si256(b, bias));
    return _mm256_blendv_epi8(a, b, gt);
}

/*
 * maximumNumber/minimumNumber as cfx_max_f32/cfx_min_f32: maxps(a, b) gives b
 * unless a > b, so AND-ing maxps(a, b) with maxps(b, a) is the max with +0
 * over -0 (OR of the mins: -0 over +0); then a NaN operand yields the other
 * one, b's test last so two NaNs give a.
 */
static inline __m256 max_ps(__m256 a, __m256 b)
{
    __m256 r = _mm256_and_ps(_mm256_max_ps(a, b), _mm256_max_ps(b, a));
    r = _mm256_blendv_ps(r, b, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    return _mm256_blendv_ps(r, a, _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
}

static inline __m256 min_ps(__m256 a, __m256 b)
{
    __m256 r = _mm256_or_ps(_mm256_min_ps(a, b), _mm256_min_ps(b, a));
    r = _mm256_blendv_ps(r, b, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    return _mm256_blendv_ps(r, a, _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
}

static inline __m256d max_pd(__m256d a, __m256d b)
{
    __m256d r = _mm256_and_pd(_mm256_max_pd(a, b), _mm256_max_pd(b, a));
    r = _mm256_blendv_pd(r, b, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
    return _mm256_blendv_pd(r, a, _mm256_cmp_pd(b, b, _CMP_UNORD_Q));
}

static inline __m256d min_pd(__m256d a, __m256d b)
{
    __m256d r = _mm256_or_pd(_mm256_min_pd(a, b), _mm256_min_pd(b, a));
    r = _mm256_blendv_pd(r, b, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
    return _mm256_blendv_pd(r, a, _mm256_cmp_pd(b, b, _CMP_UNORD_Q));
}

/* 8 float16 <-> 8 float32. NaN lanes become 0x7fffffff, which F16C narrows
 * to the canonical 0x7fff (it keeps the sign and the top payload bits). */
static inline __m256 f16_load(const unsigned char *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline void f16_store(unsigned char *p, __m256 v)
{
    __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    v = _mm256_blendv_ps(v, nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    _mm_storeu_si128((__m128i *)p,
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* 8 bfloat16 <-> 8 float32; the narrowing rounds as cfx_f32_to_bf16. */
static inline __m256 bf16_load(const unsigned char *p)
{
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

static inline void bf16_store(unsigned char *p, __m256 v)
{
    __m256i x = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(CFX_BF16_NAN),
                           _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    /* Pack 32 -> 16 bits per 128-bit lane, then gather quads 0 and 2. */
    r = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(r));
}

/*
 * float16 bits (8 lanes of 16) -> float8 bits: drop the low `shift` mantissa
 * bits rounding to nearest even, saturate at max_code (NCCL's SATFINITE, for
 * infinities too), NaN -> nan_code (canonical). For e5m2 the float16 is the
 * value itself (e5m2 is float16's top byte, shift 8); for e4m3 it is the
 * value times 2^-8, which gives float16 the e4m3 exponent field (shift 7).
 */
static inline void fp8_store_from_f16(unsigned char *p, __m128i h, int shift, short max_code,
                                      short nan_code)
{
    __m128i abs = _mm_and_si128(h, _mm_set1_epi16(0x7fff));
    __m128i lsb = _mm_and_si128(_mm_srli_epi16(abs, shift), _mm_set1_epi16(1));
    __m128i bias = _mm_add_epi16(lsb, _mm_set1_epi16((short)((1 << (shift - 1)) - 1)));
    __m128i r = _mm_srli_epi16(_mm_add_epi16(abs, bias), shift);
    __m128i nan = _mm_cmpgt_epi16(abs, _mm_set1_epi16(0x7c00));
    __m128i sign = _mm_andnot_si128(nan, _mm_and_si128(_mm_srli_epi16(h, 8), _mm_set1_epi16(0x80)));

    r = _mm_min_epu16(r, _mm_set1_epi16(max_code));
    r = _mm_or_si128(_mm_blendv_epi8(r, _mm_set1_epi16(nan_code), nan), sign);
    _mm_storel_epi64((__m128i *)p, _mm_packus_epi16(r, r));
}

/* 8 float8 e5m2 <-> 8 float32. */
static inline __m256 e5m2_load(const unsigned char *p)
{
    __m128i x = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_cvtph_ps(_mm_slli_epi16(x, 8));
}

static inline void e5m2_store(unsigned char *p, __m256 v)
{
    fp8_store_from_f16(p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 8,
                       0x7b, CFX_E5M2_NAN);
}

/* 8 float8 e4m3 <-> 8 float32, through float16 scaled by 2^-8. */
static inline __m256 e4m3_load(const unsigned char *p)
{
    __m128i x = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    __m128i mag = _mm_and_si128(x, _mm_set1_epi16(0x7f));
    __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(x, _mm_set1_epi16(0x80)), 8),
                             _mm_slli_epi16(mag, 7));
    __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
    __m256i is_nan = _mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f)));
    return _mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)),
                            _mm256_castsi256_ps(is_nan));
}

static inline void e4m3_store(unsigned char *p, __m256 v)
{
    __m256 scaled = _mm256_mul_ps(v, _mm256_set1_ps(1.0f / 256.0f)); /* exact */
    fp8_store_from_f16(p, _mm256_cvtps_ph(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 7,
                       0x7e, CFX_E4M3_NAN);
}

/* ------------------------------------------------------------ kernels */

/*
 * name_op: whole vectors of LANES elements through VEXPR (over va, vb loaded
 * with LOADV, stored with STOREV), the rest through cfx_<op>_<name>.
 */
#define SIMD_KERNEL(name, T, op, LANES, VT, LOADV, STOREV, VEXPR)                                  \
    static void op##_##name(void *dst, const void *src_a, const void *src_b, size_t count)         \
    {                                                                                              \
        unsigned char *d = dst;                                                                    \
        const unsigned char *a = src_a, *b = src_b;                                                \
        size_t i = 0;                                                                              \
        for (; i + (LANES) <= count; i += (LANES)) {                                               \
            VT va = LOADV(a + i * sizeof(T));                                                      \
            VT vb = LOADV(b + i * sizeof(T));                                                      \
            STOREV(d + i * sizeof(T), VEXPR);                                                      \
        }                                                                                          \
        for (; i < count; i++) {                                                                   \
            T x, y, r;                                                                             \
            memcpy(&x, a + i * sizeof(T), sizeof(T));                                              \
            memcpy(&y, b + i * sizeof(T), sizeof(T));                                              \
            r = cfx_##op##_##name(x, y);                                                           \
            memcpy(d + i * sizeof(T), &r, sizeof(T));                                              \
        }                                                                                          \
    }

#define LOADI(p)      _mm256_loadu_si256((const __m256i *)(p))
#define STOREI(p, v)  _mm256_storeu_si256((__m256i *)(p), (v))
#define LOADPS(p)     _mm256_loadu_ps((const float *)(p))
#define STOREPS(p, v) _mm256_storeu_ps((float *)(p), (v))
#define LOADPD(p)     _mm256_loadu_pd((const double *)(p))
#define STOREPD(p, v) _mm256_storeu_pd((double *)(p), (v))

#define INT_KERNELS(name, T, LANES, ADD, MUL, MAX, MIN)                                            \
    SIMD_KERNEL(name, T, sum, LANES, __m256i, LOADI, STOREI, ADD(va, vb))                          \
    SIMD_KERNEL(name, T, prod, LANES, __m256i, LOADI, STOREI, MUL(va, vb))                         \
    SIMD_KERNEL(name, T, max, LANES, __m256i, LOADI, STOREI, MAX(va, vb))                          \
    SIMD_KERNEL(name, T, min, LANES, __m256i, LOADI, STOREI, MIN(va, vb))

INT_KERNELS(i8, int8_t, 32, _mm256_add_epi8, mul_epi8, _mm256_max_epi8, _mm256_min_epi8)
INT_KERNELS(u8, uint8_t, 32, _mm256_add_epi8, mul_epi8, _mm256_max_epu8, _mm256_min_epu8)
INT_KERNELS(i32, int32_t, 8, _mm256_add_epi32, _mm256_mullo_epi32, _mm256_max_epi32,
            _mm256_min_epi32)
INT_KERNELS(u32, uint32_t, 8, _mm256_add_epi32, _mm256_mullo_epi32, _mm256_max_epu32,
            _mm256_min_epu32)
INT_KERNELS(i64, int64_t, 4, _mm256_add_epi64, mul_epi64, max_epi64, min_epi64)
INT_KERNELS(u64, uint64_t, 4, _mm256_add_epi64, mul_epi64, max_epu64, min_epu64)

SIMD_KERNEL(f32, float, sum, 8, __m256, LOADPS, STOREPS, _mm256_add_ps(va, vb))
SIMD_KERNEL(f32, float, prod, 8, __m256, LOADPS, STOREPS, _mm256_mul_ps(va, vb))
SIMD_KERNEL(f32, float, max, 8, __m256, LOADPS, STOREPS, max_ps(va, vb))
SIMD_KERNEL(f32, float, min, 8, __m256, LOADPS, STOREPS, min_ps(va, vb))

SIMD_KERNEL(f64, double, sum, 4, __m256d, LOADPD, STOREPD, _mm256_add_pd(va, vb))
SIMD_KERNEL(f64, double, prod, 4, __m256d, LOADPD, STOREPD, _mm256_mul_pd(va, vb))
SIMD_KERNEL(f64, double, max, 4, __m256d, LOADPD, STOREPD, max_pd(va, vb))
SIMD_KERNEL(f64, double, min, 4, __m256d, LOADPD, STOREPD, min_pd(va, vb))

/* float16 and bfloat16: widen, reduce in float32, round back. */
#define NARROW_KERNELS(name, LOADV, STOREV)                                                        \
    SIMD_KERNEL(name, uint16_t, sum, 8, __m256, LOADV, STOREV, _mm256_add_ps(va, vb))              \
    SIMD_KERNEL(name, uint16_t, prod, 8, __m256, LOADV, STOREV, _mm256_mul_ps(va, vb))             \
    SIMD_KERNEL(name, uint16_t, max, 8, __m256, LOADV, STOREV, max_ps(va, vb))                     \
    SIMD_KERNEL(name, uint16_t, min, 8, __m256, LOADV, STOREV, min_ps(va, vb))

#define FP8_KERNELS(name, LOADV, STOREV)                                                           \
    SIMD_KERNEL(name, uint8_t, sum, 8, __m256, LOADV, STOREV, _mm256_add_ps(va, vb))               \
    SIMD_KERNEL(name, uint8_t, prod, 8, __m256, LOADV, STOREV, _mm256_mul_ps(va, vb))              \
    SIMD_KERNEL(name, uint8_t, max, 8, __m256, LOADV, STOREV, max_ps(va, vb))                      \
    SIMD_KERNEL(name, uint8_t, min, 8, __m256, LOADV, STOREV, min_ps(va, vb))

NARROW_KERNELS(f16, f16_load, f16_store)
NARROW_KERNELS(bf16, bf16_load, bf16_store)
FP8_KERNELS(e4m3, e4m3_load, e4m3_store)
FP8_KERNELS(e5m2, e5m2_load, e5m2_store)

#define ROW(e, name) [e] = {sum_##name, prod_##name, max_##name, min_##name}

const cfx_reduce_kernel_table cfx_reduce_avx2_kernels = {
    ROW(cfxInt8, i8),       ROW(cfxUint8, u8),        ROW(cfxInt32, i32),
    ROW(cfxUint32, u32),    ROW(cfxInt64, i64),       ROW(cfxUint64, u64),
    ROW(cfxFloat16, f16),   ROW(cfxFloat32, f32),     ROW(cfxFloat64, f64),
    ROW(cfxBfloat16, bf16), ROW(cfxFloat8e4m3, e4m3), ROW(cfxFloat8e5m2, e5m2),
};

#endif /* __x86_64__ */
