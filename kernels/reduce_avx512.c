/*
 * AVX-512 (F, BW, VL; with AVX2, F16C, FMA) host reduction kernels. This file
 * alone is compiled with those flags; reduce_host.c calls it only when the CPU
 * has them. It mirrors reduce_avx2.c op for op at twice the width, so the
 * tested AVX2 logic carries over; only the primitives differ (k-masks instead
 * of vector masks, native 64-bit max/min). No AVX512DQ: 64-bit products are
 * built from 32-bit ones, float AND/OR go through the integer domain.
 * float8 goes through float16 as in reduce_avx2.c (see there why that rounds
 * exactly once).
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/reduce_isa.h"
#include "kernels/reduce_ops.h"

/* -------------------------------------------------------- vector ops */

static inline __m512i mul_epi8(__m512i a, __m512i b)
{
    /* Low byte of each 16-bit product is the 8-bit product modulo 256. */
    __m512i even = _mm512_mullo_epi16(a, b);
    __m512i odd = _mm512_mullo_epi16(_mm512_srli_epi16(a, 8), _mm512_srli_epi16(b, 8));
    return _mm512_or_si512(_mm512_and_si512(even, _mm512_set1_epi16(0x00ff)),
                           _mm512_slli_epi16(odd, 8));
}

static inline __m512i mul_epi64(__m512i a, __m512i b)
{
    /* lo*lo + ((hi_a*lo_b + lo_a*hi_b) << 32), modulo 2^64. */
    __m512i lo = _mm512_mul_epu32(a, b);
    __m512i cross = _mm512_add_epi64(_mm512_mul_epu32(_mm512_srli_epi64(a, 32), b),
                                     _mm512_mul_epu32(a, _mm512_srli_epi64(b, 32)));
    return _mm512_add_epi64(lo, _mm512_slli_epi64(cross, 32));
}

/* maximumNumber/minimumNumber exactly as the AVX2 max_ps/min_ps. */
static inline __m512 max_ps(__m512 a, __m512 b)
{
    __m512i both = _mm512_and_si512(_mm512_castps_si512(_mm512_max_ps(a, b)),
                                    _mm512_castps_si512(_mm512_max_ps(b, a)));
    __m512 r = _mm512_castsi512_ps(both);
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), r, b);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q), r, a);
}

static inline __m512 min_ps(__m512 a, __m512 b)
{
    __m512i both = _mm512_or_si512(_mm512_castps_si512(_mm512_min_ps(a, b)),
                                   _mm512_castps_si512(_mm512_min_ps(b, a)));
    __m512 r = _mm512_castsi512_ps(both);
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), r, b);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q), r, a);
}

static inline __m512d max_pd(__m512d a, __m512d b)
{
    __m512i both = _mm512_and_si512(_mm512_castpd_si512(_mm512_max_pd(a, b)),
                                    _mm512_castpd_si512(_mm512_max_pd(b, a)));
    __m512d r = _mm512_castsi512_pd(both);
    r = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q), r, b);
    return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(b, b, _CMP_UNORD_Q), r, a);
}

static inline __m512d min_pd(__m512d a, __m512d b)
{
    __m512i both = _mm512_or_si512(_mm512_castpd_si512(_mm512_min_pd(a, b)),
                                   _mm512_castpd_si512(_mm512_min_pd(b, a)));
    __m512d r = _mm512_castsi512_pd(both);
    r = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q), r, b);
    return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(b, b, _CMP_UNORD_Q), r, a);
}

