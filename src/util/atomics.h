/*
 * Atomics that compile as C11 for the host and as CUDA for a kernel, over
 * plain integer types (no _Atomic: the structs that hold them must compile
 * in both languages and keep one layout in memory both sides map).
 *
 * Host: GCC's __atomic builtins (what <stdatomic.h> compiles to).
 * Device: PTX ld.acquire / st.release / ld.relaxed / st.relaxed at system
 * scope (sm_70 and later), so a kernel and a CPU thread or a peer GPU that
 * share the memory (pinned host memory, peer-mapped device memory) see each
 * other's stores in order.
 *
 * Rules: a counter or flag read by another agent is only ever accessed
 * through these functions; a producer writes its data, then publishes with a
 * release store; a consumer polls with an acquire load, then reads the data.
 */
#ifndef CFX_UTIL_ATOMICS_H
#define CFX_UTIL_ATOMICS_H

#include <stdint.h>

#if defined(__CUDACC__)
#define CFX_HOST_DEVICE __host__ __device__
#else
#define CFX_HOST_DEVICE
#endif

/* Alignment and static assertions in both languages. */
#if defined(__cplusplus)
#define CFX_ALIGNAS(n)            alignas(n)
#define CFX_STATIC_ASSERT(e, msg) static_assert(e, msg)
#else
#define CFX_ALIGNAS(n)            _Alignas(n)
#define CFX_STATIC_ASSERT(e, msg) _Static_assert(e, msg)
#endif

#if defined(__CUDA_ARCH__)

/* ---- device: PTX memory-model instructions, system scope ---- */

static __device__ __forceinline__ uint64_t cfx_load_acquire_u64(const uint64_t *p)
{
    uint64_t v;
    asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ uint64_t cfx_load_relaxed_u64(const uint64_t *p)
{
    uint64_t v;
    asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ void cfx_store_release_u64(uint64_t *p, uint64_t v)
{
    asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
static __device__ __forceinline__ void cfx_store_relaxed_u64(uint64_t *p, uint64_t v)
{
    asm volatile("st.relaxed.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
static __device__ __forceinline__ uint32_t cfx_load_acquire_u32(const uint32_t *p)
{
    uint32_t v;
    asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ uint32_t cfx_load_relaxed_u32(const uint32_t *p)
{
    uint32_t v;
    asm volatile("ld.relaxed.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ void cfx_store_release_u32(uint32_t *p, uint32_t v)
{
    asm volatile("st.release.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
static __device__ __forceinline__ void cfx_store_relaxed_u32(uint32_t *p, uint32_t v)
{
    asm volatile("st.relaxed.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
static __device__ __forceinline__ int32_t cfx_load_acquire_i32(const int32_t *p)
{
    return (int32_t)cfx_load_acquire_u32((const uint32_t *)p);
}
/* Adds @p delta (relaxed, device scope: for words in the GPU's own memory
 * that only its blocks share; fence before it to publish data with it). */
static __device__ __forceinline__ uint32_t cfx_fetch_add_u32(uint32_t *p, uint32_t delta)
{
    return atomicAdd((unsigned int *)p, delta);
}

#else

/* ---- host: GCC atomic builtins ---- */

static inline uint64_t cfx_load_acquire_u64(const uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline uint64_t cfx_load_relaxed_u64(const uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}
static inline void cfx_store_release_u64(uint64_t *p, uint64_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline void cfx_store_relaxed_u64(uint64_t *p, uint64_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
}
static inline uint32_t cfx_load_acquire_u32(const uint32_t *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline uint32_t cfx_load_relaxed_u32(const uint32_t *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}
static inline void cfx_store_release_u32(uint32_t *p, uint32_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline void cfx_store_relaxed_u32(uint32_t *p, uint32_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
}
static inline int32_t cfx_load_acquire_i32(const int32_t *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

/* Host only: read-modify-write on words shared between processes. */
static inline void cfx_store_release_i32(int32_t *p, int32_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline void cfx_store_relaxed_i32(int32_t *p, int32_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
}
/* Stores @p desired when *p == *expected_p (returns 1); else loads *p into
 * *expected_p (returns 0). Acquire-release. */
static inline int cfx_cas_i32(int32_t *p, int32_t *expected_p, int32_t desired)
{
    return __atomic_compare_exchange_n(p, expected_p, desired, 0, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE);
}
/* Adds @p delta; returns the value before. Acquire-release. */
static inline int32_t cfx_fetch_add_i32(int32_t *p, int32_t delta)
{
    return __atomic_fetch_add(p, delta, __ATOMIC_ACQ_REL);
}
static inline uint32_t cfx_fetch_add_u32(uint32_t *p, uint32_t delta)
{
    return __atomic_fetch_add(p, delta, __ATOMIC_ACQ_REL);
}

#endif

#endif /* CFX_UTIL_ATOMICS_H */