/* 16 float16 <-> 16 float32; NaN lanes narrow to the canonical 0x7fff. */
static inline __m512 f16_load(const unsigned char *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

static inline void f16_store(unsigned char *p, __m512 v)
{
    __m512 nan = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v, nan);
    _mm256_storeu_si256((__m256i *)p,
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* 16 bfloat16 <-> 16 float32; the narrowing rounds as cfx_f32_to_bf16. */
static inline __m512 bf16_load(const unsigned char *p)
{
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

static inline void bf16_store(unsigned char *p, __m512 v)
{
    __m512i x = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                              _mm512_set1_epi32(CFX_BF16_NAN));
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(r));
}

/* float16 bits (16 lanes) -> float8 bits, as fp8_store_from_f16 in reduce_avx2.c. */
static inline void fp8_store_from_f16(unsigned char *p, __m256i h, int shift, short max_code,
                                      short nan_code)
{
    __m256i abs = _mm256_and_si256(h, _mm256_set1_epi16(0x7fff));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi16(abs, shift), _mm256_set1_epi16(1));
    __m256i bias = _mm256_add_epi16(lsb, _mm256_set1_epi16((short)((1 << (shift - 1)) - 1)));
    __m256i r = _mm256_srli_epi16(_mm256_add_epi16(abs, bias), shift);
    __mmask16 nan = _mm256_cmpgt_epi16_mask(abs, _mm256_set1_epi16(0x7c00));
    __m256i sign = _mm256_and_si256(_mm256_srli_epi16(h, 8), _mm256_set1_epi16(0x80));

    r = _mm256_or_si256(_mm256_min_epu16(r, _mm256_set1_epi16(max_code)), sign);
    r = _mm256_mask_mov_epi16(r, nan, _mm256_set1_epi16(nan_code));
    _mm_storeu_si128((__m128i *)p, _mm256_cvtepi16_epi8(r));
}

/* 16 float8 e5m2 <-> 16 float32 (e5m2 is float16's top byte). */
static inline __m512 e5m2_load(const unsigned char *p)
{
    __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm512_cvtph_ps(_mm256_slli_epi16(x, 8));
}

static inline void e5m2_store(unsigned char *p, __m512 v)
{
    fp8_store_from_f16(p, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 8,
                       0x7b, CFX_E5M2_NAN);
}

/* 16 float8 e4m3 <-> 16 float32, through float16 scaled by 2^-8. */
static inline __m512 e4m3_load(const unsigned char *p)
{
    __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    __m256i mag = _mm256_and_si256(x, _mm256_set1_epi16(0x7f));
    __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x80)), 8),
                                _mm256_slli_epi16(mag, 7));
    __m512 v = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
    return _mm512_mask_blend_ps(_mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7f)), v,
                                _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
}

static inline void e4m3_store(unsigned char *p, __m512 v)
{
    __m512 scaled = _mm512_mul_ps(v, _mm512_set1_ps(1.0f / 256.0f)); /* exact */
    fp8_store_from_f16(p, _mm512_cvtps_ph(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 7,
                       0x7e, CFX_E4M3_NAN);
}

/* ------------------------------------------------------------ kernels */

/* As in reduce_avx2.c: whole vectors through VEXPR, the rest scalar. */
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

#define LOADI(p)      _mm512_loadu_si512((const void *)(p))
#define STOREI(p, v)  _mm512_storeu_si512((void *)(p), (v))
#define LOADPS(p)     _mm512_loadu_ps((const void *)(p))
#define STOREPS(p, v) _mm512_storeu_ps((void *)(p), (v))
#define LOADPD(p)     _mm512_loadu_pd((const void *)(p))
#define STOREPD(p, v) _mm512_storeu_pd((void *)(p), (v))

#define INT_KERNELS(name, T, LANES, ADD, MUL, MAX, MIN)                                            \
    SIMD_KERNEL(name, T, sum, LANES, __m512i, LOADI, STOREI, ADD(va, vb))                          \
    SIMD_KERNEL(name, T, prod, LANES, __m512i, LOADI, STOREI, MUL(va, vb))                         \
    SIMD_KERNEL(name, T, max, LANES, __m512i, LOADI, STOREI, MAX(va, vb))                          \
    SIMD_KERNEL(name, T, min, LANES, __m512i, LOADI, STOREI, MIN(va, vb))

INT_KERNELS(i8, int8_t, 64, _mm512_add_epi8, mul_epi8, _mm512_max_epi8, _mm512_min_epi8)
INT_KERNELS(u8, uint8_t, 64, _mm512_add_epi8, mul_epi8, _mm512_max_epu8, _mm512_min_epu8)
INT_KERNELS(i32, int32_t, 16, _mm512_add_epi32, _mm512_mullo_epi32, _mm512_max_epi32,
            _mm512_min_epi32)
INT_KERNELS(u32, uint32_t, 16, _mm512_add_epi32, _mm512_mullo_epi32, _mm512_max_epu32,
            _mm512_min_epu32)
INT_KERNELS(i64, int64_t, 8, _mm512_add_epi64, mul_epi64, _mm512_max_epi64, _mm512_min_epi64)
INT_KERNELS(u64, uint64_t, 8, _mm512_add_epi64, mul_epi64, _mm512_max_epu64, _mm512_min_epu64)

SIMD_KERNEL(f32, float, sum, 16, __m512, LOADPS, STOREPS, _mm512_add_ps(va, vb))
SIMD_KERNEL(f32, float, prod, 16, __m512, LOADPS, STOREPS, _mm512_mul_ps(va, vb))
SIMD_KERNEL(f32, float, max, 16, __m512, LOADPS, STOREPS, max_ps(va, vb))
SIMD_KERNEL(f32, float, min, 16, __m512, LOADPS, STOREPS, min_ps(va, vb))

SIMD_KERNEL(f64, double, sum, 8, __m512d, LOADPD, STOREPD, _mm512_add_pd(va, vb))
SIMD_KERNEL(f64, double, prod, 8, __m512d, LOADPD, STOREPD, _mm512_mul_pd(va, vb))
SIMD_KERNEL(f64, double, max, 8, __m512d, LOADPD, STOREPD, max_pd(va, vb))
SIMD_KERNEL(f64, double, min, 8, __m512d, LOADPD, STOREPD, min_pd(va, vb))

/* float16 and bfloat16: widen, reduce in float32, round back. */
#define NARROW_KERNELS(name, LOADV, STOREV)                                                        \
    SIMD_KERNEL(name, uint16_t, sum, 16, __m512, LOADV, STOREV, _mm512_add_ps(va, vb))             \
    SIMD_KERNEL(name, uint16_t, prod, 16, __m512, LOADV, STOREV, _mm512_mul_ps(va, vb))            \
    SIMD_KERNEL(name, uint16_t, max, 16, __m512, LOADV, STOREV, max_ps(va, vb))                    \
    SIMD_KERNEL(name, uint16_t, min, 16, __m512, LOADV, STOREV, min_ps(va, vb))

#define FP8_KERNELS(name, LOADV, STOREV)                                                           \
    SIMD_KERNEL(name, uint8_t, sum, 16, __m512, LOADV, STOREV, _mm512_add_ps(va, vb))              \
    SIMD_KERNEL(name, uint8_t, prod, 16, __m512, LOADV, STOREV, _mm512_mul_ps(va, vb))             \
    SIMD_KERNEL(name, uint8_t, max, 16, __m512, LOADV, STOREV, max_ps(va, vb))                     \
    SIMD_KERNEL(name, uint8_t, min, 16, __m512, LOADV, STOREV, min_ps(va, vb))

NARROW_KERNELS(f16, f16_load, f16_store)
NARROW_KERNELS(bf16, bf16_load, bf16_store)
FP8_KERNELS(e4m3, e4m3_load, e4m3_store)
FP8_KERNELS(e5m2, e5m2_load, e5m2_store)

#define ROW(e, name) [e] = {sum_##name, prod_##name, max_##name, min_##name}

const cfx_reduce_kernel_table cfx_reduce_avx512_kernels = {
    ROW(cfxInt8, i8),       ROW(cfxUint8, u8),        ROW(cfxInt32, i32),
    ROW(cfxUint32, u32),    ROW(cfxInt64, i64),       ROW(cfxUint64, u64),
    ROW(cfxFloat16, f16),   ROW(cfxFloat32, f32),     ROW(cfxFloat64, f64),
    ROW(cfxBfloat16, bf16), ROW(cfxFloat8e4m3, e4m3), ROW(cfxFloat8e5m2, e5m2),
};

#endif /* __x86_64__ */
